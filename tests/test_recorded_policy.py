"""workload=recorded goes to a policy: a trace recorded on the virtual A100 (as a user would copy it
from a GPU box) plus a calibration of that GPU model gives a predicted policy; its counters come
from a metrics.parquet of one profile run, or there are none (the mean mix); validate is skipped."""

from __future__ import annotations

import json
import logging
import shutil

import pandas as pd
import pytest

from emo.workflow.plan import compose

SMALL = ["workload.model.layers=1", "workload.model.seq=1024", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, run_stage):
    d = tmp_path_factory.mktemp("rec")
    cfg = compose(SMALL + ["model.clocks_stride=8", "model.repeats=1"])
    run_stage("calibrate", cfg, {}, d / "calibrate")
    run_stage("trace", cfg, {}, d / "trace")
    run_stage("graph", cfg, {"events": d / "trace/events.parquet"}, d / "graph")
    run_stage("pack", cfg, {"nodes": d / "graph/nodes.parquet"}, d / "pack")
    run_stage(
        "profile",
        cfg,
        {
            "packs": d / "pack/packs.parquet",
            "events": d / "trace/events.parquet",
            "measured": d / "trace/measured.json",
            "graph_nodes": d / "graph/nodes.parquet",
        },
        d / "profile",
    )
    src = d / "recorded"
    shutil.copytree(d / "trace" / "kineto", src)
    return d, src


def _pipeline(run_stage, d, src, tag, extra=()):
    cfg = compose(["tracking.enabled=false", "workload=recorded", f"workload.path={src}", *extra])
    o = d / tag
    m = {"trace": run_stage("trace", cfg, {}, o / "trace")}
    run_stage("graph", cfg, {"events": o / "trace/events.parquet"}, o / "graph")
    run_stage("pack", cfg, {"nodes": o / "graph/nodes.parquet"}, o / "pack")
    m["profile"] = run_stage(
        "profile",
        cfg,
        {
            "packs": o / "pack/packs.parquet",
            "events": o / "trace/events.parquet",
            "measured": o / "trace/measured.json",
            "graph_nodes": o / "graph/nodes.parquet",
        },
        o / "profile",
    )
    m["fit"] = run_stage(
        "fit",
        cfg,
        {
            "bench": d / "calibrate/bench.parquet",
            "metrics": o / "profile/metrics.parquet",
            "packs": o / "pack/packs.parquet",
            "baseline": o / "profile/baseline.json",
            "iterations": o / "pack/iterations.parquet",
        },
        o / "fit",
    )
    m["optimize"] = run_stage(
        "optimize",
        cfg,
        {
            "packs": o / "pack/packs.parquet",
            "nodes": o / "pack/nodes.parquet",
            "edges": o / "pack/edges.parquet",
            "iterations": o / "pack/iterations.parquet",
            "model": o / "fit/model.parquet",
            "calibration": d / "calibrate/calibration.json",
        },
        o / "optimize",
    )
    m["validate"] = run_stage("validate", cfg, {"policy": o / "optimize/policy.json"}, o / "validate")
    return o, m


def test_recorded_trace_with_a_profile_run_gets_a_predicted_policy(recorded, run_stage, caplog):
    d, src = recorded
    shutil.copy(d / "profile" / "metrics.parquet", src / "metrics.parquet")
    with caplog.at_level(logging.WARNING, logger="emo"):
        o, m = _pipeline(run_stage, d, src, "with_metrics")
    assert m["profile"]["counters"] == "file"
    policy = json.loads((o / "optimize/policy.json").read_text())
    assert policy["predicted_time_s"] > 0 and policy["predicted_energy_j"] > 0
    result = json.loads((o / "validate/result.json").read_text())
    assert "needs the device" in result["skipped"] and result["predicted_es_pct"] > 0
    assert result["predicted_pl_pct"] <= 100 * 0.02 + 0.5  # within the default budget
    assert sum("validate: skipped" in r.message for r in caplog.records) == 1
    base = json.loads((o / "profile/baseline.json").read_text())
    assert base["source"] == "trace" and base["iteration_energy_j"] is None  # no window records copied
    (src / "metrics.parquet").unlink()


