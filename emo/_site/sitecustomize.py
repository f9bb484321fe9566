"""Imported at start-up by every Python process of a command EMO runs (emo.device.launcher puts this
folder first on PYTHONPATH): arms emo.capture's hooks when an EMO_* variable asks for them. Nothing
happens here beyond that; torch is not imported (the hooks wait for the program to import it), and
a sitecustomize further down sys.path (the user's, the distribution's) still runs.
"""

import os
import sys


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file shadows."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _arm() -> None:
    if any(k in os.environ for k in ("EMO_CAPTURE_DIR", "EMO_POLICY", "EMO_PROFILE_ITERATION", "EMO_SEGMENTS")):
        from emo.capture import install_from_env

        install_from_env()


_chain()
_arm()
