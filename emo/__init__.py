"""EMO: energy-minimising SM-clock schedules for GPU AI workloads."""
import os as _os
from pathlib import Path as _Path

__version__ = "0.1.0"


def _numba_cache_dir() -> str:
    """Numba's on-disk cache of compiled kernels goes under the user's cache folder (XDG), never into
    the package (which may be read-only, or shared by several checkouts)."""
    base = _os.environ.get("XDG_CACHE_HOME") or str(_Path.home() / ".cache")
    return str(_Path(base) / "emo" / "numba")


# before anything imports numba (it reads the variable once); a value the user set wins
_os.environ.setdefault("NUMBA_CACHE_DIR", _numba_cache_dir())
