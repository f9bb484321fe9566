"""Online baselines: methods that tune a GPU while the workload runs, with no model of it.

    ONLINE                                   names of the online methods (optimizer.name)
    run_online(name, device, workload, devices, budget, optimizer_cfg, gpu_cfg) -> OnlineResult

- zeus: the `zeus` package's GlobalPowerLimitOptimizer, driving the device's power limit;
- geepafs: GEEPAFS's loop as its paper describes it (probe, two-segment fold line, f_bound / f_eff / f_cap, hold), driving locked clocks from NVML's sampled utilisation.
- perseus: Perseus as its code runs it (profile each pipeline instruction per clock, lowtime, one clock per instruction).
All run against any `emo.device.Device` (the virtual GPU or NVML), through the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emo.baselines.online import OnlineResult
from emo.methods import ONLINE, method

__all__ = ["ONLINE", "OnlineResult", "run_online"]


def run_online(
    name: str,
    device: Any,
    workload: Any,
    devices: Sequence[int],
    budget: float,
    optimizer_cfg: dict,
    gpu_cfg: dict,
    *,
    iterations: int,
    warmup: int,
) -> OnlineResult:
    """Run the online method `name` (emo.methods' registry: built-in or a plugin)."""
    m = method(name)
    if not m.online or m.run is None:
        raise ValueError(f"optimizer.name: {name!r} is not an online baseline (expected one of {', '.join(ONLINE)})")
    return m.run(device, workload, devices, budget, optimizer_cfg, gpu_cfg, iterations=iterations, warmup=warmup)
