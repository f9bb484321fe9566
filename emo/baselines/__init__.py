"""Online baselines: methods that tune a GPU while the workload runs, with no model of it.

    ONLINE                  names of the online methods (optimizer.name)
    run_online(ctx)         ctx: emo.methods.OnlineContext -> OnlineResult

- zeus: the `zeus` package's GlobalPowerLimitOptimizer, driving the device's power limit;
- geepafs: GEEPAFS's loop as its paper describes it (probe, two-segment fold line, f_bound / f_eff / f_cap, hold), driving locked clocks from NVML's sampled utilisation.
- perseus: Perseus as its code runs it (profile each pipeline instruction per clock, lowtime, one clock per instruction).
All run against any `emo.device.Device` (the virtual GPU or NVML), through the same protocol; each
module's `run_online(ctx)` is its method's `run` (emo.methods).
"""

from __future__ import annotations

from emo.baselines.online import OnlineResult
from emo.methods import ONLINE, OnlineContext, method

__all__ = ["ONLINE", "OnlineContext", "OnlineResult", "run_online"]


def run_online(ctx: OnlineContext) -> OnlineResult:
    """Run the online method ctx.optimizer.name (emo.methods' registry: built-in or a plugin)."""
    m = method(ctx.name)
    if not m.online or m.run is None:
        raise ValueError(
            f"optimizer.name: {ctx.name!r} is not an online baseline (expected one of {', '.join(ONLINE)})"
        )
    return m.run(ctx)
