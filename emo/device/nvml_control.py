"""GpuControl on NVIDIA GPUs: NVML (nvidia-ml-py) reads, and clock and power changes made directly
as root or relayed through zeusd (emo.device.nvml.ClockController); a training job's runtime
applier sets its clocks through the clock owner (emo.device.clock_owner), which resets them
however the trainer dies."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from emo.device import clock_owner, gpu_locks
from emo.device import nvml as nv
from emo.device.control import GpuAccessError, GpuControl
from emo.policy import FrequencyPolicy
from emo.runtime import PolicyApplier


class NvmlControl(GpuControl):
    """NVML, initialised once; clock and power changes through a ClockController made on first use
    (so that reading energy needs neither root nor zeusd). `nvml`: a pynvml stand-in (tests)."""

    def __init__(self, nvml: Any = None, *, controller: nv.ClockController | None = None):
        self.nvml = nvml or nv.import_pynvml()
        nv.nvml_init(self.nvml)
        self._controller = controller
        self._handles: dict[int, Any] = {}

    @property
    def controller(self) -> nv.ClockController:
        if self._controller is None:
            self._controller = nv.ClockController.auto(self.nvml)
        return self._controller

    def _read(self, what: str, fn):
        try:
            return fn()
        except self.nvml.NVMLError as e:
            raise nv.explain(self.nvml, e, what) from e

    def handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._read(f"GPU {index}", lambda: self.nvml.nvmlDeviceGetHandleByIndex(index))
        return self._handles[index]

    def count(self) -> int:
        return int(self._read("counting GPUs", self.nvml.nvmlDeviceGetCount))

    def visible(self) -> list[int]:
        return nv.visible_nvml_indices(self.nvml)

    def supported_clocks(self, index: int) -> list[int]:
        h = self.handle(index)

        def read():
            mem = max(int(m) for m in self.nvml.nvmlDeviceGetSupportedMemoryClocks(h))
            return sorted({int(c) for c in self.nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem)})

        return self._read(f"supported clocks of GPU {index}", read)

    def lock_sm_clock(self, index: int, mhz: int) -> None:
        self.controller.set_clock(index, mhz)

    def reset_sm_clock(self, index: int) -> None:
        self.controller.reset_clock(index)

    def power_limit_range_w(self, index: int) -> tuple[float, float, float]:
        h = self.handle(index)
        lo, hi = self._read(
            f"power limits of GPU {index}", lambda: self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        )
        default = self._read(
            f"power limits of GPU {index}", lambda: self.nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
        )
        return lo / 1000.0, hi / 1000.0, default / 1000.0

    def set_power_limit(self, index: int, watts: float) -> None:
        self.controller.set_power_limit(index, watts)

    def reset_power_limit(self, index: int) -> None:
        self.controller.reset_power_limit(index)

    def energy_j(self, index: int) -> float:
        h = self.handle(index)
        return self._read(
            f"energy counter of GPU {index}", lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
        )

    def describe(self, index: int) -> dict:
        return nv.discover_gpu_config(self.nvml, index)

    def policy_applier(
        self, policy: FrequencyPolicy, *, devices: dict[int, int] | None = None, **options: Any
    ) -> PolicyApplier:
        return nvml_applier(policy, devices=devices, **options)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def nvml_applier(
    policy: FrequencyPolicy,
    *,
    devices: dict[int, int] | None = None,
    lead_ms: float | None = None,
    strict: bool = False,
) -> PolicyApplier:
    """The runtime applier (emo.runtime.PolicyApplier) driving real GPUs through this process's clock
    owner (emo.device.clock_owner: NVML as root, else zeusd), which resets every GPU it locked however
    this process dies. `devices` maps policy device ids to NVML indices; by default rank r of a
    torchrun job drives its own GPU (LOCAL_RANK). A failed request prints one line at once; the
    summary (`.summary()`, `.landed`, `.failed`) is printed on close. strict=True: the owner must be
    able to control clocks now (else GpuAccessError here), and a failed request makes the next
    step() raise emo.runtime.ClockRequestFailed. Its threads are stopped before any restore on a
    signal or at exit, so a graceful end resets from here; a violent one, from the owner."""
    nvml = nv.import_pynvml()
    nv.nvml_init(nvml)
    if devices is None:
        visible = nv.visible_nvml_indices(nvml)
        if "LOCAL_RANK" in os.environ:
            rank, local = int(os.environ.get("RANK", 0)), int(os.environ["LOCAL_RANK"])
            devices = {rank: visible[local]}
        else:
            devices = {d: visible[d] for d in policy.steps if d < len(visible)}
    held = [r for r in gpu_locks.held_by_others(sorted(set(devices.values()))) if r.holder.trainer != os.getpid()]
    if held:  # one owner per GPU on the node: said before any request, not as a failure of each
        raise GpuAccessError(
            f"{gpu_locks.Held(held[0])}: wait for it to end, or give this job other GPUs (CUDA_VISIBLE_DEVICES)",
            cause=gpu_locks.HELD,
        )
    owner = clock_owner.owner()
    if strict and owner.error is not None:
        raise GpuAccessError(f"cannot control GPU clocks: {owner.error}", cause=owner.error.cause)
    nv._GUARD.arm()  # the clock threads are not the main thread: install the signal handlers here
    applier = PolicyApplier(policy, owner, devices=devices, lead_ms=lead_ms, strict=strict)
    nv._GUARD.track(applier)
    return applier
