"""What the online baselines share: a meter for time and energy between two points of a run, read
from the device's own clock and energy counter, the result every online baseline returns, and the
re-warming of the die between a baseline's exploration and its steady state."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emo.device import Device, RunResult, settle_iterations


@dataclass
class PhaseTotals:
    time_s: float = 0.0
    energy_j: float = 0.0


@dataclass
class OnlineResult:
    """An online baseline's run: `steady` is what validate compares with the max-clock run (per
    iteration), `explore` the one-off cost of finding the setting (Zeus's JIT profiling)."""

    method: str
    steady: RunResult
    explore: PhaseTotals = field(default_factory=PhaseTotals)
    setting: dict = field(default_factory=dict)  # what it chose (limit, clocks) and how


class PhaseMeter:
    """Accumulates device time and energy (summed over `devices`) of named phases."""

    def __init__(self, device: Device, devices: Sequence[int]) -> None:
        self.device, self.devices = device, list(devices)
        self._totals: dict[str, PhaseTotals] = {}

    def _read(self) -> tuple[float, float]:
        return self.device.time_s(), sum(self.device.energy_j(d) for d in self.devices)

    @contextlib.contextmanager
    def phase(self, name: str):
        t0, e0 = self._read()
        try:
            yield
        finally:
            t1, e1 = self._read()
            tot = self._totals.setdefault(name, PhaseTotals())
            tot.time_s += t1 - t0
            tot.energy_j += e1 - e0

    def totals(self, name: str) -> PhaseTotals:
        return self._totals.get(name, PhaseTotals())


def rewarm(device: Device, workload: Any, settle_s: float) -> None:
    """Run the workload `settle_s` seconds at the max clock, unmeasured (gpu.settle_s; the caller
    lifts its own setting first). An exploration that ends at a baseline's lowest settings (Zeus's
    last power limits, Perseus's lowest clocks) leaves the die cooler than the max clock keeps it, and
    a cooler die leaks less: measured straight after, the steady state would be credited with that.
    Validate measures every method from a die warm at the max clock (emo.validate)."""
    if settle_s <= 0:
        return
    probe = device.run(workload, 1, warmup=0)
    n = settle_iterations(settle_s, probe.time_s) - 1
    if n > 0:
        device.run(workload, n, warmup=0)
