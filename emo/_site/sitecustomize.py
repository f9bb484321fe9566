"""Imported at start-up by every Python process of a command EMO runs (emo.device.launcher puts this
folder, and nothing else, first on PYTHONPATH): arms emo.capture's hooks when an EMO_* variable asks
for them. Nothing happens here beyond that; torch is not imported (the hooks wait for the program to
import it), and a sitecustomize further down sys.path (the user's, the distribution's) still runs.

The job's own packages stay its own: EMO is made importable by a finder placed after every other
one that serves `emo` and `emo.*` alone (from the folder that holds this emo), so a job's module of
any name, even `emo`, wins. When the job's own `emo` shadows EMO's, the hooks stay off and say so.
"""

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))  # the folder that holds this emo package


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file shadows (never this file again,
    whatever link or spelling of this folder sys.path holds: that would recurse)."""
    import importlib.machinery
    import importlib.util

    rest = list(sys.path)
    while True:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or not spec.origin:
            return
        if os.path.dirname(os.path.realpath(spec.origin)) != _HERE:
            break
        folder = os.path.dirname(spec.origin)  # this file again, through another name: look past it
        rest = [p for p in rest if os.path.realpath(p or ".") != os.path.realpath(folder)]
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


class _EmoFinder:
    """Finds `emo` and its submodules in _ROOT, and nothing else."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "emo" and not name.startswith("emo."):
            return None
        import importlib.machinery

        return importlib.machinery.PathFinder.find_spec(name, [_ROOT] if path is None else path)


def _ours() -> bool:
    """Whether `import emo` in this process gives this EMO (not a job's own package named emo)."""
    import importlib.util

    spec = importlib.util.find_spec("emo")
    origin = spec.origin if spec is not None and spec.origin else ""
    if os.path.dirname(os.path.dirname(os.path.realpath(origin))) == _ROOT:
        return True
    print(
        f"emo: this job's own package `emo` ({origin or '?'}) shadows EMO's ({_ROOT}): "
        "EMO's hooks are off in this process (nothing traced or applied); rename the job's package",
        file=sys.stderr,
    )
    return False


def _arm() -> None:
    if any(k in os.environ for k in ("EMO_CAPTURE_DIR", "EMO_POLICY", "EMO_PROFILE_ITERATION", "EMO_SEGMENTS")):
        if not any(isinstance(f, _EmoFinder) for f in sys.meta_path):
            sys.meta_path.append(_EmoFinder())
        if _ours():
            from emo.capture import install_from_env

            install_from_env()


_chain()
_arm()
