"""benchmarks/gpu_observe.py (gpu_check.py --observe): a dry run of the whole check against the NVML
fake, a fake CUDA driver and a fake Nsight Compute, in which no call that changes the GPU is ever
made; its training analysis on the virtual GPU; the applier's record mode."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_observe", REPO / "benchmarks" / "gpu_observe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_privileged_nvml_function_is_refused_and_reads_pass(monkeypatch):
    import pynvml

    mod = _load()
    fake = nvml_fake.install(monkeypatch)
    guarded = mod.guard_nvml()
    assert sys.modules["pynvml"] is guarded and mod.guard_nvml() is guarded  # idempotent
    changing = [
        n
        for n in dir(pynvml)
        if n.startswith("nvml")
        and any(
            w in n
            for w in (
                "SetGpuLockedClocks",
                "ResetGpuLockedClocks",
                "SetPowerManagementLimit",
                "SetPersistenceMode",
                "SetComputeMode",
                "SetMigMode",
                "SetApplicationsClocks",
                "ResetApplicationsClocks",
                "SetMemoryLockedClocks",
                "ClearEccErrorCounts",
            )
        )
    ]
    assert len(changing) >= 10
    for name in changing:
        with pytest.raises(mod.ObserveViolation, match=name):
            getattr(guarded, name)(("handle", 0), 1, 1)
    assert guarded.refused == changing
    for name in (
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetSupportedGraphicsClocks",
    ):
        assert not mod.PRIVILEGED.match(name)
    assert guarded.nvmlDeviceGetName(("handle", 0)) == "NVIDIA A100-SXM4-40GB"  # reads reach NVML
    assert not [c for c in fake.calls if c[0] in ("lock", "reset", "power")]


def _ncu_csv(n: int) -> str:
    """ncu --csv kernel-replay output for n kernels: kernel i has unit i's utilisation at 90 %."""
    mod = _load()
    units = list(mod.UNIT_METRICS.values())
    head = '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
    rows = []
    for i in range(n):
        vals = {
            "sm__cycles_active.sum": 1000 + i,
            "sm__warps_active.avg.pct_of_peak_sustained_active": 50,
            "dram__bytes_read.sum": 10 * i,
            **{u: (90 if j == i % len(units) else 5) for j, u in enumerate(units)},
        }
        rows += [f'"{i}","7","k{i}","{m}","x","{v}"' for m, v in vals.items()]
    return '==PROF== Profiling "k": 0%....100% - 12 passes\n' + "\n".join([head, *rows]) + "\n"


