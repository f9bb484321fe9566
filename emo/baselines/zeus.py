"""Zeus baseline: the `zeus` package's own `GlobalPowerLimitOptimizer`, driving an EMO device.

Zeus profiles power limits just in time (warm-up and profiling steps per limit, highest first), then
keeps the limit its selector picks. We run its state machine unchanged and adapt it at its two
boundaries:
- GPU management: zeus asks `zeus.device.get_gpus()` for power-limit constraints and sets limits
  through it; `DeviceGPUs` answers from our `emo.device.Device` (`set_power_limit`), so on the
  virtual GPU the limit makes the simulated clock throttle exactly as NVML's limit does on hardware.
- measurement: zeus's `ZeusMonitor` reads wall time and NVML; `JobMonitor` adds up the time and the
  energy-counter readings of the iterations the device ran, so a virtual GPU's simulated seconds are
  what zeus sees.
One process drives every GPU of the job, so zeus's framework all-reduce is the identity here.

    run_zeus(device, workload, devices, budget, options, gpu_cfg, iterations=, warmup=) -> OnlineResult
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from emo.baselines.online import OnlineResult, PhaseMeter, rewarm
from emo.device import Device, ReportsPowerLimits
from emo.methods import OnlineContext

if TYPE_CHECKING:
    from emo.sections import GpuConfig, ZeusOptions

log = logging.getLogger("emo.baselines.zeus")

try:  # the optional extra `baselines`
    import zeus  # noqa: F401
    from zeus.device.gpu.common import GPU, GPUs, ZeusGPUNotSupportedError
    from zeus.monitor.energy import Measurement as ZeusMeasurement
    from zeus.optimizer import power_limit as zeus_pl

    ZEUS_VERSION: str | None = getattr(zeus, "__version__", "unknown")
except ImportError:  # pragma: no cover - exercised only where zeus is not installed
    ZEUS_VERSION = None
    GPU = GPUs = object


def _require_zeus() -> None:
    if ZEUS_VERSION is None:
        raise ValueError("optimizer=zeus needs the `zeus` package: pip install 'emo[baselines]'")


class DeviceGPU(GPU):
    """One GPU of an EMO device, as zeus's GPU-management layer sees it (units: mW, MHz)."""

    _disable_sys_admin_warning = True

    def __init__(self, owner: DeviceGPUs, index: int) -> None:
        super().__init__(index)
        self._owner = owner

    @property
    def supports_nonblocking_setters(self) -> bool:
        return False

    def get_name(self) -> str:
        return self._owner.device.name

    def get_power_management_limit_constraints(self) -> tuple[int, int]:
        lo, hi = self._owner.limits_w
        return int(lo * 1000), int(hi * 1000)

    def get_power_management_limit(self) -> int:
        return int(self._owner.limit_w * 1000)

    def set_power_management_limit(self, power_limit_mw: int, block: bool = True) -> None:
        self._owner.set_limit(power_limit_mw / 1000.0)

    def reset_power_management_limit(self, block: bool = True) -> None:
        self._owner.set_limit(None)

    def set_persistence_mode(self, enabled: bool, block: bool = True) -> None:
        pass  # nothing to keep loaded on an EMO device

    def get_persistence_mode(self) -> bool:
        return True

    def get_supported_memory_clocks(self) -> list[int]:
        raise ZeusGPUNotSupportedError("memory clocks are not exposed by EMO devices")

    def set_memory_locked_clocks(self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True) -> None:
        raise ZeusGPUNotSupportedError("memory clocks are not exposed by EMO devices")

    def reset_memory_locked_clocks(self, block: bool = True) -> None:
        raise ZeusGPUNotSupportedError("memory clocks are not exposed by EMO devices")

    def get_supported_graphics_clocks(self, memory_clock_mhz: int | None = None) -> list[int]:
        return sorted(self._owner.device.supported_clocks(), reverse=True)

    def set_gpu_locked_clocks(self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True) -> None:
        raise ZeusGPUNotSupportedError("the power-limit baseline does not lock clocks")

    def reset_gpu_locked_clocks(self, block: bool = True) -> None:
        raise ZeusGPUNotSupportedError("the power-limit baseline does not lock clocks")

    def get_average_power_usage(self) -> int:
        raise ZeusGPUNotSupportedError("use the energy counter")

    def get_instant_power_usage(self) -> int:
        raise ZeusGPUNotSupportedError("use the energy counter")

    def get_average_memory_power_usage(self) -> int:
        raise ZeusGPUNotSupportedError("use the energy counter")

    def supports_get_total_energy_consumption(self) -> bool:
        return True

    def get_total_energy_consumption(self) -> int:
        return int(self._owner.device.energy_j(self.gpu_index) * 1000)  # mJ, as NVML

    def get_gpu_temperature(self) -> int:
        raise ZeusGPUNotSupportedError("no thermal model")


