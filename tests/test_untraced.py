"""The trace is not the run (docs/analyze.md, "The trace is not the run"): tracing costs the host
time on the virtual GPU as it does on hardware, the graph takes its timing from the untraced run,
optimize refuses a trace that does not describe the run, and measurements are never traced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from emo.device.sim.device import SimDevice
from emo.workloads import build_program

ROOT = Path(__file__).resolve().parents[1]
# a small GPT step whose host is close behind its GPU: GPU-bound untraced, host-bound under a
# heavy profiler (the pattern the lent H200 showed)
HOST_HEAVY = {"kind": "tp", "model": {"hidden": 1024, "heads": 16, "seq": 2048, "batch": 2}}


@pytest.fixture(scope="module")
def a100():
    from hydra import compose, initialize_config_dir

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("config", overrides=["gpu=a100"]).gpu


def gpu(cfg, **physics):
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True)
    c["physics"] = {**c["physics"], **physics}
    return c


def iteration_ms(cfg, workload: dict, tmp: Path | None, capture: str = "full", iterations: int = 4) -> float:
    dev = SimDevice(cfg)
    try:
        r = dev.run(build_program(workload, gpu="a100"), iterations, warmup=1, trace_dir=tmp, capture=capture)
    finally:
        dev.close()
    return 1e3 * float(np.mean(r.iteration_times_s))


def test_tracing_costs_the_host_and_only_traced_runs_pay(a100, tmp_path):
    plain = iteration_ms(a100, HOST_HEAVY, None)
    full = iteration_ms(a100, HOST_HEAVY, tmp_path / "full", "full")
    light = iteration_ms(a100, HOST_HEAVY, tmp_path / "light", "light")
    assert plain < light < full  # the light capture records fewer events, each at the same cost
    free = iteration_ms(gpu(a100, trace_overhead_us=0.0), HOST_HEAVY, tmp_path / "free", "full")
    assert free == pytest.approx(plain, rel=1e-9)  # with no cost a traced run is the untraced one
    # the light capture writes no CPU ops, but keeps the iteration marks
    import gzip

    doc = json.loads(gzip.open(tmp_path / "light" / "rank0.pt.trace.json.gz").read())
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert "cpu_op" not in cats and "cuda_runtime" in cats
    assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in doc["traceEvents"])


def test_bad_capture_is_one_line(a100):
    dev = SimDevice(a100)
    with pytest.raises(ValueError, match=r"trace.capture='cupti-ish'"):
        dev.run(build_program(HOST_HEAVY, gpu="a100"), 1, trace_dir=Path("/nonexistent"), capture="cupti-ish")


@pytest.fixture(scope="module")
def heavy(a100, tmp_path_factory):
    """The host-heavy step traced under a heavy profiler (30 µs a record), its graph before and
    after the correction, and the packs of each."""
    from emo.stages import run_in_place
    from emo.workflow.sweep import compose

    d = tmp_path_factory.mktemp("heavy")
    cfg = compose(
        [
            "workload=tp",
            "workload.model.hidden=1024",
            "workload.model.heads=16",
            "workload.model.seq=2048",
            "workload.model.batch=2",
            "gpu.physics.trace_overhead_us=30",
        ]
    )
    run_in_place("trace", cfg, {}, d / "trace")
    run_in_place("graph", cfg, {"events": d / "trace/events.parquet"}, d / "graph")
    run_in_place("pack", cfg, {"nodes": d / "graph/nodes.parquet"}, d / "pack")
    return cfg, d


def test_graph_is_corrected_to_the_untraced_run(heavy):
    cfg, d = heavy
    info = json.loads((d / "graph/summary.json").read_text())["untraced"]
    measured = json.loads((d / "trace/measured.json").read_text())
    assert info["corrected"] and info["traced_over_untraced"] > 1.3  # host-bound under the profiler
    # the corrected graph replays the run measured without the profiler, within its noise
    assert abs(info["corrected_iteration_ms"] - info["untraced_iteration_ms"]) <= info["noise_ms"] + 1e-6
    assert info["untraced_iteration_ms"] == pytest.approx(1e3 * np.mean(measured["untraced"]["iteration_times_s"]))
    # only the host moved: the overhead found is near what the virtual GPU charged (30 µs a record)
    assert 15 < info["host_overhead_us_per_record"] < 45


def test_packing_survives_a_host_bound_trace(heavy):
    """On the traced (host-bound) timeline no launch runs ahead of its kernel, so packs would be one
    kernel each; on the corrected one the GPU queues work again and packs grow."""
    from emo.graph import Graph, build_graph
    from emo.pack import pack

    cfg, d = heavy
    traced = build_graph(pd.read_parquet(d / "trace/events.parquet"))
    before = pack(traced, float(cfg["packing"]["delta_max_ms"]))
    after = pack(Graph.load(d / "graph"), float(cfg["packing"]["delta_max_ms"]))
    k_before = (before.pack_of >= 0).sum() / max(len(before.packs), 1)
    k_after = (after.pack_of >= 0).sum() / max(len(after.packs), 1)
    assert k_after > 1.5 * k_before
    # and the pack stage says why packs stay small: kernels launched too shortly before they start
    from emo.stages.pack import launched_late

    kernels = int((before.pack_of >= 0).sum())
    assert launched_late(traced) > 0.9 * kernels > 2 * launched_late(Graph.load(d / "graph"))


def test_optimize_refuses_a_trace_that_is_not_the_run():
    from emo.errors import InputError
    from emo.stages.optimize import check_describes_run

    ok = {"default": {"predicted_iteration_s": 0.1005, "measured_iteration_s": 0.1}, "iteration_time_sd_s": 0.0001}
    check_describes_run(ok, "trace")  # 0.5 %: within 1 %
    noisy = {"default": {"predicted_iteration_s": 0.103, "measured_iteration_s": 0.1}, "iteration_time_sd_s": 0.002}
    check_describes_run(noisy, "trace")  # 3 %, within 2 sd = 4 %
    bad = {"default": {"predicted_iteration_s": 0.14, "measured_iteration_s": 0.1}, "iteration_time_sd_s": 0.001}
    with pytest.raises(InputError, match=r"predicts 140\.000 ms .* measures 100\.000 ms untraced \(\+40\.0 %"):
        check_describes_run(bad, "trace")


def test_stage_failure_of_the_input_exits_2(tmp_path, monkeypatch):
    """A stage that fails on what it was given (InputError) makes emo run exit 2, as bad input."""
    from emo import errors
    from emo.workflow import run

    monkeypatch.setenv(errors.ERRORS_ENV, str(tmp_path / "e.jsonl"))
    errors.report("optimize", "trace: ...", None, status=2)
    run.failure(errors.read_reports(tmp_path / "e.jsonl"))
    assert run.failed_status[0] == 2
    errors.report("fit", "other", None)
    run.failure(errors.read_reports(tmp_path / "e.jsonl"))
    assert run.failed_status[0] == 1


def test_time_levels_say_what_they_drop(monkeypatch):
    """A measured level the fit cannot use is listed with its reason, never dropped silently."""
    from emo.model import levels

    class T:
        device_keys = [(0, 0)]

    monkeypatch.setattr(levels, "pack_tables", lambda *a, **k: T())

    class P:
        time_s = 1.0

    monkeypatch.setattr(levels, "predict", lambda *a, **k: P())
    monkeypatch.setattr(levels, "with_time_level", lambda model, lam: model)
    base = {"iteration_time_s": 1.0, "iteration_time_sd_s": 0.01, "iterations": 10}
    meas = [
        {"sm_mhz": 1200, "iteration_time_s": 1.0001, "iteration_time_sd_s": 0.01, "iterations": 10},  # noise
        {"sm_mhz": 900, "iteration_time_s": 2.0, "iteration_time_sd_s": 0.01, "iterations": 10},  # no λ fits
    ]
    got, dropped = levels.time_levels(pd.DataFrame(), None, None, None, {**base, "levels": meas}, "a100")
    assert got == [] and [d["sm_mhz"] for d in dropped] == [1200, 900]
    assert "noise" in dropped[0]["why"] and "no time level" in dropped[1]["why"]


def test_nvml_measurements_are_never_traced(monkeypatch):
    """NvmlDevice.run without a trace folder measures in a run_segments launch (the ranks time their
    iterations), never under the profiler's window."""
    from emo.device import nvml

    calls = []
    dev = object.__new__(nvml.NvmlDevice)
    dev._policy = None
    monkeypatch.setattr(nvml.NvmlDevice, "set_policy", lambda self, p: setattr(self, "_policy", p))
    monkeypatch.setattr(
        nvml.NvmlDevice, "run_segments", lambda self, wl, runs, warmup=1: calls.append(("segments", runs)) or ["r"]
    )
    from emo.device import launcher

    monkeypatch.setattr(launcher, "run_capture", lambda *a, **k: calls.append(("capture",)))
    wl = {"kind": "command", "command": ["python", "train.py"], "nproc": 1, "wait": 1, "warmup": 1, "active": 3}
    assert dev.run(wl, 7, warmup=2) == "r"
    assert calls == [("segments", [(None, 7)])]