def test_dry_run_of_the_whole_check_never_changes_the_gpu(monkeypatch, tmp_path, capsys):
    from test_nvml_launch import FakeDriver, FakeNvrtc

    from emo.device import cuda_launch as cl
    from emo.device import nvml as nv

    mod = _load()
    fake = nvml_fake.install(monkeypatch)
    monkeypatch.setattr(cl, "import_cuda", lambda: (FakeDriver(ms_per_launch=0.5), FakeNvrtc()))
    monkeypatch.setattr(cl, "_CONTEXTS", {})
    monkeypatch.setattr(cl, "_BENCHES", {})
    monkeypatch.setattr(nv, "_GUARD", type(nv._GUARD)())
    monkeypatch.setattr(nv._RestoreGuard, "_install", lambda self: setattr(self, "_installed", True))
    monkeypatch.setattr(mod, "MIN_BENCH_S", 0.01)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    names = ["idle", "fp32_fma_high", "dram_read_high", "hmma_bf16_high"]
    seen = {}

    def fake_ncu(cmd, env, timeout_s=1800):
        seen["cmd"] = cmd
        return _ncu_csv(len(names)), 3.0

    monkeypatch.setattr(nv, "_run_ncu", fake_ncu)
    monkeypatch.setattr(mod, "ENERGY_PROBE_S", 0.02)
    busy = []

    def no_cuda_training(dev, bench, out, work, log):
        # the GPT loop needs CUDA; its analysis is tested on the virtual GPU below
        assert list(bench["bench"]) == names and bench["sm_mhz"].nunique() == 1
        raise RuntimeError("train_gpt: no CUDA device")

    monkeypatch.setattr(mod, "training", no_cuda_training)
    out = tmp_path / "out"
    compile(mod.TRAIN, "train_gpt.py", "exec")  # the GPT loop itself needs CUDA: at least it parses
    rc = mod.main(str(out), 600, busy=lambda s: busy.append(s) or (lambda: busy.append("waited")), names=names)
    summary = json.loads((out / "summary.json").read_text())
    assert [k for k, v in summary.items() if v.get("status") == "PASS"] == [
        "1a. discovery (emo gpu-config)",
        "1b. NVML energy counter",
        "2. microbenchmarks at the current clock",
    ]
    assert summary["3. GPT training step: trace, graph, packs, counters, prediction vs NVML"]["status"] == "FAIL"
    assert rc == 1
    # never a call that changes the GPU: not refused by the guard, not seen by the fake
    assert summary["observe_only"]["privileged_nvml_calls_refused"] == []
    assert not [c for c in fake.calls if c[0] in ("lock", "reset", "power")]
    assert all(v is None for v in fake.locked.values()) and set(fake.limit_mw.values()) == {400_000}
    cmd = seen["cmd"]
    assert cmd[cmd.index("--clock-control") + 1] == "none" and cmd[cmd.index("--replay-mode") + 1] == "kernel"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" in cmd[cmd.index("--metrics") + 1]
    assert summary["2. microbenchmarks at the current clock"]["counters"]["metrics_this_gpu_lacks"] == "none"
    mb = summary["2. microbenchmarks at the current clock"]
    assert mb["arch"] == "sm_90" and mb["benchmarks"] == 4 and mb["sm_mhz_seen"] == [1410]
    assert mb["busiest_unit_is_the_claimed_one"] == "1 of 3"  # fake: kernel i busiest on unit i (int32, fp32, ...)
    assert busy == [pytest.approx(0.52), "waited"]  # the GPU was kept busy while the counter was polled
    files = sorted(p.name for p in out.iterdir())
    assert files == ["energy_counter.csv", "gpu.yaml", "log.txt", "microbench.csv", "ncu_bench.txt", "summary.json"]
    assert "h200" not in (out / "gpu.yaml").read_text() and "a100_sxm4_40gb" in (out / "gpu.yaml").read_text()
    assert "[PASS] 2. microbenchmarks" in capsys.readouterr().out


def test_a_set_call_fails_the_check(monkeypatch, tmp_path):
    """The guard is not only a filter: a section that tries to lock a clock fails and so does the run."""
    from emo.device import nvml as nv

    mod = _load()
    fake = nvml_fake.install(monkeypatch)
    monkeypatch.setattr(nv, "_GUARD", type(nv._GUARD)())
    monkeypatch.setattr(nv._RestoreGuard, "_install", lambda self: setattr(self, "_installed", True))
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setattr(mod, "discovery", lambda dev, out: dev.lock_clock(0, 1410))
    monkeypatch.setattr(mod, "energy_counter", lambda dev, busy, out: {})
    monkeypatch.setattr(mod, "microbenchmarks", lambda *a: (_ for _ in ()).throw(RuntimeError("skip")))
    rc = mod.main(str(tmp_path / "o"), 600, busy=None, names=["idle"])
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert rc == 1 and summary["observe_only"]["privileged_nvml_calls_refused"] == ["nvmlDeviceSetGpuLockedClocks"]
    assert "refused" in summary["1a. discovery (emo gpu-config)"]["error"]
    assert not [c for c in fake.calls if c[0] in ("lock", "reset", "power")]


def test_without_a_gpu_the_observe_check_exits_77(tmp_path):
    import subprocess

    from test_nvml_gpu_check import NO_GPU

    if NO_GPU is None:
        pytest.skip("a GPU is present: the check would run for minutes")
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--observe", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert p.returncode == 77, p.stderr
    assert "no NVIDIA GPU to observe" in p.stdout and (tmp_path / "o" / "log.txt").exists()


