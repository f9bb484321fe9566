"""The clock-request latency: measured through the device protocol (NVML through tests/nvml_fake.py),
stored by calibrate, and planned with by optimize (issue 11 item 2)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from emo.device import nvml as nv

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402


class VirtualTime:
    """perf_counter and sleep on one virtual clock, shared with the fake NVML's landing clock."""

    def __init__(self):
        self.t = 100.0

    def perf_counter(self):
        return self.t

    def sleep(self, s):
        assert s >= 0
        self.t += s

    def time(self):
        return self.t


@pytest.fixture
def nvml_device(monkeypatch):
    class Quiet(nv._RestoreGuard):
        def _install(self):
            self._installed = True

    monkeypatch.setattr(nv, "_GUARD", Quiet())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    vt = VirtualTime()
    monkeypatch.setattr(nv, "time", vt)

    def make(delay):
        fake = nvml_fake.install(monkeypatch, clock_delay_ms=delay, now=vt.perf_counter)
        return fake, nv.NvmlDevice({"name": "a100", "backend": "nvml"})
    return make


def test_nvml_times_each_step_until_the_clock_reads_it(nvml_device):
    # up-steps land in 7.3 ms, down-steps in 21.6 ms: each is resolved to the next 1 ms read
    fake, dev = nvml_device(lambda a, b: 7.3 if b > a else 21.6)
    got = dev.clock_step_latencies_ms([(705, 1410), (1410, 210), (900, 1395)], poll_ms=1.0)
    assert got == pytest.approx([8.0, 22.0, 8.0])
    locks = [c[2] for c in fake.calls if c[0] == "lock"]
    assert locks == [705, 1410, 1410, 210, 900, 1395]  # from, then to, for every pair
    assert fake.locked[0] == (1395, 1395) and fake.sm_clock[0] == 1395
    dev.close()
    assert fake.locked[0] is None  # close restores


def test_nvml_poll_period_sets_the_resolution(nvml_device):
    _, dev = nvml_device(7.3)
    assert dev.clock_step_latencies_ms([(705, 1410)], poll_ms=5.0) == pytest.approx([10.0])
    assert dev.clock_step_latencies_ms([(705, 1410)], poll_ms=0.5) == pytest.approx([7.5])


def test_nvml_clock_that_never_lands_is_one_clear_error(nvml_device):
    _, dev = nvml_device(1e9)
    with pytest.raises(nv.GpuAccessError, match=r"did not reach 705 MHz within \d+ reads"):
        dev.clock_step_latencies_ms([(705, 1410)], poll_ms=1.0)


def test_nvml_rejects_unsupported_clock_and_bad_poll(nvml_device):
    _, dev = nvml_device(1.0)
    with pytest.raises(nv.GpuAccessError, match="1000 MHz is not a supported SM clock"):
        dev.clock_step_latencies_ms([(1000, 1410)], poll_ms=1.0)
    with pytest.raises(ValueError, match="poll_ms"):
        dev.clock_step_latencies_ms([(705, 1410)], poll_ms=0)
