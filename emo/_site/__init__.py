"""Not imported as a package: this folder itself goes first on a command's PYTHONPATH (emo.device.
launcher.inject_env) so that its sitecustomize runs in every Python process. A package only so that
an installed (non-editable) emo ships it."""
