"""The virtual GPU behind the vendor-neutral control interface (emo.device.control.GpuControl), so
that code written against GpuControl runs on it as it does on NVML."""

from __future__ import annotations

from typing import Any

from emo.device.control import GpuAccessError, GpuControl
from emo.policy import FrequencyPolicy, Step


class SimControl(GpuControl):
    """Locks, a power limit and the energy counters of a SimDevice's GPUs. A lock holds from the
    device's next run on (its policy: one step per locked GPU); the virtual GPU has one power cap for
    all its GPUs, so a limit set on one index applies to every index."""

    def __init__(self, device: Any, gpus: int):  # a SimDevice
        self.device = device
        self.gpus = gpus
        self.locked: dict[int, int] = {}

    def _check(self, index: int) -> None:
        if not 0 <= index < self.gpus:
            raise GpuAccessError(f"no GPU {index} (the virtual node has {self.gpus}: 0-{self.gpus - 1})")

    def count(self) -> int:
        return self.gpus

    def visible(self) -> list[int]:
        return list(range(self.gpus))

    def supported_clocks(self, index: int) -> list[int]:
        self._check(index)
        return self.device.supported_clocks()

    def lock_sm_clock(self, index: int, mhz: int) -> None:
        self._check(index)
        if int(mhz) not in self.device.supported_clocks():
            raise GpuAccessError(
                f"lock SM clock of GPU {index} at {mhz} MHz: not a supported clock of {self.device.name}"
            )
        self.locked[index] = int(mhz)
        self._apply()

    def reset_sm_clock(self, index: int) -> None:
        self._check(index)
        self.locked.pop(index, None)
        self._apply()

    def _apply(self) -> None:
        steps = {g: [Step(0.0, mhz)] for g, mhz in sorted(self.locked.items())}
        self.device.set_policy(FrequencyPolicy(gpu=self.device.name, steps=steps) if steps else None)

    def power_limit_range_w(self, index: int) -> tuple[float, float, float]:
        self._check(index)
        tdp = self.device.tdp_w
        return 0.0, 1.5 * tdp, tdp

    def set_power_limit(self, index: int, watts: float) -> None:
        self._check(index)
        self.device.set_power_limit(watts)

    def reset_power_limit(self, index: int) -> None:
        self._check(index)
        self.device.set_power_limit(None)

    def energy_j(self, index: int) -> float:
        self._check(index)
        return self.device.energy_j(index)

    def describe(self, index: int) -> dict:
        self._check(index)
        return dict(self.device.cfg)
