"""GPU control, vendor-neutral: clocks, power limit and the energy counter of GPUs by index.

This is the part of a device that changes or reads the GPU's state, kept apart from running
workloads and profiling them (emo.device.Device), as Zeus keeps `zeus.device.gpu.common.GPU`
apart from its measurement windows. A vendor implements GpuControl once (NVIDIA: NVML, directly
as root or relayed through zeusd: emo.device.nvml_control); everything above it (emo.apply, `emo
apply`, `emo reset-clocks`, `emo gpu-config`, the capture hooks) asks for `open_control()` and
never calls a vendor library itself. The virtual GPU implements it too (SimDevice.control).
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from emo.errors import ConfigError, DeviceError

VENDOR_ENV = "EMO_GPU_VENDOR"  # which control backend open_control() uses (default "nvml")

# Control backends by name, "module:factory", imported on demand; plugins add theirs with the
# entry-point group `emo.controls` or register_control().
CONTROLS: dict[str, str | Callable[..., GpuControl]] = {"nvml": "emo.device.nvml_control:NvmlControl"}


class GpuAccessError(DeviceError, ValueError):
    """The GPU cannot be read or controlled as asked: a DeviceError (exit 3); also a ValueError, as it
    was before the error tree, for callers that catch that.
    `cause`: one of emo.device.zeusd.CAUSES when known; `reason`: the message without what was asked."""

    def __init__(self, message: str, *, cause: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.cause, self.reason = cause, reason if reason is not None else message


class GpuControl(ABC):
    """Clocks, power limit and energy of the GPUs one machine has, by index (the vendor's own
    numbering, e.g. NVML's). Reads need no permission; changes may (the backend says how to get it)."""

    @abstractmethod
    def count(self) -> int:
        """How many GPUs the machine has."""

    @abstractmethod
    def visible(self) -> list[int]:
        """Indices of the GPUs this process may use, in the order CUDA numbers them."""

    @abstractmethod
    def supported_clocks(self, index: int) -> list[int]:
        """Supported SM clocks of one GPU in MHz, ascending."""

    @abstractmethod
    def lock_sm_clock(self, index: int, mhz: int) -> None:
        """Lock one GPU's SM clock at `mhz` (one of supported_clocks)."""

    @abstractmethod
    def reset_sm_clock(self, index: int) -> None:
        """Unlock one GPU's SM clock (the driver's default behaviour again)."""

    @abstractmethod
    def power_limit_range_w(self, index: int) -> tuple[float, float, float]:
        """(min, max, default) power limit of one GPU in watts."""

    @abstractmethod
    def set_power_limit(self, index: int, watts: float) -> None:
        """Cap one GPU's board power at `watts` (within power_limit_range_w)."""

    @abstractmethod
    def reset_power_limit(self, index: int) -> None:
        """Put one GPU's power limit back to its default."""

    @abstractmethod
    def energy_j(self, index: int) -> float:
        """Cumulative energy counter of one GPU, in joules."""

    def describe(self, index: int) -> dict:
        """The GPU config (conf/gpu/<model>.yaml's content) of one GPU, for `emo gpu-config`."""
        raise NotImplementedError(f"{type(self).__name__} cannot describe a GPU")

    def policy_applier(self, policy: Any, *, devices: dict[int, int] | None = None, **options: Any):
        """The runtime applier (emo.runtime.PolicyApplier) that follows `policy` on these GPUs from a
        training process, `devices` mapping the policy's device ids to indices."""
        raise NotImplementedError(f"{type(self).__name__} has no runtime applier")

    def close(self) -> None:  # noqa: B027 - optional: a backend with nothing to release keeps it
        """Release the library (what was changed stays changed: reset it first)."""


def register_control(name: str, factory: Callable[..., GpuControl]) -> None:
    """Make `name` a control backend (for open_control(name) and EMO_GPU_VENDOR=name)."""
    CONTROLS[name] = factory


def open_control(vendor: str | None = None, **options: Any) -> GpuControl:
    """The control backend `vendor` (default: $EMO_GPU_VENDOR, else "nvml"); raises GpuAccessError
    when it cannot reach a GPU (no driver, no library)."""
    name = vendor or os.environ.get(VENDOR_ENV) or "nvml"
    factory = CONTROLS.get(name)
    if factory is None:
        found = [e for e in entry_points(group="emo.controls") if e.name == name]
        if not found:
            known = sorted(set(CONTROLS) | {e.name for e in entry_points(group="emo.controls")})
            raise ConfigError(
                f"{VENDOR_ENV}: unknown GPU control backend {name!r} (expected one of {', '.join(known)})"
            )
        factory = found[0].load()
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(**options)


class RankEnergy:
    """The energy counter of this rank's GPU (`index`, the backend's numbering), or nothing on a machine
    without one: a capture on a CPU-only box still runs, with no energy to say."""

    def __init__(self, local_rank: int):
        self.index: int | None = None
        self._control: GpuControl | None = None
        try:
            control = open_control()
            index = control.visible()[local_rank]
            control.energy_j(index)
        except Exception:
            return
        self._control, self.index = control, index

    def read_j(self) -> float | None:
        if self._control is None or self.index is None:
            return None
        return self._control.energy_j(self.index)
