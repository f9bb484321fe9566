"""A stand-in for the `pynvml` module (nvidia-ml-py), used only at that boundary in tests.

It keeps the real module's NVMLError classes and constants, simulates N GPUs with supported clocks,
locked clocks, power limits and an energy counter, and records every call in `calls` (and, when
`log_path` is set, appends each call as a line, so a test can read what a killed subprocess did; with
`stamp`, each call ends with its time.monotonic(), which every process on the machine shares).
"""

from __future__ import annotations

import json
import time
import types

import pynvml as _real

MEM_CLOCKS = [1593, 810]  # unsorted on purpose
GRAPHICS = {1593: [1410, 1395, 1380, 900, 705, 210], 810: [810, 705, 210]}


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
        self.sm_clock = {i: max(GRAPHICS[MEM_CLOCKS[0]]) for i in range(gpus)}
        self.landing: dict[int, tuple[int, float]] = {}  # GPU -> (clock, when it shows)

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
        return list(GRAPHICS[mem])

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_mj[h[1]] += 12_345  # each read sees 12.345 J more
        return self.energy_mj[h[1]]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        return (100_000, 400_000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 400_000

    def nvmlSystemGetDriverVersion(self):
        return "580.65.06"

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        if clock_type != _real.NVML_CLOCK_SM:
            return max(GRAPHICS[MEM_CLOCKS[0]])
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
        self._request(h[1], max(GRAPHICS[MEM_CLOCKS[0]]))

    def nvmlDeviceSetPowerManagementLimit(self, h, mw):
        self._privileged()
        self._log("power", h[1], mw)
        self.limit_mw[h[1]] = mw


def install(monkeypatch, **kw) -> FakeNVML:
    """Patch a FakeNVML in for `pynvml` for one test."""
    import sys

    fake = FakeNVML(**kw)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


FAKE_ENV = "EMO_FAKE_NVML"  # JSON keyword arguments of FakeNVML, for a process the test does not run itself


def from_env() -> FakeNVML:
    """The fake the clock owner uses in tests (EMO_CLOCK_OWNER_NVML=nvml_fake:from_env)."""
    import os

    return FakeNVML(**json.loads(os.environ.get(FAKE_ENV, "{}")))


def owner_env(log_path=None, **kw) -> dict:
    """Environment under which a process's clock owner (emo.device.clock_owner) uses a FakeNVML(**kw)
    that logs its calls to log_path: merge it into a subprocess's env, or monkeypatch it in."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {
        "EMO_CLOCK_OWNER_NVML": "nvml_fake:from_env",
        "PYTHONPATH": path,
        FAKE_ENV: json.dumps({**kw, "log_path": None if log_path is None else str(log_path)}),
    }


def read_log(path) -> list[tuple]:
    """The calls a FakeNVML logged to `path` (none if it was never written)."""
    import os

    if not os.path.exists(path):
        return []
    return [tuple(json.loads(ln)) for ln in open(path).read().splitlines() if ln.strip()]


class Owned:
    """The in-process fake (what this process reads) and its clock owner's fake (the calls that set
    and reset clocks, made by the owner process and read from its log) seen as one `calls` list."""

    def __init__(self, fake: FakeNVML, log):
        self.fake, self.log = fake, log

    @property
    def calls(self) -> list[tuple]:
        return [*self.fake.calls, *read_log(self.log)]

    def __getattr__(self, name):
        return getattr(self.fake, name)


def install_owned(monkeypatch, log_path, **kw):
    """install() plus a fresh clock owner for this test whose own FakeNVML(**kw) logs to log_path.
    Yields the Owned view; closes the owner afterwards (use from a fixture: `yield from`)."""
    from emo.device import clock_owner

    fake = install(monkeypatch, **kw)
    for k, v in owner_env(log_path, **kw).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(clock_owner, "_OWNER", None)
    yield Owned(fake, log_path)
    if clock_owner._OWNER is not None:
        clock_owner._OWNER.close()


def for_loop_api(monkeypatch, log_path, gpus: int):
    """install_owned plus what the training-loop API's tests share: no restore handlers inside pytest,
    root (NVML directly), no launcher's rank variables, no policy applied yet. A fixture's body:
    `yield from nvml_fake.for_loop_api(...)`."""
    from emo import loop
    from emo.device import nvml as nv

    owned = install_owned(monkeypatch, log_path, gpus=gpus)
    fake = next(owned)
    guard = type(nv._GUARD)()
    monkeypatch.setattr(nv, "_GUARD", guard)
    monkeypatch.setattr(guard, "_install", lambda: setattr(guard, "_installed", True))
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(loop, "_ACTIVE", None)
    yield fake
    next(owned, None)  # closes the clock owner