class DeviceGPUs(GPUs):
    """zeus's GPU collection over an EMO device; the device's power limit is board-wide for the job,
    so a limit set on any index applies to all (zeus's global optimizer always sets them together)."""

    def __init__(self, device: Device, indices: Sequence[int], limits_w: tuple[float, float]) -> None:
        self.device = device
        self.limits_w = (float(limits_w[0]), float(limits_w[1]))
        self.limit_w = self.limits_w[1]
        self._gpus = [DeviceGPU(self, i) for i in range(max(indices) + 1)]
        self.changes: list[float] = []  # every limit zeus set, in order

    def __del__(self) -> None:
        pass

    @property
    def gpus(self) -> Sequence[GPU]:
        return self._gpus

    def set_limit(self, watts: float | None) -> None:
        watts = self.limits_w[1] if watts is None else float(watts)
        if watts != self.limit_w:
            self.device.set_power_limit(None if watts >= self.limits_w[1] else watts)
            self.limit_w = watts
            self.changes.append(watts)


class JobMonitor:
    """The part of `zeus.monitor.ZeusMonitor` the optimizer uses, on the job's own clock: the time and
    energy of the iterations run through `run()` (what a synchronised training loop would time), not
    the idle gaps between our calls into the device."""

    def __init__(self, device: Device, workload: Any, indices: Sequence[int]) -> None:
        self.device, self.workload = device, workload
        self.gpu_indices = list(indices)
        self.time_s = 0.0
        self.energy_j = {i: 0.0 for i in self.gpu_indices}
        self._open: dict[str, tuple[float, dict[int, float]]] = {}

    def run(self, iterations: int) -> None:
        res = self.device.run(self.workload, iterations, warmup=0)
        self.time_s += res.time_s
        for i in self.gpu_indices:
            self.energy_j[i] += res.energy_per_device_j.get(i, 0.0)

    def begin_window(self, key: str, sync_execution: bool = True) -> None:
        if key in self._open:
            raise ValueError(f"zeus window {key!r} already open")
        self._open[key] = (self.time_s, dict(self.energy_j))

    def end_window(self, key: str, sync_execution: bool = True, cancel: bool = False):
        t0, e0 = self._open.pop(key)
        return ZeusMeasurement(
            time=self.time_s - t0, gpu_energy={i: self.energy_j[i] - e0[i] for i in self.gpu_indices}
        )


@contextlib.contextmanager
def zeus_on_device(device: Device, indices: Sequence[int], limits_w: tuple[float, float]):
    """Install `DeviceGPUs` as zeus's GPU-management singleton for the duration of the block, with
    zeus's torch/jax distributed helpers made single-process. Restores everything on exit."""
    _require_zeus()
    import zeus.device.gpu as zeus_gpu

    gpus = DeviceGPUs(device, indices, limits_w)
    saved = (zeus_gpu._gpus, zeus_pl.is_distributed, zeus_pl.all_reduce, zeus_pl.atexit)
    zeus_gpu._gpus = gpus
    zeus_pl.is_distributed = lambda: False
    zeus_pl.all_reduce = lambda obj, operation: obj
    # zeus registers an atexit hook that resets the limit through get_gpus(); the device restores its
    # own limit on close, and at interpreter exit our adapter is long gone.
    zeus_pl.atexit = _NoAtexit()
    try:
        yield gpus
    finally:
        gpus.set_limit(None)
        zeus_gpu._gpus, zeus_pl.is_distributed, zeus_pl.all_reduce, zeus_pl.atexit = saved