def test_light_capture_in_the_job_records_with_cupti_only(tmp_path, monkeypatch):
    """trace.capture=light on hardware: the rank's window records CUPTI activity (emo.trace.cupti)
    over the active iterations, with its marks, and never starts torch.profiler (no CPU ops)."""
    pytest.importorskip("torch")
    from emo import capture
    from emo.device import launcher
    from emo.trace import cupti

    seen: list = []

    class FakeTracer:  # the cupti-python boundary: what the window asks of CuptiTracer
        def __init__(self, path):
            self.path = Path(path)

        def __enter__(self):
            seen.append("enter")
            return self

        def step(self):
            seen.append("step")

        def __exit__(self, *exc):
            seen.append("exit")
            self.path.write_text("{}")

    monkeypatch.setattr(cupti, "CuptiTracer", FakeTracer)
    w = capture.ProfilerWindow(tmp_path, wait=1, warmup=1, active=3, capture="light")
    assert w.prof is None
    for _ in range(6):
        w.step()
    w.close()
    assert seen == ["enter", "step", "step", "step", "exit"]
    record = json.loads(w.window_file.read_text())
    assert record["iterations"] == 3 and w.trace_file.exists()
    # the stage's choice reaches the rank through the launch environment
    spec = launcher.CaptureSpec.from_workload(
        {"command": ["python", "t.py"], "nproc": 1, "wait": 1, "warmup": 1, "active": 3}, capture="light"
    )
    assert launcher.build_env(spec, tmp_path)[launcher.ENV_CAPTURE] == "light"


def test_a_recorded_trace_is_warned_not_refused(caplog):
    """A recorded trace's baseline is its own traced window: a mismatch is the model's, said in a
    warning; the gate refuses only against a run measured untraced."""
    from emo.stages.optimize import check_describes_run

    rec = {
        "default": {"predicted_iteration_s": 0.14, "measured_iteration_s": 0.1},
        "iteration_time_sd_s": 0.001,
        "baseline_source": "trace",
    }
    check_describes_run(rec, "trace")
    assert "no untraced run" in caplog.text
