"""The CUDA launch path with fakes at the cuda-python boundary (driver + NVRTC) and at pynvml:
what is compiled for which architecture, what cuLaunchKernel receives, and how run_microbenchmark
sizes its loop to span >= 1 s and reports per-launch time and energy."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from emo.device import cuda_launch as cl
from emo.device import nvml as nv

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402


class FakeDriver:
    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT="sms",
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR="tpsm",
    )

    def __init__(self, ms_per_launch=1.0):
        self.calls, self.launches, self.allocs = [], [], []
        self.ms_per_launch = ms_per_launch
        self._events = {}

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, i):
        return (0, f"dev{i}")

    def cuDevicePrimaryCtxRetain(self, d):
        return (0, "ctx")

    def cuCtxSetCurrent(self, c):
        return (0,)

    def cuDeviceGetAttribute(self, attr, d):
        return (0, {"major": 9, "minor": 0, "sms": 132, "tpsm": 2048}[attr])

    def cuStreamCreate(self, f):
        return (0, "stream")

    def cuStreamSynchronize(self, s):
        self.calls.append("sync")
        return (0,)

    def cuModuleLoadData(self, image):
        self.calls.append(("load", image))
        return (0, "module")

    def cuModuleGetFunction(self, m, name):
        self.calls.append(("function", name))
        return (0, f"fn:{name.decode()}")

    def cuMemAlloc(self, n):
        self.allocs.append(n)
        return (0, 0x1000 * len(self.allocs))

    def cuMemsetD8(self, p, v, n):
        return (0,)

    def cuMemFree(self, p):
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        self.launches.append((f, (gx, gy, gz), (bx, by, bz), smem, stream, args))
        return (0,)

    def cuEventCreate(self, f):
        e = f"ev{len(self._events)}"
        self._events[e] = None
        return (0, e)

    def cuEventRecord(self, e, s):
        self._events[e] = len(self.launches)
        return (0,)

    def cuEventSynchronize(self, e):
        return (0,)

    def cuEventElapsedTime(self, a, b):
        return (0, (self._events[b] - self._events[a]) * self.ms_per_launch)


class FakeNvrtc:
    def __init__(self):
        self.options = None

    def nvrtcCreateProgram(self, src, name, n, h, i):
        return (0, ("prog", name))

    def nvrtcCompileProgram(self, prog, n, opts):
        self.options = opts
        return (0,)

    def nvrtcGetCUBINSize(self, p):
        return (0, 4)

    def nvrtcGetCUBIN(self, p, buf):
        return (0,)


@pytest.fixture
def fake_cuda(monkeypatch):
    drv, rtc = FakeDriver(), FakeNvrtc()
    monkeypatch.setattr(cl, "import_cuda", lambda: (drv, rtc))
    monkeypatch.setattr(cl, "_CONTEXTS", {})
    monkeypatch.setattr(cl, "_BENCHES", {})
    return drv, rtc


def test_compile_for_the_device_arch_and_launch_with_registry_arguments(fake_cuda):
    drv, rtc = fake_cuda
    b = cl.microbenchmark("dram_read_high")
    assert b"--gpu-architecture=sm_90" in rtc.options
    assert ("function", b"emo_dram_read") in drv.calls
    assert drv.allocs == [1 << 30, 4194304]  # buf and out, as the registry sizes them
    b.run(3)
    assert len(drv.launches) == 3 and drv.calls[-1] == "sync"
    fn, grid, block, smem, stream, (values, types) = drv.launches[0]
    assert (fn, grid, block, smem, stream) == ("fn:emo_dram_read", (4096, 1, 1), (256, 1, 1), 0, "stream")
    assert values == (0x1000, 67108864, 0x2000, -3e38, 16)
    assert types == (None, ctypes.c_ulonglong, None, ctypes.c_float, ctypes.c_int)
    assert cl.microbenchmark("dram_read_high") is b  # compiled and allocated once
    assert b.time_one(repeats=5) == pytest.approx(0.001)


def test_low_occupancy_variant_passes_its_dynamic_shared_memory(fake_cuda):
    drv, _ = fake_cuda
    cl.microbenchmark("fp32_fma_low").run(1)
    assert drv.launches[0][3] == 40960 and drv.launches[0][2] == (128, 1, 1)


def test_run_microbenchmark_locks_the_clock_and_spans_a_second(fake_cuda, monkeypatch):
    drv, _ = fake_cuda
    fake = nvml_fake.install(monkeypatch)
    monkeypatch.setattr(nv, "_GUARD", type(nv._GUARD)())
    monkeypatch.setattr(nv._RestoreGuard, "_install", lambda self: setattr(self, "_installed", True))
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    dev = nv.NvmlDevice({"name": "a100"})
    m = dev.run_microbenchmark("fp32_fma_high", 900, min_seconds=1.0)
    assert ("lock", 0, 900, 900) in fake.calls
    # 3 warm-up + 5 timed launches, then ceil(1 s / 1 ms) = 1000 measured ones
    assert len(drv.launches) == 3 + 5 + 1000
    assert m.sm_mhz == 900 and m.energy_j == pytest.approx(12.345 / 1000)  # one counter delta / n
    assert m.time_s > 0
    dev.close()
    assert fake.locked[0] is None


def test_a_missing_driver_is_a_clear_error(monkeypatch):
    class NoLib(FakeDriver):
        def cuInit(self, flags):
            raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(cl, "import_cuda", lambda: (NoLib(), FakeNvrtc()))
    monkeypatch.setattr(cl, "_CONTEXTS", {})
    with pytest.raises(RuntimeError, match="no CUDA driver on this machine"):
        cl.microbenchmark("idle")


def test_cuda_error_codes_raise():
    with pytest.raises(RuntimeError, match="CUDA call failed: 2"):
        cl.check((2, None))
    assert cl.check((0, 5)) == 5 and cl.check((0,)) is None and cl.check((0, 1, 2)) == (1, 2)
