"""Real NVIDIA GPUs through NVML (nvidia-ml-py): the device protocol on hardware.

Measurement follows Zeus: the energy counter (mJ, `nvmlDeviceGetTotalEnergyConsumption`) and the wall
clock around a window. Control is locked SM clocks (`nvmlDeviceSetGpuLockedClocks`) or a power limit,
set directly as root or relayed through zeusd (`ZEUSD_SOCK_PATH`) when not (ClockController).

Who owns the clocks: a training job's clocks (emo.device.nvml_control.nvml_applier) are set by a clock owner, a small side
process (emo.device.clock_owner) that resets every GPU it touched when the trainer dies in any way.
EMO's own stages (calibrate, validate's static clocks) set clocks in-process through ClockController;
whatever they changed is put back on normal exit, on an exception, and on SIGINT/SIGTERM/SIGHUP
(atexit plus signal handlers that chain the ones already installed), the runtime appliers' threads
stopped first so that the reset is the last call each GPU sees. Like a clock owner, such a stage
records each GPU it locks on the node (emo.device.gpu_locks, the stage's process both owner and
trainer): it is refused a GPU another live EMO job holds, resets only a GPU whose record is still its
own and removes the record with the reset; a stage SIGKILLed while it held a clock leaves a record
that the next EMO command (a stage's first lock, a clock owner, `emo apply`, `emo reset-clocks`)
resets and names. A forked child never sets or resets its parent's GPUs: the controller, the guard
and its handlers do nothing in a process other than the one that made them.
`emo reset-clocks` is the last resort when even the owner died (a node crash, or SIGKILL to both).

Only this module and its helpers import pynvml, lazily, so the package imports without a driver.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emo.device import COUNTERS, Measurement, ProfileResult, RunResult, gpu_locks
from emo.device import ProfilingUnavailable as NoCounters
from emo.device import zeusd as _zeusd
from emo.device.control import GpuAccessError  # noqa: F401 - raised here, part of this module's API
from emo.device.features import EMO_FROM_NCU, emo_counters, sum_counters  # noqa: F401 - sum_counters is part of this module's API
from emo.device.gpu_locks import LOST
from emo.device.zeusd import SOCK_ENV, ZeusdError, ZeusdRelay
from emo.errors import ConfigError
from emo.policy import FrequencyPolicy
from emo.runtime import PolicyApplier, refuse_triggered

if TYPE_CHECKING:
    from emo.sections import GpuConfig


class ProfilingUnavailable(GpuAccessError, NoCounters):
    """No counters on this machine: no Nsight Compute, or no permission to read the counters."""


def import_pynvml():
    """pynvml, or this process's fake GPUs when EMO_FAKE_GPU=N asks to try the GPU path without one
    (emo.device.nvml_fake; every process of the job inherits the variable)."""
    if os.environ.get("EMO_FAKE_GPU"):
        from emo.device.nvml_fake import from_fake_gpu_env

        return from_fake_gpu_env()
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a core dependency
        raise GpuAccessError("nvidia-ml-py is not installed: pip install nvidia-ml-py") from e
    return pynvml


def nvml_init(nvml) -> None:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise GpuAccessError(f"cannot initialise NVML ({e}): no NVIDIA driver or GPU on this machine") from e


PERMISSION_HINT = (
    f"Run as root, or start zeusd (sudo zeusd --socket-path /var/run/zeusd.sock --socket-permissions 660, "
    f"the socket's group your jobs', with a token: docs/gpu.md) and export {SOCK_ENV}=/var/run/zeusd.sock"
)


def explain(nvml, e: Exception, what: str) -> GpuAccessError:
    """One clear line for the NVML failures a user can act on: what was asked, the cause, what to do."""
    value = getattr(e, "value", None)
    if value == nvml.NVML_ERROR_NO_PERMISSION:
        cause, reason = _zeusd.PERMISSION, f"permission denied (no permission). {PERMISSION_HINT}"
    elif value == nvml.NVML_ERROR_NOT_SUPPORTED:
        cause, reason = (
            _zeusd.NOT_SUPPORTED,
            ("this GPU or driver does not support it (NVML_ERROR_NOT_SUPPORTED; locked clocks need Volta or newer)"),
        )
    elif value == nvml.NVML_ERROR_INVALID_ARGUMENT:
        cause, reason = (
            _zeusd.OUT_OF_RANGE,
            (
                "out of range (NVML_ERROR_INVALID_ARGUMENT): use a clock and GPU index "
                "this GPU supports (`emo gpu-config` lists them)"
            ),
        )
    else:
        cause, reason = _zeusd.OTHER, f"NVML error: {e}"
    return GpuAccessError(f"{what}: {reason}", cause=cause, reason=reason)


# --------------------------------------------------------------------------- control
class ClockController:
    """Sets and resets locked SM clocks and power limits by NVML index: directly or via zeusd.
    `guarded`: what it changes is put back at exit by the restore guard, and each GPU whose clock it
    locks is recorded on the node (emo.device.gpu_locks) for this process (False in the clock owner,
    which resets and records by itself). It refuses to act in a forked child of the process that made it."""

    def __init__(self, nvml, zeusd: ZeusdRelay | None = None, *, guarded: bool = True):
        self.nvml = nvml
        self.zeusd = zeusd
        self.guarded = guarded
        self._pid = os.getpid()
        self._handles: dict[int, Any] = {}

    @classmethod
    def auto(cls, nvml, *, guarded: bool = True) -> ClockController:
        """zeusd when ZEUSD_SOCK_PATH (or ZEUSD_HOST_PORT) is set, as Zeus does: it must answer as
        zeusd 0.5 and let us control GPUs. Otherwise NVML directly, which needs root (its
        NO_PERMISSION becomes the "root or zeusd" message)."""
        try:
            relay = ZeusdRelay.from_env()
            if relay is not None:
                relay.connect()
        except ZeusdError as e:
            raise GpuAccessError(str(e), cause=e.cause) from e
        return cls(nvml, relay, guarded=guarded)

    @property
    def via(self) -> str:
        return "zeusd" if self.zeusd else "nvml"

    def handle(self, index: int):
        if index not in self._handles:
            try:
                self._handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
            except self.nvml.NVMLError as e:
                raise explain(self.nvml, e, f"GPU {index}") from e
        return self._handles[index]

    def _own_process(self, what: str) -> None:
        if os.getpid() != self._pid:
            raise GpuAccessError(
                f"{what}: refused in a forked child (pid {os.getpid()}): only the process "
                "that set up clock control may change its GPUs",
                cause="forked child",
                reason="refused in a forked child",
            )

    def _do(self, what: str, direct: Callable[[], None], relayed: Callable[[ZeusdRelay], None]) -> None:
        self._own_process(what)
        try:
            relayed(self.zeusd) if self.zeusd else direct()
        except self.nvml.NVMLError as e:
            raise explain(self.nvml, e, what) from e
        except ZeusdError as e:
            raise GpuAccessError(f"{what}: {e}", cause=e.cause, reason=str(e)) from e

    def set_clock(self, index: int, mhz: int) -> None:
        mhz = int(mhz)
        what = f"lock SM clock of GPU {index} at {mhz} MHz"
        if not self.guarded:  # the clock owner: it records its locks itself
            self._set_direct(index, mhz, what)
            return
        guard = _GUARD
        with guard._lock:
            self._own_process(what)
            fresh = self._take(guard, index)
            try:
                self._set_direct(index, mhz, what)
            except GpuAccessError as e:
                # refused outright (no permission, a bad clock) on a GPU just recorded: drop its record
                # unreset; unreachable or unknown: it may have landed, so it is reset (and released) at exit
                if not fresh or e.cause in (_zeusd.UNREACHABLE, _zeusd.OTHER):
                    guard.changed(self, index, "clocks")
                else:
                    with contextlib.suppress(OSError):
                        gpu_locks.release(index, guard.holder(), lambda g: None)
                    guard.held.discard(index)
                raise
            guard.changed(self, index, "clocks")

    def _set_direct(self, index: int, mhz: int, what: str) -> None:
        self._do(
            what,
            lambda: self.nvml.nvmlDeviceSetGpuLockedClocks(self.handle(index), mhz, mhz),
            lambda z: z.set_gpu_locked_clocks(index, mhz, mhz),
        )

    def _take(self, guard: _RestoreGuard, index: int) -> bool:
        """Before this process locks GPU `index`: the GPU is its own on the node (emo.device.gpu_locks),
        as a clock owner's take. The first lock of the process also resets what dead EMO jobs left
        locked, saying so. Returns whether the record was made now; raises GpuAccessError (cause HELD)
        when another live EMO job holds the GPU, (LOST) when this process's record of it is gone."""
        me = guard.holder()
        if index in guard.held:
            if gpu_locks.mine(index, me):
                return False
            guard.held.discard(index)
            guard.lost.add(index)  # not this process's to reset any more
            guard.restored(index, "clocks")
            why = f"reset by someone else while this process held it ({_holder(index)})"
            raise GpuAccessError(f"GPU {index}: its clock was {why}", cause=LOST, reason=why)
        if not guard.recovered:
            guard.recovered = True
            try:
                for line in gpu_locks.recover(self._reset_direct):  # a dead job's or stage's locks: reset, said
                    print(f"emo: {line}", file=sys.stderr)
            except OSError:  # an unusable lock folder is said by acquire below
                pass
        stale = gpu_locks.take(index, me)
        guard.held.add(index)
        guard.lost.discard(index)
        if stale is not None:
            print(
                f"emo: GPU {index} was left locked by {stale.describe()}, now dead: this job takes it over",
                file=sys.stderr,
            )
        return True

    def reset_clock(self, index: int) -> None:
        if not self.guarded:
            self._reset_direct(index)
            return
        guard = _GUARD
        with guard._lock:
            if index in guard.lost:  # someone else reset or took it (said when found): not ours to reset
                guard.lost.discard(index)
            elif index in guard.held:  # ours on the node: reset and the record removed together
                self._own_process(f"reset SM clock of GPU {index}")
                try:
                    ours = gpu_locks.release(index, guard.holder(), self._reset_direct)
                except OSError as e:  # the records cannot be read or locked: reset anyway, ours as far as we know
                    print(
                        f"emo: GPU {index}: the lock records in {gpu_locks.lock_dir()} failed ({e}): resetting without them",
                        file=sys.stderr,
                    )
                    self._reset_direct(index)
                    ours = True
                guard.held.discard(index)
                if not ours:
                    print(
                        f"emo: GPU {index}: its clock was reset by someone else while this process held it "
                        f"({_holder(index)}): left as it is",
                        file=sys.stderr,
                    )
            else:  # never recorded by this process (`emo reset-clocks`, a dead job's lock): reset as asked
                self._reset_direct(index)
            guard.restored(index, "clocks")

    def _reset_direct(self, index: int) -> None:
        self._do(
            f"reset SM clock of GPU {index}",
            lambda: self.nvml.nvmlDeviceResetGpuLockedClocks(self.handle(index)),
            lambda z: z.reset_gpu_locked_clocks(index),
        )

    def set_power_limit(self, index: int, watts: float) -> None:
        h = self.handle(index)
        lo, hi = self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        mw = int(round(watts * 1000))
        if not lo <= mw <= hi:
            raise GpuAccessError(f"power limit {watts} W outside GPU {index}'s range {lo / 1000:g}-{hi / 1000:g} W")
        self._do(
            f"set power limit of GPU {index} to {watts} W",
            lambda: self.nvml.nvmlDeviceSetPowerManagementLimit(h, mw),
            lambda z: z.set_power_limit(index, mw),
        )
        if self.guarded:
            _GUARD.changed(self, index, "power")

    def reset_power_limit(self, index: int) -> None:
        h = self.handle(index)
        mw = int(self.nvml.nvmlDeviceGetPowerManagementDefaultLimit(h))
        self._do(
            f"reset power limit of GPU {index}",
            lambda: self.nvml.nvmlDeviceSetPowerManagementLimit(h, mw),
            lambda z: z.set_power_limit(index, mw),
        )
        if self.guarded:
            _GUARD.restored(index, "power")