class _NoAtexit:
    @staticmethod
    def register(fn, *a, **kw):
        return fn


def power_limit_range(device: Device, gpu_cfg: GpuConfig, min_w: float) -> tuple[float, float]:
    """(min, max) settable board power in W: from the device when it can say (NVML), else the config."""
    if isinstance(device, ReportsPowerLimits):
        lo, hi, _default = device.power_limits_w(0)
        return float(lo), float(hi)
    return float(min_w), float(gpu_cfg.tdp_w)


def run_zeus(
    device: Device,
    workload: Any,
    devices: Sequence[int],
    budget: float,
    options: ZeusOptions,
    gpu_cfg: GpuConfig,
    *,
    iterations: int,
    warmup: int,
) -> OnlineResult:
    """Drive zeus's `GlobalPowerLimitOptimizer` one iteration per step until it settles, re-warm the
    die at the max limit (online.rewarm), then measure `iterations` iterations at the limit
    it chose. The selector honours the same budget as EMO: the lowest limit whose profiled time is
    within (1 + budget) of the highest limit's."""
    _require_zeus()
    limits = power_limit_range(device, gpu_cfg, options.min_power_limit_w)
    meter = PhaseMeter(device, devices)
    with zeus_on_device(device, devices, limits) as gpus:
        plo = zeus_pl.GlobalPowerLimitOptimizer(
            JobMonitor(device, workload, devices),
            optimum_selector=zeus_pl.MaxSlowdownConstraint(factor=1.0 + budget),
            wait_steps=options.wait_steps,
            warmup_steps=options.warmup_steps,
            profile_steps=options.profile_steps,
            pl_step=options.pl_step_w,
        )
        monitor = plo.monitor
        steps = 0
        with meter.phase("explore"):
            plo.on_step_begin()
            while not isinstance(plo.state, zeus_pl.Done):
                # zeus acts only when a state's step count runs out: run those iterations in one go
                # (long windows, as its energy counter needs), then let it count them
                n = max(1, int(plo.state.steps))
                if steps + n > options.max_steps:
                    raise ValueError(
                        f"zeus: no power limit chosen within optimizer.zeus.max_steps={options.max_steps} steps"
                    )
                monitor.run(n)
                for _ in range(n):
                    plo.on_step_begin()
                steps += n
        chosen_w = plo.state.optimal_power_limit / 1000.0
        gpus.set_limit(None)  # the die back to the max clock's warmth, then the limit zeus chose
        rewarm(device, workload, float(gpu_cfg.settle_s))
        gpus.set_limit(chosen_w)
        with meter.phase("steady"):
            steady = device.run(workload, iterations, warmup=warmup)
        profile = [{"power_limit_w": m.power_limit, "time_s": m.time, "energy_j": m.energy} for m in plo.measurements]
    log.info("zeus %s: chose %.0f W after %d steps", ZEUS_VERSION, chosen_w, steps)
    return OnlineResult(
        method="zeus",
        steady=steady,
        explore=meter.totals("explore"),
        setting={"power_limit_w": chosen_w, "profile": profile, "explore_steps": steps, "zeus_version": ZEUS_VERSION},
    )


def run_online(ctx: OnlineContext) -> OnlineResult:
    """optimizer.name=zeus (emo.methods): its options are the optimizer's `zeus` section."""
    return run_zeus(
        ctx.device,
        ctx.workload,
        ctx.devices,
        ctx.budget,
        ctx.optimizer.zeus,
        ctx.gpu,
        iterations=ctx.iterations,
        warmup=ctx.warmup,
    )