def test_energy_counter_updates_period_and_resolution():
    mod = _load()
    # a counter that updates every 20 ms by 5 J (250 W), read every 1 ms
    samples = [(i * 1e-3, 1000.0 + 5.0 * ((i + 7) // 20)) for i in range(2000)]
    r = mod.energy_updates(samples)
    assert r["update_period_ms"]["median"] == pytest.approx(20.0)
    assert r["smallest_step_mj"] == pytest.approx(5000.0) and r["power_w"] == pytest.approx(250.0)
    with pytest.raises(ValueError, match="changed 0 times"):
        mod.energy_updates([(i * 1e-3, 5.0) for i in range(100)])


def test_training_analysis_on_the_virtual_gpu(tmp_path):
    """Section 3's analysis (trace -> graph -> packs -> counters -> prediction at one clock from a
    one-clock calibration) through the device protocol, on the virtual GPU."""
    import pandas as pd

    from emo.device.backends import open_device
    from emo.workflow.plan import compose

    mod = _load()
    cfg = compose(["workload=tp", "workload.tp=2", "workload.model.layers=1", "tracking.enabled=false"])
    dev = open_device(cfg["gpu"])
    names = ["idle", "fp32_fma_high", "dram_read_high", "hmma_f16_high", "l2_high", "int32_high"]
    mhz = dev.default_clock()
    rows = []
    for n in names:
        m = dev.run_microbenchmark(n, mhz, 0.3)
        rows.append(
            {
                "bench": n,
                "sm_mhz": mhz,
                "repeat": 0,
                "time_s": m.time_s,
                "energy_j": m.energy_j,
                **dev.profile_range([n]).counters,
            }
        )
    bench = pd.DataFrame(rows)
    dev.set_policy(None)
    res = mod.analyze_training(dev, cfg["workload"], bench, tmp_path, default_mhz=mhz)
    assert res["packs"] > 0 and res["profiled_signatures"] == res["signatures"]
    assert res["kernels_profiled"] > 0 and res["counter_source"] == ["device"]
    # the replayed critical path and the model's time at the traced clock are close to the measured iteration
    assert abs(res["critical_path_vs_measured_pct"]) < 5
    assert res["predicted_iteration_ms"] == pytest.approx(res["measured_iteration_ms"], rel=0.1)
    # and the graph is checked against the loop untraced (the trace is not the run)
    assert res["untraced_iteration_ms"] > 0 and "traced_over_untraced" in res["untraced_correction"]
    run = dev.run(cfg["workload"], 5)
    assert res["predicted_iteration_energy_j"] == pytest.approx(run.energy_j / run.iterations, rel=0.5)
    assert set(res["cost_s"]) == {"trace_s", "graph_pack_s", "profile_s", "fit_predict_s"}


def test_record_mode_times_the_policy_and_calls_nothing():
    """The applier with the record setter: every request lands near its planned time; the jitter rows
    match each request to its plan."""
    import time

    from emo.runtime import PolicyApplier

    mod = _load()
    policy = mod.record_policy("gpu", [705, 1095, 1410], period_ms=40.0, lead_ms=5.0)
    calls = []

    class Record:
        def set_clock(self, device, mhz):
            calls.append(mhz)

        def reset_clock(self, device):
            calls.append("reset")

    applier = PolicyApplier(policy, Record())
    marks = []
    for _ in range(6):
        marks.append(time.monotonic())
        applier.step()
        time.sleep(0.04)
    applier.close()
    rows = mod.issue_jitter(policy, marks, applier.log)
    assert marks == pytest.approx(applier.marks, abs=0.01) and mod.issue_jitter(policy, [], applier.log) == []
    assert len(rows) == len(applier.log) >= 10  # two requests per iteration (the first marker adds one)
    assert all(abs(r["late_ms"]) < 20 for r in rows)
    s = mod.jitter_summary(rows, {"requests": applier.log, "errors": [], "lead_ms": 5.0})
    assert s["matched"] == len(rows) and s["late_ms"]["max"] >= s["late_ms"]["p50"]
    assert calls[-1] == "reset"