class _RestoreGuard:
    """Remembers what this process changed and puts it back at exit or on SIGINT/SIGTERM/SIGHUP
    (SIGHUP: the ssh session closed), after stopping the appliers that could still change a clock."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self._lock = threading.RLock()
        self._changed: dict[int, set[str]] = {}
        self._controller: ClockController | None = None
        self._installed = False
        self._previous: dict[int, Any] = {}
        self._appliers: list[PolicyApplier] = []
        self._forget_locks()

    def _forget_locks(self) -> None:
        self.held: set[int] = set()  # GPUs whose lock record (emo.device.gpu_locks) this process made
        self.lost: set[int] = set()  # ... and found reset or taken by someone else: not ours to reset
        self.recovered = False  # dead jobs' locks reset at this process's first lock
        self._me: gpu_locks.Holder | None = None

    def holder(self) -> gpu_locks.Holder:
        """This process as the holder of its in-process locks: its own owner and trainer."""
        if self._me is None or self._me.pid != os.getpid():
            self._me = gpu_locks.Holder.me(os.getpid())
        return self._me

    def forget(self) -> None:
        """In a forked child: nothing of the parent's is ours to restore. The handlers stay installed
        (they chain to the previous ones) but find nothing to do; the lock may have been held by a
        parent thread at the fork, so it is made anew."""
        self._lock = threading.RLock()
        self._changed, self._controller, self._appliers = {}, None, []
        self._forget_locks()

    def track(self, applier: PolicyApplier) -> None:
        """An applier whose threads restore_all must stop before it resets anything."""
        with self._lock:
            self._appliers.append(applier)

    def changed(self, controller: ClockController, index: int, what: str) -> None:
        with self._lock:
            self._controller = controller
            self._changed.setdefault(index, set()).add(what)
            if not self._installed:
                self._install()

    def arm(self, controller: ClockController | None = None) -> None:
        """Install the handlers now, from the main thread, for changes later made by other threads
        (signal handlers can only be installed from the main thread)."""
        with self._lock:
            self._controller = self._controller or controller
            if not self._installed:
                self._install()

    def restored(self, index: int, what: str) -> None:
        with self._lock:
            self._changed.get(index, set()).discard(what)
            if not self._changed.get(index):
                self._changed.pop(index, None)

    def pending(self) -> dict[int, set[str]]:
        with self._lock:
            return {k: set(v) for k, v in self._changed.items()}

    def restore_all(self) -> list[str]:
        """Reset everything still changed; never raises (it runs at exit). Returns the failures."""
        failures = []
        with self._lock:
            appliers, self._appliers = self._appliers, []
        for applier in appliers:  # outside the lock: their threads take it when a request lands
            applier.close()  # resets its GPUs (a failed reset stays pending and is retried below)
        with self._lock:
            ctl = self._controller
            if ctl is not None:
                for index, what in sorted(self.pending().items()):
                    for kind, fn in (("clocks", ctl.reset_clock), ("power", ctl.reset_power_limit)):
                        if kind in what:
                            try:
                                fn(index)
                            except Exception as e:  # keep restoring the others
                                failures.append(f"GPU {index} {kind}: {e}")
        for f in failures:
            print(f"emo: could not restore {f}; run `emo reset-clocks`", file=sys.stderr)
        return failures

    def _install(self) -> None:
        atexit.register(self.restore_all)
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        self._installed = True

    def _on_signal(self, signum, frame) -> None:
        self.restore_all()
        prev = self._previous.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # SIG_DFL: die of the same signal, so the parent sees the right status
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


_GUARD = _RestoreGuard()
os.register_at_fork(after_in_child=lambda: _GUARD.forget())  # late lookup: tests swap _GUARD


def _holder(gpu: int) -> str:
    rec = gpu_locks.read(gpu)
    return f"now held by {rec.describe()}" if rec is not None else "`emo reset-clocks`, or a take-over"


def visible_nvml_indices(nvml) -> list[int]:
    """NVML indices of the GPUs this process may use, in CUDA order (CUDA_VISIBLE_DEVICES if numeric)."""
    count = nvml.nvmlDeviceGetCount()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or env.strip() == "":
        return list(range(count))
    try:
        ids = [int(x) for x in env.split(",") if x.strip()]
    except ValueError:  # UUIDs: map them through NVML
        uuids = {_str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))): i for i in range(count)}
        ids = [uuids[u.strip()] for u in env.split(",") if u.strip() in uuids]
    return [i for i in ids if 0 <= i < count]


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- the device
class NvmlDevice:
    """The device protocol on real NVIDIA GPUs. Device ids 0..n-1 are the visible GPUs (ranks)."""

    def __init__(self, gpu_cfg: Any, *, controller: ClockController | None = None):
        # CUDA's default device order is "fastest first"; NVML's is PCI bus order. Make CUDA device i
        # NVML index i for this process and its children (only effective before CUDA initialises).
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self.nvml = import_pynvml()
        nvml_init(self.nvml)
        self.name = str(gpu_cfg["name"] if isinstance(gpu_cfg, dict) else gpu_cfg.name)  # gpu.name: required
        self.indices = visible_nvml_indices(self.nvml)
        if not self.indices:
            raise GpuAccessError("NVML sees no GPU (check CUDA_VISIBLE_DEVICES)")
        self._controller = controller
        self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        self.model = _str(self.nvml.nvmlDeviceGetName(self._handles[0]))
        if self.name == "auto":  # conf/gpu/nvml.yaml: the model NVML reports names the GPU
            self.name = gpu_key(self.model)
        self.driver = "unknown"  # which driver a calibration came from (emo.stages.calibrate)
        with contextlib.suppress(Exception):
            self.driver = _str(self.nvml.nvmlSystemGetDriverVersion())
        self._clocks: list[int] | None = None
        self._policy: FrequencyPolicy | None = None
        self._locked: dict[int, int] = {}

    # -- reads
    @property
    def controller(self) -> ClockController:
        if self._controller is None:
            self._controller = ClockController.auto(self.nvml)
        return self._controller

    @property
    def device_count(self) -> int:
        return len(self.indices)

    def supported_clocks(self) -> list[int]:
        """SM clocks supported at the highest memory clock (the one a training run uses)."""
        if self._clocks is None:
            h = self._handles[0]
            try:
                mem = max(self.nvml.nvmlDeviceGetSupportedMemoryClocks(h))
                self._clocks = sorted({int(c) for c in self.nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem)})
            except self.nvml.NVMLError as e:
                raise explain(self.nvml, e, f"supported clocks of GPU {self.indices[0]}") from e
        return list(self._clocks)

    def default_clock(self) -> int:
        return self.supported_clocks()[-1]

    def energy_j(self, device: int = 0) -> float:
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self._handles[device]) / 1000.0
        except self.nvml.NVMLError as e:
            raise explain(self.nvml, e, f"energy counter of GPU {self.indices[device]}") from e

    def time_s(self) -> float:
        return time.perf_counter()

    def power_limits_w(self, device: int = 0) -> tuple[float, float, float]:
        """(min, default, max) board power limit in watts."""
        h = self._handles[device]
        lo, hi = self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        return lo / 1000, self.nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000, hi / 1000

    def utilization(self, device: int = 0) -> dict[str, float]:
        """Utilisation of one GPU over the last `run` (fractions 0..1): `gpu`, the share of time a
        kernel ran; `memory`, the share of time device memory was read or written. The mean of NVML's
        utilisation samples (nvmlDeviceGetSamples) taken during the run; without a run or samples,
        nvmlDeviceGetUtilizationRates (NVML's last sample period)."""
        h = self._handles[device]
        out = {}
        window = getattr(self, "_last_run_us", None)
        for key, kind in (
            ("gpu", self.nvml.NVML_GPU_UTILIZATION_SAMPLES),
            ("memory", self.nvml.NVML_MEMORY_UTILIZATION_SAMPLES),
        ):
            vals = []
            if window is not None:
                try:
                    _, samples = self.nvml.nvmlDeviceGetSamples(h, kind, int(window[0]))
                    vals = [s.sampleValue.uiVal for s in samples if window[0] <= s.timeStamp <= window[1]]
                except self.nvml.NVMLError:
                    vals = []
            if vals:
                out[key] = sum(vals) / len(vals) / 100.0
            else:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(h)
                out[key] = getattr(rates, key) / 100.0
        return out

    def utilization_samples(self, device: int = 0) -> dict[str, list[tuple[float, float]]]:
        """NVML's utilisation samples (nvmlDeviceGetSamples) with timestamps inside the last run, per
        kind as (t_s, fraction), oldest first; none without a run."""
        window = getattr(self, "_last_run_us", None)
        out: dict[str, list[tuple[float, float]]] = {"gpu": [], "memory": []}
        if window is None:
            return out
        for key, kind in (
            ("gpu", self.nvml.NVML_GPU_UTILIZATION_SAMPLES),
            ("memory", self.nvml.NVML_MEMORY_UTILIZATION_SAMPLES),
        ):
            try:
                _, samples = self.nvml.nvmlDeviceGetSamples(self._handles[device], kind, int(window[0]))
            except self.nvml.NVMLError:
                continue
            out[key] = sorted(
                (s.timeStamp * 1e-6, s.sampleValue.uiVal / 100.0)
                for s in samples
                if window[0] <= s.timeStamp <= window[1]
            )
        return out

    # -- control
    def lock_clock(self, device: int, mhz: int) -> None:
        if mhz not in self.supported_clocks():
            raise GpuAccessError(
                f"{mhz} MHz is not a supported SM clock of {self.model} "
                f"({self.supported_clocks()[0]}-{self.default_clock()} MHz)"
            )
        self.controller.set_clock(self.indices[device], mhz)
        self._locked[device] = mhz

    def set_policy(self, policy: FrequencyPolicy | None) -> None:
        """None: default clocks. One step per device: locked now. Several steps: kept for `run`,
        where the runtime applier in the workload's process issues them around its iterations. A
        host-triggered policy (emo.policy.Trigger) is refused: that applier issues steps at times."""
        if policy is not None:
            refuse_triggered(policy, f"{policy.meta.get('method', 'this')} policy")
        self._policy = policy
        if policy is None:
            for d in list(self._locked):
                self.controller.reset_clock(self.indices[d])
                self._locked.pop(d)
            return
        for d, steps in policy.steps.items():
            if d >= self.device_count:
                raise GpuAccessError(f"policy names device {d} but only {self.device_count} GPU(s) are visible")
            if len({s.sm_mhz for s in steps}) == 1:
                self.lock_clock(d, steps[0].sm_mhz)

    def set_power_limit(self, watts: float | None) -> None:
        for i in self.indices:
            if watts is None:
                self.controller.reset_power_limit(i)
            else:
                self.controller.set_power_limit(i, watts)

    def clock_step_latencies_ms(self, pairs: list[tuple[int, int]], poll_ms: float) -> list[float]:
        """Per (from, to) pair, on the first visible GPU: lock `from` and wait until NVML reads it, then
        lock `to` and time (perf_counter, from just before the request) until a read of the SM clock
        (nvmlDeviceGetClockInfo, one every poll_ms) shows it: what the runtime applier's requests
        take to land. Measured on an otherwise idle GPU; a clock that has not landed after
        LANDING_POLLS reads is an error (power or thermal capping, or another process's lock)."""
        if not poll_ms > 0:
            raise ConfigError(f"clock latency: poll_ms must be > 0 (got {poll_ms})")
        out = []
        for a, b in pairs:
            self._clock_lands_ms(int(a), poll_ms)
            out.append(self._clock_lands_ms(int(b), poll_ms))
        return out

    def _clock_lands_ms(self, mhz: int, poll_ms: float) -> float:
        """Lock `mhz` and poll until the SM clock reads it: the ms from the request to that read."""
        h, what = self._handles[0], f"SM clock of GPU {self.indices[0]}"
        t0 = time.perf_counter()
        self.lock_clock(0, mhz)
        seen = None
        for k in range(LANDING_POLLS):
            try:
                seen = int(self.nvml.nvmlDeviceGetClockInfo(h, self.nvml.NVML_CLOCK_SM))
            except self.nvml.NVMLError as e:
                raise explain(self.nvml, e, f"reading the {what}") from e
            now = time.perf_counter()
            if seen == mhz:
                return (now - t0) * 1e3
            time.sleep(max(0.0, t0 + (k + 1) * poll_ms * 1e-3 - now))  # the next read on the poll grid
        raise GpuAccessError(
            f"the {what} did not reach {mhz} MHz within {LANDING_POLLS} reads "
            f"{poll_ms:g} ms apart (it reads {seen} MHz: power or thermal capping, "
            "or another process holding a clock lock?)"
        )

    def close(self) -> None:
        """Restore default clocks and power limits of every GPU this process changed."""
        failures = _GUARD.restore_all()
        self._locked.clear()
        self._policy = None
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
        if failures:
            raise GpuAccessError("could not restore: " + "; ".join(failures))

    def __enter__(self) -> NvmlDevice:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- measurement
    def measure(self, fn: Callable[[], None], devices: list[int] | None = None) -> Measurement:
        """Energy and time of `fn()` (which must synchronise the GPU before returning)."""
        devices = list(range(self.device_count)) if devices is None else devices
        e0 = [self.energy_j(d) for d in devices]
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        e1 = [self.energy_j(d) for d in devices]
        return Measurement(
            time_s=t1 - t0,
            energy_j=sum(b - a for a, b in zip(e0, e1)),
            sm_mhz=self._locked.get(devices[0]) if len(devices) == 1 else None,
        )

    def run_microbenchmark(self, name: str, sm_mhz: int, min_seconds: float = 1.0) -> Measurement:
        """One microbenchmark at a locked clock; time and energy per single launch, measured over
        enough launches that the window spans >= min_seconds of the energy counter."""
        from emo.device import cuda_launch

        bench = cuda_launch.microbenchmark(name, device=0)
        self.lock_clock(0, sm_mhz)
        bench.run(3)  # warm: module loaded, clock settled
        per_launch = bench.time_one()
        n = loops_for(per_launch, min_seconds)
        m = self.measure(lambda: bench.run(n), devices=[0])
        return Measurement(time_s=m.time_s / n, energy_j=m.energy_j / n, sm_mhz=sm_mhz)

    def profile_range(self, kernels: list[Any]) -> ProfileResult:
        """Table II counters of one execution of a range of microbenchmark kernels, through Nsight
        Compute's range replay (cupti-python binds no Range Profiler API; see docs/gpu.md)."""
        return ncu_profile_microbench_range([str(k) for k in kernels], gpu=self.indices[0])

    def profile_ranges(self, workload: Any, ranges: list) -> list[ProfileResult]:
        """Ranges of a `command` workload named by (rank, launch ordinals within an iteration): the
        command is rerun once under Nsight Compute, which profiles every kernel of one iteration
        (kernel replay with --profile-from-start off; the injected hooks call cudaProfilerStart/Stop
        at the iteration markers around it, a process-wide window that holds the kernels autograd's
        backward thread launches as well as the main thread's), then EMO ends the program; each
        range's counters are its kernels' counters summed (active_warps: cycle-weighted).
        Multi-rank commands (torchrun, deepspeed, ...) are profiled in the same run: ncu follows every
        process and skips NCCL kernels (a replayed collective would wait for peers that do not replay
        it), so a range's ordinals are mapped past its rank's NCCL kernels (KernelRange.nccl)."""
        from emo.device import launcher as capture

        kind = workload.get("kind") if isinstance(workload, dict) else getattr(workload, "kind", None)
        if not _starts_program(workload):
            raise ConfigError(f"workload.kind={kind!r}: the nvml backend profiles 'command' workloads only")
        spec = capture.CaptureSpec.from_workload(workload)
        own_ranks = capture.starts_ranks(spec.command)  # a launcher: its rank count is its own option
        bad = [r.rank for r in ranges if r.rank < 0 or (not own_ranks and r.rank >= spec.nproc)]
        if bad:
            raise ValueError(f"profile range: rank {bad[0]} not in the command (workload.nproc={spec.nproc})")
        if not ranges:
            return []
        iteration = spec.wait + spec.warmup  # the first iteration the trace window records
        cmd = ncu_command(
            capture.build_command(spec),
            replay="kernel",
            available=ncu_available_metrics(),
            skip_nccl=True,
            all_processes=True,
        )
        env = capture.profile_env(iteration)
        if spec.nproc == 1 and not own_ranks:
            env["CUDA_VISIBLE_DEVICES"] = str(self.indices[0])
        text, cost = _run_ncu(cmd, env)
        per_rank = parse_ncu_kernels_by_rank(text, None if own_ranks else spec.nproc)
        missing = [r.rank for r in ranges if r.rank >= len(per_rank)]
        if missing:
            raise ValueError(f"profile range: rank {missing[0]} not among the {len(per_rank)} ranks ncu profiled")
        passes = parse_ncu_passes(text)
        total = sum(len(r.ordinals) for r in ranges)
        out = []
        for r in ranges:
            idx = compute_indices(r)
            kernels = per_rank[r.rank]
            if max(idx) >= len(kernels):
                raise ValueError(
                    f"ncu profiled {len(kernels)} kernels of rank {r.rank} in iteration {iteration}, but a "
                    f"range needs kernel ordinal {max(r.ordinals)}: does the command run the same kernels "
                    "each iteration?"
                )
            out.append(
                ProfileResult(
                    counters=sum_counters([kernels[i] for i in idx]),
                    passes=passes,
                    cost_s=cost * len(r.ordinals) / total,
                )
            )
        return out

    def profile_cost_s(self, kernel_s_by_rank: list[list[float]], run_s: float, passes: int | None = None) -> float:
        """What profile_ranges will cost, said before it starts: the command's own run plus, for the
        slowest rank (ranks replay at once), every non-NCCL kernel of one iteration replayed `passes`
        times with a save/restore of its memory (NCU_PASS_OVERHEAD_S each; an estimate, not measured)."""
        p = passes or NCU_PASSES_ESTIMATE
        return run_s + max((p * sum(k + NCU_PASS_OVERHEAD_S for k in ks) for ks in kernel_s_by_rank), default=0.0)

    def run(
        self,
        workload: Any,
        iterations: int,
        *,
        warmup: int = 1,
        trace_dir: Path | None = None,
        capture: str = "full",
    ) -> RunResult:
        """With `trace_dir`: run a `command` workload under emo.capture, its profiler window's
        `active` iterations the measured ones, energy read by each rank at the window's edges.
        Without: a measurement, never under the profiler (run_segments: the ranks time their own
        iterations), so that what is measured is the job as it runs."""
        from emo.device import launcher as capture_

        kind = workload.get("kind") if isinstance(workload, dict) else getattr(workload, "kind", None)
        if not _starts_program(workload):
            raise ValueError(
                f"workload.kind={kind!r}: the nvml backend runs 'command' workloads only "
                "(synthetic workloads are for the virtual GPU)"
            )
        if trace_dir is None:
            policy = self._policy
            try:
                return self.run_segments(workload, [(policy, iterations)], warmup=warmup)[0]
            finally:
                self.set_policy(policy)  # run_segments handed the clocks to the ranks for its launch
        spec = capture_.CaptureSpec.from_workload(workload, iterations=iterations, warmup=warmup, capture=capture)
        out = Path(trace_dir)
        policy_file = None
        if self._policy is not None and any(len({s.sm_mhz for s in v}) > 1 for v in self._policy.steps.values()):
            policy_file = out / capture_.SIDECAR / "policy.json"
            self._policy.save(policy_file)
        t0 = time.time() * 1e6  # NVML sample timestamps are CPU time in microseconds
        result = capture_.run_capture(spec, out, policy=policy_file)
        self._last_run_us = (t0, time.time() * 1e6)
        return capture_.run_result(result, out)

    def run_segments(
        self, workload: Any, runs: list[tuple[FrequencyPolicy | None, int]], *, warmup: int = 1
    ) -> list[RunResult]:
        """Several measured runs of a `command` workload in ONE launch of it (emo.segments): each
        (policy or None, iterations) after `warmup` iterations, its clocks set inside the ranks by the
        runtime applier (a static policy is one step), reset between runs; EMO ends the program after
        the last."""
        from emo.device import launcher as capture

        kind = workload.get("kind") if isinstance(workload, dict) else getattr(workload, "kind", None)
        if not _starts_program(workload):
            raise ConfigError(f"workload.kind={kind!r}: the nvml backend runs 'command' workloads only")
        self.set_policy(None)  # nothing locked from here: the ranks own the clocks for this launch
        spec = capture.CaptureSpec.from_workload(workload)
        segments = [
            {
                "warmup": int(warmup),
                "iterations": int(n),
                "policy": p.to_dict() if p else None,
                "label": _single_clock(p),
            }
            for p, n in runs
        ]
        t0 = time.time() * 1e6
        with tempfile.TemporaryDirectory(prefix="emo-runs-") as out:  # the ranks' records: read, then gone
            res = capture.run_segments(spec, Path(out), segments)
        self._last_run_us = (t0, time.time() * 1e6)
        return res


def _single_clock(policy: FrequencyPolicy | None) -> int | None:
    if policy is None:
        return None
    clocks = {s.sm_mhz for v in policy.steps.values() for s in v}
    return clocks.pop() if len(clocks) == 1 else None


# clock_step_latencies_ms: reads of the SM clock before a locked clock that has not shown up is an error
LANDING_POLLS = 5000


def loops_for(per_launch_s: float, min_seconds: float) -> int:
    """Launches needed for a window of at least min_seconds (and at least 1)."""
    if per_launch_s <= 0:
        raise ValueError(f"per-launch time must be positive, got {per_launch_s}")
    return max(1, math.ceil(min_seconds / per_launch_s))


# --------------------------------------------------------------------------- Nsight Compute
# Table II counters -> Nsight Compute metrics (first one present wins; names differ by arch).
NCU_METRICS = EMO_FROM_NCU
assert tuple(NCU_METRICS) == COUNTERS


# Before a profiling run: replay passes per kernel (ncu needs several for NCU_METRICS; the exact
# count is printed by ncu and stored) and the save/restore cost of one pass. Estimates.
NCU_PASSES_ESTIMATE = 8
NCU_PASS_OVERHEAD_S = 2e-3
NCCL_KERNELS = "regex:^(?!nccl)"  # ncu --kernel-name filter: every kernel whose name does not start with nccl


@functools.lru_cache(maxsize=4)
def ncu_available_metrics(ncu: str = "ncu") -> frozenset[str] | None:
    """The base metric names Nsight Compute offers for this machine's GPU (`ncu --query-metrics`),
    or None when it cannot say (no ncu, no GPU): then every metric is asked for as it is."""
    try:
        p = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {ln.split()[0] for ln in p.stdout.splitlines() if ln.strip() and "__" in ln.split()[0]}
    return frozenset(names) if p.returncode == 0 and names else None


def ncu_command(
    argv: list[str],
    *,
    ncu: str = "ncu",
    nvtx_include: str | None = None,
    replay: str = "range",
    skip_nccl: bool = False,
    all_processes: bool = False,
    extra: tuple[str, ...] = (),
    available: frozenset[str] | None = None,
) -> list[str]:
    """`ncu` over `argv` with every metric of NCU_METRICS, CSV on stdout. replay="range": each
    cuProfilerStart/Stop pair (or NVTX range matching nvtx_include) is one result; replay="kernel":
    each kernel launched inside the NVTX ranges matching nvtx_include is one result. skip_nccl: do
    not profile NCCL kernels; all_processes: follow the child processes (torchrun's ranks); extra:
    more metrics; available: the base names this GPU offers (ncu_available_metrics), others left
    out (their counters are then NaN, never a made-up zero). `--clock-control none`: ncu would otherwise lock the clocks to base while it
    profiles, changing what EMO alone controls (and what a shared box's rules may forbid)."""
    metrics = sorted({m for ms in NCU_METRICS.values() for m in ms} | set(extra))
    if available is not None:  # ncu refuses the whole run for one metric this GPU lacks
        metrics = [m for m in metrics if m.split(".")[0] in available]
    cmd = [
        ncu,
        "--clock-control",
        "none",
        "--replay-mode",
        replay,
        "--metrics",
        ",".join(metrics),
        "--csv",
        "--print-units",
        "base",
    ]
    if all_processes:
        cmd += ["--target-processes", "all"]
    if skip_nccl:
        cmd += ["--kernel-name-base", "function", "--kernel-name", NCCL_KERNELS]
    if nvtx_include:
        cmd += ["--nvtx", "--nvtx-include", nvtx_include]
    else:
        cmd += ["--profile-from-start", "off"]
    return cmd + list(argv)


def _starts_program(workload: Any) -> bool:
    """A workload this backend can run: a program it starts, which the workload gives as its `command`
    (the keys of a kind whose source is a command, emo/workloads/command.py); a synthetic or recorded
    workload has none. By its keys, not its kind: the models' stages, which import this module, do
    not hash emo.workloads (tests/test_pipeline.py)."""
    return "command" in workload if isinstance(workload, dict) else hasattr(workload, "command")


def _ncu_results(text: str, with_process: bool = False):
    """Raw metric values per profiled result (range or kernel), in ncu's result-ID order; with
    with_process, (process id, device, metrics) per result."""
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        raise ValueError("ncu output holds no CSV rows (nothing was profiled?)")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    by_id: dict[str, dict[str, float]] = {}
    where: dict[str, tuple[str, str]] = {}
    id_key = next((k for k in ("ID", "Range Name", "Kernel Name") if k in rows[0]), None)
    for r in rows:
        key = r.get(id_key, "0") if id_key else "0"
        where.setdefault(key, (r.get("Process ID") or "0", r.get("Device") or ""))
        val = (r.get("Metric Value") or "").replace(",", "")
        try:
            by_id.setdefault(key, {})[r["Metric Name"]] = float(val)
        except (ValueError, KeyError):
            continue
    keys = sorted(by_id, key=lambda k: int(k)) if all(k.isdigit() for k in by_id) else list(by_id)
    return [(*where[k], by_id[k]) for k in keys] if with_process else [by_id[k] for k in keys]


def parse_ncu_kernels_by_rank(text: str, nproc: int | None) -> list[list[dict[str, float]]]:
    """Counter vectors of kernel-replay results per rank, each in launch order. Ranks are ncu's
    processes ordered by the CUDA device their kernels ran on (torchrun's rank r uses device r),
    ties and missing devices by first result. nproc None: as many ranks as processes ran kernels
    (a launcher's own process runs none)."""
    found: dict[str, list] = {}
    first: dict[str, int] = {}
    device: dict[str, str] = {}
    for i, (pid, dev, metrics) in enumerate(_ncu_results(text, with_process=True)):
        found.setdefault(pid, []).append(_to_counters(metrics))
        first.setdefault(pid, i)
        device.setdefault(pid, dev)
    if nproc is not None and len(found) != nproc:
        raise ValueError(
            f"ncu profiled kernels of {len(found)} processes, but the command has {nproc} ranks "
            "(did every rank reach the profiled iteration?)"
        )
    order = sorted(found, key=lambda p: (int(device[p]) if device[p].isdigit() else 1 << 30, first[p]))
    return [found[p] for p in order]


def compute_indices(r) -> list[int]:
    """The positions of a range's kernels among its rank's profiled (non-NCCL) kernels."""
    import bisect

    nccl = sorted(r.nccl)
    hit = [o for o in r.ordinals if o in set(nccl)]
    if hit:
        raise ValueError(
            f"profile range: rank {r.rank} ordinal {hit[0]} is a NCCL kernel; collectives are not profiled"
        )
    return [o - bisect.bisect_left(nccl, o) for o in r.ordinals]


_to_counters = emo_counters


def parse_ncu_csv(text: str) -> list[dict[str, float]]:
    """Counter vectors, one per profiled result, from `ncu --csv` output (log lines are skipped)."""
    return [_to_counters(m) for m in _ncu_results(text)]


def parse_ncu_kernels(text: str) -> list[dict[str, float]]:
    """Counter vectors of kernel-replay results, in launch order (ncu's ID)."""
    return parse_ncu_csv(text)


def parse_ncu_passes(text: str) -> int:
    """Replay passes, from ncu's '==PROF== Profiling ...: ... - N passes' progress line."""
    import re

    found = [int(m) for m in re.findall(r"- (\d+) pass", text)]
    return max(found) if found else 0


def ncu_profile_microbench_range(
    names: list[str], *, gpu: int = 0, ncu: str = "ncu", timeout_s: float = 600
) -> ProfileResult:
    """Launch the named microbenchmarks as one cuProfilerStart/Stop range under ncu range replay."""
    argv = [sys.executable, "-m", "emo.device.cuda_launch", "--range", ",".join(names)]
    cmd = ncu_command(argv, ncu=ncu, available=ncu_available_metrics(ncu))
    text, cost = _run_ncu(cmd, dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu)), timeout_s)
    return ProfileResult(counters=parse_ncu_csv(text)[0], passes=parse_ncu_passes(text), cost_s=cost)


