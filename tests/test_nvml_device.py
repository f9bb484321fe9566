"""emo.device.nvml with a fake `pynvml` (tests/nvml_fake.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emo.device import nvml as nv
from emo.policy import FrequencyPolicy, Step

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class _QuietGuard(nv._RestoreGuard):
    def _install(self):  # no atexit/signal handlers inside pytest; the subprocess test checks those
        self._installed = True


@pytest.fixture(autouse=True)
def fresh_guard(monkeypatch):
    monkeypatch.setattr(nv, "_GUARD", _QuietGuard())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NvmlDevice sets it; keep the test env clean


def _device(monkeypatch, root=True, **kw):
    fake = nvml_fake.install(monkeypatch, **kw)
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0 if root else 1000)
    return fake, nv.NvmlDevice({"name": "a100", "backend": "nvml"})


def test_supported_clocks_at_max_memory_clock(monkeypatch):
    fake, dev = _device(monkeypatch)
    assert dev.supported_clocks() == [210, 705, 900, 1380, 1395, 1410]
    assert ("graphics_clocks", 0, 1593) in fake.calls  # asked at the highest memory clock
    assert dev.default_clock() == 1410
    assert dev.model == "NVIDIA A100-SXM4-40GB" and dev.device_count == 2


def test_lock_then_reset_in_order_and_close_restores(monkeypatch):
    fake, dev = _device(monkeypatch)
    dev.set_policy(FrequencyPolicy.static("a100", 2, 900))
    assert fake.locked == {0: (900, 900), 1: (900, 900)}
    dev.set_policy(None)
    assert fake.locked == {0: None, 1: None}
    control = [c for c in fake.calls if c[0] in ("lock", "reset")]
    assert control == [("lock", 0, 900, 900), ("lock", 1, 900, 900), ("reset", 0), ("reset", 1)]
    dev.set_policy(FrequencyPolicy.static("a100", [1], 705))
    dev.close()
    assert fake.locked[1] is None and fake.calls[-1] == ("shutdown",)


def test_restore_on_exception(monkeypatch):
    fake, dev = _device(monkeypatch)
    with pytest.raises(RuntimeError, match="boom"):
        with dev:
            dev.lock_clock(0, 1395)
            dev.set_power_limit(250)
            raise RuntimeError("boom")
    assert fake.locked[0] is None
    assert fake.limit_mw == {0: 400_000, 1: 400_000}  # back to the default limit
    assert nv._GUARD.pending() == {}


def test_unsupported_clock_and_power_range_are_one_line_errors(monkeypatch):
    fake, dev = _device(monkeypatch)
    with pytest.raises(nv.GpuAccessError, match="1000 MHz is not a supported SM clock"):
        dev.lock_clock(0, 1000)
    with pytest.raises(nv.GpuAccessError, match="outside GPU 0's range 100-400 W"):
        dev.set_power_limit(50)
    assert not [c for c in fake.calls if c[0] in ("lock", "power")]


def test_energy_counter_in_joules_and_measure(monkeypatch):
    fake, dev = _device(monkeypatch)
    e0 = dev.energy_j(1)
    assert dev.energy_j(1) - e0 == pytest.approx(12.345)
    m = dev.measure(lambda: None)
    assert m.energy_j == pytest.approx(2 * 12.345) and m.time_s >= 0


def test_no_permission_names_root_and_zeusd(monkeypatch):
    fake, dev = _device(monkeypatch, root=False, permission=False)
    with pytest.raises(nv.GpuAccessError) as e:
        dev.lock_clock(0, 900)
    msg = str(e.value)
    assert "permission denied" in msg and "zeusd" in msg and "ZEUSD_SOCK_PATH" in msg and "\n" not in msg


def test_locked_clocks_not_supported(monkeypatch):
    fake, dev = _device(monkeypatch, lock_supported=False)
    with pytest.raises(nv.GpuAccessError, match="NOT_SUPPORTED"):
        dev.lock_clock(0, 900)


def test_no_driver_is_a_clear_error(monkeypatch):
    nvml_fake.install(monkeypatch, init_error=nvml_fake._real.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(nv.GpuAccessError, match="no NVIDIA driver or GPU"):
        nv.NvmlDevice({"name": "a100"})


def test_cuda_visible_devices_selects_gpus(monkeypatch):
    fake = nvml_fake.install(monkeypatch, gpus=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert nv.visible_nvml_indices(fake) == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0003")
    assert nv.visible_nvml_indices(fake) == [3]


def test_multi_step_policy_is_not_locked_statically(monkeypatch):
    fake, dev = _device(monkeypatch)
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(5, 900)]}, period_ms=20)
    dev.set_policy(pol)
    assert not [c for c in fake.calls if c[0] == "lock"]
    with pytest.raises(nv.GpuAccessError, match="names device 3"):
        dev.set_policy(FrequencyPolicy.static("a100", [3], 900))


def test_a_host_triggered_policy_is_refused_not_locked_or_timed(monkeypatch):
    from emo.policy import Trigger

    fake, dev = _device(monkeypatch)
    pol = FrequencyPolicy(  # one clock: would otherwise be locked statically, its synchronize lost
        gpu="a100", steps={0: [Step(0, 900), Step(1, 900)]}, meta={"method": "perseus"}, trigger=Trigger(("fwd",), True)
    )
    with pytest.raises(ValueError, match="^perseus policy: a host-triggered policy .* cannot be applied on real GPUs"):
        dev.set_policy(pol)
    assert not [c for c in fake.calls if c[0] == "lock"]


def test_run_rejects_synthetic_workloads(monkeypatch):
    fake, dev = _device(monkeypatch)
    with pytest.raises(ValueError, match="'command' workloads only"):
        dev.run({"kind": "tp"}, 3)


# zeusd: tests/test_zeusd.py, against a fake that follows zeusd 0.5's route table.


# --------------------------------------------------------------------------- reset-clocks
def test_reset_clocks_command(monkeypatch, capsys):
    import argparse

    from emo.cli import reset_clocks as clocks

    fake = nvml_fake.install(monkeypatch, gpus=3)
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    ap = argparse.ArgumentParser()
    clocks.register(ap.add_subparsers())
    args = ap.parse_args(["reset-clocks", "--gpus", "0,2", "--power"])
    assert args.func(args) == 0
    assert [c for c in fake.calls if c[0] in ("reset", "power")] == [
        ("reset", 0),
        ("power", 0, 400000),
        ("reset", 2),
        ("power", 2, 400000),
    ]
    assert "GPU 0, 2" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no GPU 5"):
        clocks.reset_clocks([5])
    with pytest.raises(ValueError, match="comma-separated NVML indices"):
        clocks._parse_gpus("a,b")


# --------------------------------------------------------------------------- signals (subprocess)
_CHILD = textwrap.dedent("""
    import signal, sys, time
    # as a program started from a terminal: a background job (nohup, `&`) inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import nvml_fake
    fake = nvml_fake.FakeNVML(log_path={log!r})
    sys.modules["pynvml"] = fake
    from emo.device.nvml import NvmlDevice
    {pre}
    dev = NvmlDevice({{"name": "a100"}})
    dev.lock_clock(0, 900)
    print("ready", flush=True)
    {body}
