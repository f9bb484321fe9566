"""What the online baselines share: a meter for time and energy between two points of a run, read
from the device's own clock and energy counter, and the result every online baseline returns."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emo.device import RunResult


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

    def __init__(self, device: Any, devices: Sequence[int]) -> None:
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
