"""benchmarks/gpu_check.py without a GPU, its pipeline configuration with a fake NVML, and the
hardware tests (marked gpu; skipped where NVML finds no GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def _gpu_reason() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return None if pynvml.nvmlDeviceGetCount() > 0 else "NVML sees no GPU"
    except Exception as e:  # no library, no driver
        return f"no NVIDIA GPU here ({e})"


NO_GPU = _gpu_reason()
needs_gpu = pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(NO_GPU is None, reason="a GPU is present: the script would run for minutes")
def test_without_a_gpu_it_exits_at_once_with_status_77():
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 77
    assert "no NVIDIA GPU to check" in p.stdout and "skipped" in p.stdout


def test_pipeline_overrides_compose_into_an_nvml_command_config(monkeypatch, tmp_path):
    from emo.device import nvml as nv
    from emo.workflow.plan import compose

    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    nvml_fake.install(monkeypatch)
    dev = nv.NvmlDevice({"name": "gpu"})
    ov = _load()._gpu_overrides(dev, tmp_path / "train.py", tmp_path / "results")
    cfg = compose(ov)
    assert cfg["gpu"]["backend"] == "nvml" and cfg["gpu"]["clocks_mhz"] == dev.supported_clocks()
    assert cfg["gpu"]["default_mhz"] == 1410 and cfg["gpu"]["tdp_w"] == 400
    assert cfg["workload"]["kind"] == "command"
    assert cfg["workload"]["command"] == [sys.executable, str(tmp_path / "train.py")]
    assert cfg["model"]["clocks_stride"] == 1  # 6 clocks: all of them
    assert cfg["results"] == str(tmp_path / "results")


# --------------------------------------------------------------------------- hardware
@pytest.mark.gpu
@needs_gpu
def test_nvml_reads_on_hardware():
    from emo.device.nvml import NvmlDevice

    with NvmlDevice({"name": "gpu"}) as dev:
        clocks = dev.supported_clocks()
        assert clocks == sorted(clocks) and len(clocks) > 3
        e0 = dev.energy_j(0)
        assert dev.energy_j(0) >= e0 > 0


@pytest.mark.gpu
@needs_gpu
def test_lock_and_microbenchmark_on_hardware():
    from emo.device.nvml import GpuAccessError, NvmlDevice

    with NvmlDevice({"name": "gpu"}) as dev:
        try:
            dev.lock_clock(0, dev.supported_clocks()[-1])
        except GpuAccessError as e:
            pytest.skip(f"clocks cannot be locked here: {e}")
        m = dev.run_microbenchmark("fp32_fma_high", dev.supported_clocks()[-1], min_seconds=1.0)
        assert m.time_s > 0 and m.energy_j > 0


def test_hardware_sections_run_against_fakes(monkeypatch, capsys):
    """Sections 1-3 of gpu_check with a fake pynvml and a fake CUDA driver: no attribute or flow
    error waits for the first GPU."""
    from test_nvml_launch import FakeDriver, FakeNvrtc

    from emo.device import cuda_launch as cl
    from emo.device import nvml as nv

    mod = _load()
    fake = nvml_fake.install(monkeypatch)
    monkeypatch.setattr(cl, "import_cuda", lambda: (FakeDriver(), FakeNvrtc()))
    monkeypatch.setattr(cl, "_CONTEXTS", {})
    monkeypatch.setattr(cl, "_BENCHES", {})
    monkeypatch.setattr(nv, "_GUARD", type(nv._GUARD)())
    monkeypatch.setattr(nv._RestoreGuard, "_install", lambda self: setattr(self, "_installed", True))
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    monkeypatch.setattr(mod.time, "sleep", lambda s: None)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    dev = nv.NvmlDevice({"name": "gpu"})
    check = mod.Check(60)
    reads = check.run("reads", lambda: mod.nvml_reads(dev))
    assert reads["sm_clocks_mhz"] == "6 clocks, 210-1410" and reads["driver"] == "580.65.06"
    lock = check.run("lock", lambda: mod.locked_clocks(dev))
    assert lock["locked_mhz"] == 1380 and lock["sm_clock_while_locked"] == 1380 and lock["via"] == "nvml"
    mb = check.run("mb", lambda: mod.microbenchmarks(dev, ["fp32_fma_high"]))
    assert [k for k in mb if "@" in k] == ["fp32_fma_high@900", "fp32_fma_high@1395", "fp32_fma_high@1410"]
    dev.close()
    assert all(v is None for v in fake.locked.values())
    assert "[PASS] mb" in capsys.readouterr().out