def test_recorded_trace_without_counters_gets_the_mean_mix(recorded, run_stage, caplog):
    d, src = recorded
    with caplog.at_level(logging.WARNING, logger="emo"):
        o, m = _pipeline(run_stage, d, src, "no_counters")
    assert m["profile"]["counters"] == "none"
    assert any("without pack counters" in r.message for r in caplog.records)
    metrics = pd.read_parquet(o / "profile/metrics.parquet")
    assert metrics["fma_inst"].isna().all()
    model = pd.read_parquet(o / "fit/model.parquet")
    assert model["time_s"].notna().all() and (model["time_s"] > 0).all()
    slow = model[model["sm_mhz"] == model["sm_mhz"].min()].set_index("signature")["time_s"]
    fast = model[model["sm_mhz"] == model["default_mhz"]].set_index("signature")["time_s"]
    assert (slow > fast).all()  # the mean mix still slows down at low clocks
    assert json.loads((o / "optimize/policy.json").read_text())["predicted_energy_j"] > 0


def test_a_foreign_metrics_file_is_refused(recorded, run_stage):
    d, src = recorded
    pd.DataFrame({"signature": ["nope"], "rank": [0]}).to_parquet(src / "metrics.parquet")
    try:
        with pytest.raises(ValueError, match="no counters for .* pack signatures"):
            _pipeline(run_stage, d, src, "foreign")
    finally:
        (src / "metrics.parquet").unlink()


def test_per_kernel_counters_in_a_trace_need_no_rerun(recorded, run_stage, tmp_path):
    """A counters/ folder of Kineto files with cuda_profiler_range events (what torch.profiler
    writes with profiler_measure_per_kernel) gives every pack its counters: source "trace"."""
    import gzip

    from emo.graph import Graph
    from emo.model.profiling import first_ranges, recorded_metrics

    d, src = recorded
    o, _ = _pipeline(run_stage, d, src, "for_counters")
    packs = pd.read_parquet(o / "pack/packs.parquet")
    events = pd.read_parquet(o / "trace/events.parquet")
    nodes = Graph.load(o / "graph").nodes
    first, ranges, names, _ = first_ranges(packs, events, nodes)
    folder = tmp_path / "rec"
    shutil.copytree(src, folder)
    (folder / "counters").mkdir()
    for rank, ks in names.items():  # every kernel but NCCL ones, kernel i of the iteration: i + 1 FMA instructions
        evs = [
            {
                "ph": "X",
                "cat": "cuda_profiler_range",
                "name": n,
                "ts": i,
                "dur": 1,
                "args": {
                    "sm__inst_executed_pipe_fma.sum": i + 1,
                    "sm__cycles_active.sum": 100,
                    "sm__warps_active.avg.pct_of_peak_sustained_active": 50,
                },
            }
            for i, n in enumerate(ks)
            if "nccl" not in n.lower()
        ]
        doc = {"distributedInfo": {"rank": rank}, "traceEvents": evs}
        (folder / "counters" / f"rank{rank:03d}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    m = recorded_metrics(folder, packs, events, nodes)
    assert (m["source"] == "trace").all() and len(m) == len(first)
    for (_, row), r in zip(m.iterrows(), ranges):
        assert row["fma_inst"] == sum(o + 1 for o in r.ordinals)
        assert row["sm_active_cycles"] == 100 * len(r.ordinals)
    # counters of another iteration's kernels are refused by name
    doc = json.loads(gzip.decompress((folder / "counters" / "rank000.json.gz").read_bytes()))
    doc["traceEvents"][0]["name"] = "someOtherKernel"
    (folder / "counters" / "rank000.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    if any(0 in r.ordinals and r.rank == 0 for r in ranges):
        with pytest.raises(ValueError, match="not the same iteration's kernels"):
            recorded_metrics(folder, packs, events, nodes)


def test_no_permission_states_the_cost_then_goes_on_without_counters(recorded, caplog):
    from emo.device import ProfilingUnavailable
    from emo.graph import Graph
    from emo.model.profiling import profile_first_occurrences

    d, _ = recorded

    class NoPermission:  # what the NVML backend does without profiling permission
        def profile_cost_s(self, secs, run_s):
            assert secs and all(s >= 0 for ks in secs for s in ks)
            return 90.0

        def profile_ranges(self, workload, ranges):
            assert all(isinstance(r.nccl, tuple) for r in ranges)
            raise ProfilingUnavailable("ncu: no permission to read GPU performance counters (ERR_NVGPUCTRPERM)")

    packs = pd.read_parquet(d / "pack/packs.parquet")
    with caplog.at_level(logging.INFO, logger="emo"):
        m = profile_first_occurrences(
            NoPermission(),
            {"kind": "command"},
            packs,
            pd.read_parquet(d / "trace/events.parquet"),
            Graph.load(d / "graph").nodes,
            run_s=30.0,
        )
    assert "about 1.5 minutes" in caplog.text and "ERR_NVGPUCTRPERM" in caplog.text
    assert (m["source"] == "none").all() and m["fma_inst"].isna().all()
    assert len(m) == packs["first_occurrence"].sum()
