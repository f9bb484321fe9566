"""A stand-in for the `pynvml` module (nvidia-ml-py): N NVIDIA A100s with supported clocks, locked
clocks, power limits and an energy counter, behind the real module's NVMLError classes and constants.

Two users: the tests (tests/nvml_fake.py patches it in, every call recorded in `calls`, and, with
`log_path`, appended as a JSON line so a test can read what a killed subprocess did; with `stamp`,
each call ends with its time.monotonic(), which every process on the machine shares), and a person
without a GPU trying the GPU path: `EMO_FAKE_GPU=N` makes every EMO process (the command, the clock
owner, each rank of the job, which inherit the variable) talk to N fake GPUs instead of NVML
(emo.device.nvml.import_pynvml). Its clocks are NVML's answers, not a simulation: a locked clock
lands at once (each process has its own fake, so a clock the owner locks is not seen by a rank's
reads) and the energy counter integrates a made-up power curve over wall time. docs/gpu.md, "Trying
it without a GPU".
"""

from __future__ import annotations

import json
import os
import time
import types

import pynvml as _real

from emo.errors import ConfigError

FAKE_GPU_ENV = "EMO_FAKE_GPU"  # N: every EMO process talks to N fake GPUs
FAKE_GPU_LOG_ENV = "EMO_FAKE_GPU_LOG"  # a file each process appends its NVML calls to (one JSON line each)


MEM_CLOCKS = [1593, 810]  # unsorted on purpose
GRAPHICS = {1593: [1410, 1395, 1380, 900, 705, 210], 810: [810, 705, 210]}  # the tests' (their assertions name these)
# EMO_FAKE_GPU's A100s answer an A100's SM clocks (conf/gpu/a100.yaml, every 15 MHz), so that a policy
# `emo run` planned for gpu=a100 applies to them as to the real GPU
A100_GRAPHICS = {1593: list(range(1410, 209, -15)), 810: [810, 705, 210]}