def _run_ncu(cmd: list[str], env: dict, timeout_s: float = 1800) -> tuple[str, float]:
    """(stdout + stderr, wall seconds) of an ncu run; a clear error when ncu is missing or fails."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except FileNotFoundError as e:
        raise ProfilingUnavailable(f"{cmd[0]}: Nsight Compute not found (install it or put ncu on PATH)") from e
    cost = time.perf_counter() - t0
    if "ERR_NVGPUCTRPERM" in (p.stdout or "") + (p.stderr or ""):
        raise ProfilingUnavailable(
            "ncu: no permission to read GPU performance counters (ERR_NVGPUCTRPERM): run as "
            "root or load the driver with NVreg_RestrictProfilingToAdminUsers=0"
        )
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
        raise GpuAccessError(f"ncu failed ({p.returncode}): {tail[0]}")
    return p.stdout + "\n" + p.stderr, cost


# --------------------------------------------------------------------------- discovery
def gpu_key(model: str) -> str:
    """A config key from NVML's model name: "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-40GB" ->
    "a100_sxm4_40gb", "NVIDIA GeForce RTX 4090" -> "rtx4090"."""
    import re

    s = model.lower()
    for word in ("nvidia", "geforce", "tesla", "quadro"):
        s = s.replace(word, " ")
    s = re.sub(r"\brtx\s+", "rtx", s.strip())
    return re.sub(r"[^a-z0-9]+", "_", s).strip("_") or "gpu"


def discover_gpu_config(nvml=None, index: int = 0) -> dict:
    """A GPU configuration (conf/gpu schema, backend nvml) from what NVML reports about GPU `index`:
    model, supported SM clocks at the highest memory clock, the default (max) clock, the default
    power limit as TDP, the limit range and the driver. Only reads; needs no permission."""
    nvml = nvml or import_pynvml()
    nvml_init(nvml)
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        model = _str(nvml.nvmlDeviceGetName(h))
        mem = max(int(m) for m in nvml.nvmlDeviceGetSupportedMemoryClocks(h))
        clocks = sorted({int(c) for c in nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem)})
        lo, hi = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        tdp = nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0
        driver = _str(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as e:
        raise explain(nvml, e, f"reading GPU {index}") from e
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return {
        "name": gpu_key(model),
        "backend": "nvml",
        "clocks_mhz": clocks,
        "default_mhz": clocks[-1],
        "memory_mhz": mem,
        "tdp_w": tdp,
        "seed": 0,
        "noise": 0.0,
        "physics": {
            "device_name": model,
            "driver": driver,
            "power_limit_min_w": lo / 1000.0,
            "power_limit_max_w": hi / 1000.0,
        },
    }


def gpu_config_yaml(gpu: GpuConfig, keys: Iterable[str]) -> str:
    """The discovered configuration as a conf/gpu/<name>.yaml a user can commit: the fields `keys`
    (what the discovery set; a group file holds only what its choice sets), physics last."""
    import yaml

    p = gpu.physics
    head = (
        f"# {p['device_name']}, discovered from NVML by `emo gpu-config` (driver {p['driver']}).\n"
        f"# Real GPU (backend nvml): the clocks and power limits are what the driver reports; no\n"
        f"# virtual-GPU physics. Board power limit {p['power_limit_min_w']:g}-{p['power_limit_max_w']:g} W.\n"
        "defaults:\n  - gpu_schema\n  - _self_\n\n"
    )
    body = {k: getattr(gpu, k) for k in keys if k != "physics"}
    body["physics"] = dict(p)
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100)
