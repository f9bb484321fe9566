"""The virtual GPU answers the profiler in ncu form (EMO's totals) or DCGM form (activity ratios),
a configuration choice; the pipeline fits on either."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from emo.device import COUNTERS
from emo.device.features import DCGM
from emo.device.sim import SimDevice
from emo.workflow.plan import compose

SMALL = ["workload.model.layers=1", "workload.model.seq=1024", "tracking.enabled=false"]


def test_counter_form_is_a_config_choice():
    ncu = SimDevice(compose(["gpu=a100", "tracking.enabled=false"])["gpu"]).profile_range(["dram_read_high"])
    dcgm = SimDevice(compose(["gpu=a100", "gpu.counters=dcgm", "tracking.enabled=false"])["gpu"]).profile_range(
        ["dram_read_high"]
    )
    assert list(ncu.counters) == list(COUNTERS)
    assert set(dcgm.counters) <= set(DCGM) and dcgm.counters["DCGM_FI_PROF_DRAM_ACTIVE"] > 0.8  # sampled: +-3 %
    assert all(0.0 <= v <= 1.0 for v in dcgm.counters.values()) and dcgm.passes == 1
    with pytest.raises(ValueError, match="gpu.counters must be one of ncu, dcgm, none"):
        compose(["gpu=a100", "gpu.counters=nvprof", "tracking.enabled=false"])


def test_the_pipeline_fits_on_dcgm_counters(tmp_path, run_stage):
    cfg = compose(SMALL + ["gpu.counters=dcgm", "model.clocks_stride=8", "model.repeats=1"])
    d = tmp_path
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
    m = run_stage(
        "fit",
        cfg,
        {
            "bench": d / "calibrate/bench.parquet",
            "metrics": d / "profile/metrics.parquet",
            "packs": d / "pack/packs.parquet",
            "baseline": d / "profile/baseline.json",
            "iterations": d / "pack/iterations.parquet",
        },
        d / "fit",
    )
    bench = pd.read_parquet(d / "calibrate/bench.parquet")
    assert "DCGM_FI_PROF_SM_ACTIVE" in bench.columns and "fma_inst" not in bench.columns
    metrics = pd.read_parquet(d / "profile/metrics.parquet")
    assert (metrics["source"] == "device").all() and "DCGM_FI_PROF_DRAM_ACTIVE" in metrics.columns
    check = json.loads((d / "fit/check.json").read_text())
    assert abs(check["default"]["time_error_pct"]) < 1.0
    for c in check["levels"]:
        assert abs(c["time_error_pct"]) < 1.0 and abs(c["energy_error_pct"]) < 3.0, c
    model = pd.read_parquet(d / "fit/model.parquet")
    assert model["fit_residual"].max() < 1.0 and m["signatures"] == model["signature"].nunique()
