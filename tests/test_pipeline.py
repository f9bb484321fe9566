"""The pipeline mechanism: typed configuration, content-hashed stage folders, atomic stages, Snakemake."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from emo import plan as planmod
from emo.plan import compose, plan
from emo.stages import run_stage

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, key", [
    ("workload.tp=eight", "workload.tp"),
    ("workload.foo=1", "workload.foo"),
    ("budgett=0.1", "budgett"),
    ("budget=abc", "budget"),
    ("gpu=b200", "gpu/b200"),
    ("optimizer.change_points=fixed", "optimizer.change_points"),
    ("optimizer.perseus_level=unit", "optimizer.perseus_level"),
])
def test_bad_override_is_one_line_naming_the_key(override, key):
    with pytest.raises(ValueError) as e:
        compose([override])
    assert key in str(e.value) and "\n" not in str(e.value)


def test_hashes_follow_what_each_stage_depends_on():
    base = plan(compose([]))
    other_workload = plan(compose(["workload.tp=4"]))
    other_budget = plan(compose(["budget=0.05"]))
    assert base["trace"].hash != other_workload["trace"].hash
    assert base["graph"].hash != other_workload["graph"].hash  # its input changed
    for stage in ("calibrate",):
        if stage in base:
            assert base[stage].hash == other_workload[stage].hash  # calibration is per GPU model only
    for stage in base:
        if stage not in ("optimize", "validate"):
            assert base[stage].hash == other_budget[stage].hash
    assert plan(compose([])) == base  # deterministic


def test_code_change_changes_the_hash(tmp_path, monkeypatch):
    (tmp_path / "mod.py").write_text("x = 1\n")
    monkeypatch.setattr(planmod, "ROOT", tmp_path)
    planmod.code_digest.cache_clear()
    before = planmod.code_digest(("mod.py",))
    (tmp_path / "mod.py").write_text("x = 2\n")
    planmod.code_digest.cache_clear()
    assert planmod.code_digest(("mod.py",)) != before
    planmod.code_digest.cache_clear()


def test_failed_stage_leaves_no_trusted_files(tmp_path, monkeypatch):
    import emo.stages.graph as graph_stage

    def boom(cfg, inputs, out):
        (out / "nodes.parquet").write_text("half")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(graph_stage, "run", boom)
    out = tmp_path / "graph" / "abc"
    params = {"cfg": compose([f"results={tmp_path}"]), "hash": "abc", "covers": {}}
    with pytest.raises(RuntimeError):
        run_stage("graph", params, {}, out)
    assert list(out.iterdir()) == [] and [p.name for p in out.parent.iterdir()] == ["abc"]


def emo(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "emo.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_emo_run_records_then_has_nothing_to_do(tmp_path):
    res = f"results={tmp_path}"
    r = emo("run", res, "-c", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = compose([res])
    p = plan(cfg)
    for name in ("events.parquet", "config.json", "measured.json"):
        assert (p["trace"].dir / name).exists()
    assert (p["graph"].dir / "summary.json").exists()
    assert (tmp_path / "mlflow.db").exists()
    r = emo("run", res, "-n")
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr, r.stdout + r.stderr
    # a workload change re-runs trace and graph
    r = emo("run", res, "workload.tp=4", "-n")
    out = r.stdout + r.stderr
    assert "trace" in out and "graph" in out and "Nothing to be done" not in out


def test_bad_override_fails_fast_from_the_cli():
    r = emo("run", "workload.tp=eight")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "workload.tp" in r.stderr