class FakeNVML(types.ModuleType):
    def __init__(
        self,
        gpus: int = 2,
        *,
        permission: bool = True,
        lock_supported: bool = True,
        init_error: int | None = None,
        log_path: str | None = None,
        clock_delay_ms=0.0,
        now=None,
        stamp: bool = False,
        power_w=None,
        graphics: dict[int, list[int]] | None = None,
    ):
        super().__init__("pynvml")
        for k in dir(_real):
            if k.startswith("NVML_") or k.startswith("NVMLError"):
                setattr(self, k, getattr(_real, k))
        self.gpus, self.permission, self.lock_supported = gpus, permission, lock_supported
        self.init_error, self.log_path = init_error, log_path
        self.stamp = stamp  # end each logged call with time.monotonic() (one clock for all processes)
        self.calls: list[tuple] = []
        self.locked: dict[int, tuple[int, int] | None] = {i: None for i in range(gpus)}
        self.limit_mw = {i: 400_000 for i in range(gpus)}
        self.energy_mj = {i: 1_000_000 for i in range(gpus)}
        self.samples: dict[int, list[tuple[float, int]]] = {}  # sampling type -> [(timestamp us, %)]
        # a locked SM clock shows in reads clock_delay_ms (a number, or f(from, to)) after the request,
        # on the clock `now()` (seconds; default the wall clock)
        self.clock_delay_ms, self.now = clock_delay_ms, now or time.perf_counter
        self.graphics = graphics or GRAPHICS  # memory clock -> supported SM clocks
        self.sm_clock = {i: max(self.graphics[MEM_CLOCKS[0]]) for i in range(gpus)}
        self.landing: dict[int, tuple[int, float]] = {}  # GPU -> (clock, when it shows)
        # power_w(sm_mhz) -> watts: the energy counter integrates it over wall time (EMO_FAKE_GPU);
        # None: each read adds a fixed 12.345 J (the tests' arithmetic)
        self.power_w, self._read_at = power_w, {i: time.perf_counter() for i in range(gpus)}

    def _log(self, *call) -> None:
        if self.stamp:
            call = (*call, time.monotonic())
        self.calls.append(call)
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(call) + "\n")

    def _privileged(self) -> None:
        if not self.permission:
            raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)

    # -- lifecycle and reads
    def nvmlInit(self):
        self._log("init")
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self._log("shutdown")

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.gpus:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return ("handle", i)

    def nvmlDeviceGetName(self, h):
        return "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h[1]:04d}"

    def nvmlDeviceGetSupportedMemoryClocks(self, h):
        self._log("mem_clocks", h[1])
        return list(MEM_CLOCKS)

    def nvmlDeviceGetSupportedGraphicsClocks(self, h, mem):
        self._log("graphics_clocks", h[1], mem)
        return list(self.graphics[mem])

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        i = h[1]
        if self.power_w is None:
            self.energy_mj[i] += 12_345  # each read sees 12.345 J more
        else:
            now = time.perf_counter()
            clock = self.nvmlDeviceGetClockInfo(h, _real.NVML_CLOCK_SM)
            self.energy_mj[i] += int(1000 * self.power_w(clock) * (now - self._read_at[i]))
            self._read_at[i] = now
        return self.energy_mj[i]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        return (100_000, 400_000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 400_000

    def nvmlSystemGetDriverVersion(self):
        return "580.65.06"

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        if clock_type != _real.NVML_CLOCK_SM:
            return max(self.graphics[MEM_CLOCKS[0]])
        i = h[1]
        if i in self.landing and self.now() >= self.landing[i][1]:
            self.sm_clock[i] = self.landing.pop(i)[0]
        return self.sm_clock[i]

    def _request(self, i: int, mhz: int) -> None:
        d = self.clock_delay_ms
        delay = d(self.sm_clock[i], mhz) if callable(d) else d
        self.landing[i] = (mhz, self.now() + delay * 1e-3)

    def nvmlDeviceGetSamples(self, h, kind, since_us):
        # (timestamp us, value %): memory utilisation 40 % then 80 %, GPU utilisation 90 %
        data = self.samples.get(kind, [])
        return (
            _real.NVML_VALUE_TYPE_UNSIGNED_INT,
            [
                types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=v))
                for t, v in data
                if t >= since_us
            ],
        )

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=7, memory=3)

    # -- control
    def nvmlDeviceSetGpuLockedClocks(self, h, lo, hi):
        self._privileged()
        if not self.lock_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        self._log("lock", h[1], lo, hi)
        self.locked[h[1]] = (lo, hi)
        self._request(h[1], hi)

    def nvmlDeviceResetGpuLockedClocks(self, h):
        self._privileged()
        self._log("reset", h[1])
        self.locked[h[1]] = None
        self._request(h[1], max(self.graphics[MEM_CLOCKS[0]]))

    def nvmlDeviceSetPowerManagementLimit(self, h, mw):
        self._privileged()
        self._log("power", h[1], mw)
        self.limit_mw[h[1]] = mw


def fake_power_w(sm_mhz: float) -> float:
    """A made-up A100-like curve (60 W idle, 400 W at 1410 MHz, cubic in the clock): enough for
    emo.measure's joules to move with the clock; no measurement stands behind it."""
    return 60.0 + 340.0 * (sm_mhz / 1410.0) ** 3


_PROCESS: list[FakeNVML] = []


def from_fake_gpu_env() -> FakeNVML:
    """This process's fake GPUs for EMO_FAKE_GPU=N (one per process, made on first use)."""
    if not _PROCESS:
        raw = os.environ.get(FAKE_GPU_ENV, "1")
        if not raw.isdigit() or not 1 <= int(raw) <= 64:
            raise ConfigError(f"{FAKE_GPU_ENV}={raw}: the number of fake GPUs, 1 to 64")
        log = os.environ.get(FAKE_GPU_LOG_ENV)
        _PROCESS.append(FakeNVML(int(raw), log_path=log, power_w=fake_power_w, graphics=A100_GRAPHICS))
    return _PROCESS[0]
