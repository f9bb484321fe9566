"""One declaration per stage (emo.stages.Stage): the folder hash, the Snakemake rules and the
in-process chaining are derived from it, and a stage can open only what it declared."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emo.stages import STAGES, declaration, run_in_place, run_stage
from emo.workflow.plan import compose, plan

ROOT = Path(__file__).resolve().parents[1]


def recorded(tmp_path: Path) -> tuple[Path, list[str]]:
    """A single-file recorded trace with every kind of sidecar beside it."""
    folder = tmp_path / "rec"
    (folder / "counters").mkdir(parents=True)
    (folder / "emo-capture").mkdir()
    (folder / "trace.json").write_text('{"traceEvents": []}')
    (folder / "metrics.parquet").write_bytes(b"counters of a profile run")
    (folder / "counters" / "rank000.json").write_text('{"traceEvents": []}')
    (folder / "emo-capture" / "rank0.window.json").write_text('{"iterations": 5, "time_s": 1.0, "energy_j": 100.0}')
    return folder, ["workload=recorded", f"workload.path={folder / 'trace.json'}", f"results={tmp_path / 'results'}"]


@pytest.mark.parametrize("sidecar", ["metrics.parquet", "counters/rank000.json", "emo-capture/rank0.window.json"])
def test_rewriting_a_sidecar_re_runs_the_stages_that_read_it(tmp_path, sidecar):
    """The stale-cache case: profile reads the sidecars beside a single-file trace, so its hash (and
    every hash computed from it) follows their content; trace, which does not read them, stays."""
    folder, overrides = recorded(tmp_path)
    before = plan(compose(overrides))
    assert set(before["profile"].covers["files"]) == {"counters", "metrics", "windows"}
    (folder / sidecar).write_bytes((folder / sidecar).read_bytes() + b" ")  # the same path, new content
    after = plan(compose(overrides))
    for stage in ("profile", "fit", "optimize", "validate"):
        assert after[stage].hash != before[stage].hash, stage
    for stage in ("trace", "graph", "pack", "calibrate"):
        assert after[stage].hash == before[stage].hash, stage


def test_a_sidecar_that_appears_is_a_new_input(tmp_path):
    folder, overrides = recorded(tmp_path)
    (folder / "metrics.parquet").unlink()
    before = plan(compose(overrides))["profile"]
    assert "metrics" not in before.covers["files"]
    (folder / "metrics.parquet").write_bytes(b"new")
    assert plan(compose(overrides))["profile"].hash != before.hash


def _upstream(tmp_path: Path) -> Path:
    """A trace stage folder with its two declared outputs."""
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "events.parquet").write_bytes(b"events")
    (trace / "measured.json").write_text("{}")
    (trace / "config.json").write_text("{}")
    return trace


def test_a_stage_reading_an_undeclared_input_fails(tmp_path, monkeypatch):
    """graph declares trace's events.parquet and measured.json only: trace's config.json is not
    where it looks, and the real trace folder is closed to it while it runs."""
    import emo.stages.graph as graph_stage

    trace = _upstream(tmp_path)
    seen = {}

    def beside(cfg, inputs, out):
        seen["events"] = inputs["events"].read_bytes()  # declared: there
        return json.loads((inputs["events"].parent / "config.json").read_text())

    monkeypatch.setattr(graph_stage, "run", beside)
    with pytest.raises(PermissionError, match=f"{trace / 'config.json'}: stage graph did not declare it"):
        run_in_place("graph", compose([]), {"events": trace / "events.parquet"}, tmp_path / "graph")
    assert seen["events"] == b"events"

    def around(cfg, inputs, out):  # following the link back to the upstream folder
        return json.loads((Path(os.readlink(inputs["events"])).parent / "config.json").read_text())

    monkeypatch.setattr(graph_stage, "run", around)
    with pytest.raises(PermissionError, match="config.json: stage graph did not declare it"):
        run_in_place("graph", compose([]), {"events": trace / "events.parquet"}, tmp_path / "graph")


def test_a_stage_reading_an_undeclared_file_beside_a_recorded_trace_fails(tmp_path, monkeypatch):
    """profile may read the sidecars it declares beside a recorded trace, nothing else there; the
    run fails with one line naming the file (run_stage, as under Snakemake)."""
    import emo.stages.profile as profile_stage

    folder, overrides = recorded(tmp_path)
    (folder / "notes.json").write_text("{}")
    cfg = compose(overrides)
    monkeypatch.setattr(profile_stage, "run", lambda c, i, o: {"n": len((folder / "metrics.parquet").read_bytes())})
    assert run_in_place("profile", cfg, {}, tmp_path / "ok") == {"n": 25}
    monkeypatch.setattr(profile_stage, "run", lambda c, i, o: json.loads((folder / "notes.json").read_text()))
    p = plan(cfg)["profile"]
    params = {"cfg": cfg, "hash": p.hash, "covers": p.covers}
    with pytest.raises(PermissionError):
        run_stage("profile", params, {}, p.dir, str(tmp_path / "profile.log"))
    assert not (p.dir / "config.json").exists()


def test_an_input_a_stage_does_not_declare_is_refused(tmp_path):
    with pytest.raises(ValueError, match="config: not an input emo.stages.graph.STAGE declares"):
        run_in_place("graph", compose([]), {"config": _upstream(tmp_path) / "config.json"}, tmp_path / "g")


def test_every_declared_input_is_an_upstream_output():
    cfg = compose([])
    for stage in STAGES:
        decl = declaration(stage)
        for name, (up, file) in decl.inputs_for(cfg).items():
            assert STAGES.index(up) < STAGES.index(stage), (stage, name)
            assert file in declaration(up).outputs, (stage, name, up, file)


def _dry_run(tmp_path: Path, overrides: list[str]) -> dict[str, dict[str, set[str]]]:
    """Snakemake's dry run: rule -> {"input": files, "output": files} of its one job."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(ROOT / "Snakefile"),
            "-n",
            "--nolock",
            "--config",
            f"overrides={json.dumps(overrides)}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "EMO_VERBOSE": ""},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = {}
    for block in re.split(r"\n(?=rule \w+:)", r.stdout + r.stderr):
        m = re.match(r"rule (\w+):", block)
        if m:
            files = {k: set(v.split(", ")) for k, v in re.findall(r"^\s+(input|output): (.*)$", block, re.M)}
            jobs[m.group(1)] = files
    return jobs


@pytest.mark.parametrize("recorded_trace", [False, True])
def test_the_rules_are_the_declarations(tmp_path, recorded_trace):
    """Every rule's inputs and outputs in Snakemake's own dry run are what the declaration says, in
    the folders the plan names; a recorded trace's sidecars are inputs of profile."""
    overrides = recorded(tmp_path)[1] if recorded_trace else [f"results={tmp_path / 'results'}"]
    cfg = compose(overrides)
    plans = plan(cfg)
    jobs = _dry_run(tmp_path, overrides)
    for stage in STAGES:
        decl = declaration(stage)
        inputs = {plans[up].out(file) for up, file in decl.inputs_for(cfg).values()} | set(
            decl.outside_for(cfg).values()
        )
        outputs = {plans[stage].out(f) for f in (*decl.outputs, "config.json")}
        assert jobs[stage].get("input", set()) == inputs, stage
        assert jobs[stage]["output"] == outputs, stage
    if recorded_trace:
        assert len(declaration("profile").outside_for(cfg)) == 3
