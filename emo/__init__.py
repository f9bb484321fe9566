"""EMO: energy-minimising SM-clock schedules for GPU AI workloads."""

import os as _os
from pathlib import Path as _Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the annotations of apply and measure, without importing them
    import emo.loop
    import emo.policy

__version__ = "0.1.0"


def _numba_cache_dir() -> str:
    """Numba's on-disk cache of compiled kernels goes under the user's cache folder (XDG), never into
    the package (which may be read-only, or shared by several checkouts)."""
    base = _os.environ.get("XDG_CACHE_HOME") or str(_Path.home() / ".cache")
    return str(_Path(base) / "emo" / "numba")


# before anything imports numba (it reads the variable once); a value the user set wins
_os.environ.setdefault("NUMBA_CACHE_DIR", _numba_cache_dir())


# The training-loop API (emo.loop), imported on first use so that `import emo` stays light.
def apply(policy: "str | _os.PathLike | emo.policy.FrequencyPolicy", **options) -> "emo.loop.Clocks":
    """`with emo.apply("policy.json") as clocks: ... clocks.step()` once per iteration (emo.loop.apply)."""
    from emo.loop import apply as _apply

    return _apply(policy, **options)


def measure(gpus: "list[int] | None" = None, *, sync: bool = True) -> "emo.loop.EnergyWindow":
    """`with emo.measure() as w: ...` then `w.result.energy_j` (emo.loop.measure: NVML energy counter)."""
    from emo.loop import measure as _measure

    return _measure(gpus, sync=sync)


def step() -> None:
    """Mark an iteration for whatever EMO armed in this process (`emo trace`, `emo apply`)."""
    from emo.capture import step as _step

    _step()