""")


def _child(tmp_path, body, pre=""):
    log = tmp_path / "calls.jsonl"
    code = _CHILD.format(tests=str(Path(__file__).parent), log=str(log), body=body, pre=pre)
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    return p, log


def _calls(log):
    return [tuple(json.loads(l)) for l in log.read_text().splitlines()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_restores_clocks_and_keeps_exit_status(tmp_path, sig):
    p, log = _child(tmp_path, "time.sleep(30)")
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(sig)
    p.wait(timeout=20)
    calls = _calls(log)
    assert ["lock", 0, 900, 900] in [list(c) for c in calls]
    assert ("reset", 0) in calls and calls.index(("reset", 0)) > calls.index(("lock", 0, 900, 900))
    if sig == signal.SIGTERM:
        assert p.returncode == -signal.SIGTERM  # died of the signal, as without emo
    else:
        # Python's default: KeyboardInterrupt unwinds, then the process dies of SIGINT
        assert p.returncode == -signal.SIGINT and "KeyboardInterrupt" in p.stderr.read()


def test_previous_sigterm_handler_is_chained(tmp_path):
    pre = "import signal\nsignal.signal(signal.SIGTERM, lambda s, f: (print('user handler', flush=True), sys.exit(3)))"
    p, log = _child(tmp_path, "time.sleep(30)", pre=pre)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    assert "user handler" in out and p.returncode == 3
    assert ("reset", 0) in _calls(log)


def test_normal_exit_and_uncaught_exception_restore(tmp_path):
    for body, rc in (("pass", 0), ("raise SystemExit(4)", 4), ("1/0", 1)):
        p, log = _child(tmp_path, body)
        p.communicate(timeout=20)
        assert p.returncode == rc
        calls = _calls(log)
        assert calls[-1] == ("reset", 0), body
        log.unlink()


def test_run_passes_a_multi_step_policy_to_the_program_and_sums_rank_energy(monkeypatch, tmp_path):
    from emo.device import launcher
    from emo.workloads.command import CommandWorkload

    fake, dev = _device(monkeypatch)
    seen = {}

    def fake_capture(spec, out, policy=None):
        seen.update(spec=spec, policy=policy)
        (out / launcher.SIDECAR).mkdir(parents=True, exist_ok=True)
        wins = []
        for r, e in ((0, 30.0), (1, 34.0)):
            p = out / launcher.window_name(r)
            p.write_text(
                json.dumps(
                    {
                        "rank": r,
                        "iterations": 3,
                        "time_s": 0.3 + r * 0.01,
                        "energy_j": e,
                        "iteration_times_s": [0.1, 0.1, 0.1],
                    }
                )
            )
            wins.append(p)
        return launcher.CaptureResult(0, [out / launcher.trace_name(0), out / launcher.trace_name(1)], wins, 1.0)

    monkeypatch.setattr(launcher, "run_capture", fake_capture)
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(5, 900)], 1: [Step(0, 1410)]}, period_ms=20)
    dev.set_policy(pol)
    wl = CommandWorkload(command=["python", "train.py"], nproc=2, wait=4, warmup=1, active=5)
    rr = dev.run(wl, 3, warmup=2, trace_dir=tmp_path)
    assert (seen["spec"].active, seen["spec"].warmup, seen["spec"].nproc) == (3, 2, 2)
    assert seen["policy"] == tmp_path / launcher.SIDECAR / "policy.json"
    assert FrequencyPolicy.load(seen["policy"]).steps == pol.steps
    assert rr.energy_j == 64.0 and rr.energy_per_device_j == {0: 30.0, 1: 34.0}
    assert rr.time_s == pytest.approx(0.31) and rr.iterations == 3
    dev.set_policy(FrequencyPolicy.static("a100", 2, 900))  # static: locked here, no policy file
    seen.clear()
    dev.run(wl, 3, trace_dir=tmp_path / "b")
    assert seen["policy"] is None and fake.locked[0] == (900, 900)


def test_utilization_is_the_mean_of_samples_taken_during_the_last_run(monkeypatch):
    fake, dev = _device(monkeypatch)
    assert dev.utilization(0) == {"gpu": 0.07, "memory": 0.03}  # no run yet: NVML's last period
    dev._last_run_us = (1000.0, 2000.0)
    fake.samples = {
        fake.NVML_MEMORY_UTILIZATION_SAMPLES: [(900, 5), (1100, 40), (1900, 80), (2100, 1)],
        fake.NVML_GPU_UTILIZATION_SAMPLES: [(1500, 90)],
    }
    assert dev.utilization(0) == {"gpu": 0.9, "memory": pytest.approx(0.6)}


def test_utilization_samples_are_nvmls_own_samples_inside_the_last_run(monkeypatch):
    fake, dev = _device(monkeypatch)
    assert dev.utilization_samples(0) == {"gpu": [], "memory": []}  # no run yet
    dev._last_run_us = (1000.0, 2000.0)
    fake.samples = {
        fake.NVML_MEMORY_UTILIZATION_SAMPLES: [(900, 5), (1900, 80), (1100, 40), (2100, 1)],
        fake.NVML_GPU_UTILIZATION_SAMPLES: [(1500, 90)],
    }
    got = dev.utilization_samples(0)
    assert got["memory"] == [
        (pytest.approx(1100e-6), 0.4),
        (pytest.approx(1900e-6), 0.8),
    ]  # oldest first, % -> fraction
    assert got["gpu"] == [(pytest.approx(1500e-6), 0.9)]
