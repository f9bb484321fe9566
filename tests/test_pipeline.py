"""The pipeline mechanism: typed configuration, content-hashed stage folders, atomic stages, Snakemake."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emo.stages import Stage, declaration, run_in_place, run_stage
from emo.workflow import plan as planmod
from emo.workflow.plan import compose, plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "override, key",
    [
        ("workload.tp=eight", "workload.tp"),
        ("workload.foo=1", "workload.foo"),
        ("budgett=0.1", "budgett"),
        ("budget=abc", "budget"),
        ("gpu=b200", "gpu/b200"),
        ("optimizer.change_points=fixed", "optimizer.change_points"),
        ("optimizer.perseus_level=unit", "optimizer.perseus_level"),
    ],
)
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
    # an online baseline's validate tunes as it runs: what optimize and its inputs are is not its business
    zeus, zeus_repacked = (plan(compose(["optimizer=zeus", *o])) for o in ([], ["packing.delta_max_ms=3"]))
    assert zeus["optimize"].hash != zeus_repacked["optimize"].hash
    assert zeus["validate"].hash == zeus_repacked["validate"].hash and zeus["validate"].covers["inputs"] == {}
    assert plan(compose(["packing.delta_max_ms=3"]))["validate"].hash != base["validate"].hash


def test_code_digest_follows_the_imports(tmp_path, monkeypatch):
    """A stage's code is what emo.stages.<stage> imports, transitively (also inside functions and
    backends named by string), and nothing else: a change there re-runs it, a change elsewhere does not."""
    pkg = tmp_path / "emo"
    for d in ("", "stages", "lib", "other"):
        (pkg / d).mkdir(exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "stages" / "__init__.py").write_text("def run_stage():\n    from emo import other\n")
    (pkg / "stages" / "demo.py").write_text(
        "def run():\n    from emo.lib import deep\n    return 'emo.lib.named:Backend'\n"
    )
    (pkg / "lib" / "deep.py").write_text("from . import shallow\n")
    (pkg / "lib" / "shallow.py").write_text("x = 1\n")
    (pkg / "lib" / "named.py").write_text("x = 1\n")
    (pkg / "other" / "tracking.py").write_text("x = 1\n")
    monkeypatch.setattr(planmod, "ROOT", tmp_path)
    monkeypatch.setattr(planmod, "PACKAGE_PARENT", tmp_path)  # where module sources are found
    assert planmod.imported_modules("emo.stages.demo") == [
        "emo",
        "emo.lib",
        "emo.lib.deep",
        "emo.lib.named",
        "emo.lib.shallow",
        "emo.stages",
        "emo.stages.demo",
    ]

    def digest():
        planmod.code_digest.cache_clear()
        return planmod.code_digest("demo")

    before = digest()
    (pkg / "other" / "tracking.py").write_text("x = 2\n")  # the runner's imports record, they do not decide
    assert digest() == before
    for f in ("lib/shallow.py", "lib/named.py", "stages/__init__.py"):
        (pkg / f).write_text((pkg / f).read_text() + "# changed\n")
        assert digest() != before, f
        before = digest()
    planmod.code_digest.cache_clear()


def test_every_stage_hashes_the_code_it_imports():
    """The hand-written lists drifted (profile did not hash emo/graph, fit not emo/device): now each
    stage's digest covers what it imports, and the models' stages do not hash the virtual GPU. The
    stages that run a workload hash every kind's module; the calibration, which runs none, does not."""
    mods = {s: set(planmod.stage_modules(s)) for s in planmod.STAGES}
    assert "emo.graph.graph" in mods["profile"]
    assert {"emo.policy", "emo.graph.whatif"} <= mods["optimize"]
    for s in ("graph", "pack", "fit", "optimize"):
        assert not any(m.startswith(("emo.device.sim", "emo.workloads")) for m in mods[s]), s
    for s in ("trace", "calibrate", "profile", "validate"):
        assert "emo.device.sim.device" in mods[s], s
    for s in ("trace", "profile", "validate"):
        assert {"emo.workloads.tp", "emo.workloads.pp", "emo.workloads.command"} <= mods[s], s
    assert "emo.workloads.tp" not in mods["calibrate"]
    assert "emo.baselines.zeus" in mods["validate"] and "emo.optimize.solvers.static" in mods["optimize"]


def test_a_stage_hashes_every_module_of_the_packages_it_loads_by_name(tmp_path, monkeypatch):
    """A workload's kind and a method are modules found by name at run time, which no import statement
    names: a stage that declares their package (Stage.discovers) hashes each, a new one included, and
    what each imports. Before, editing emo/workloads/tp.py re-ran no stage."""
    pkg = tmp_path / "emo"
    for d in ("", "stages", "kinds"):
        (pkg / d).mkdir(exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "stages" / "demo.py").write_text("def run():\n    from emo import kinds\n")
    (pkg / "kinds" / "tp.py").write_text("from emo.kinds import _shape\n")
    (pkg / "kinds" / "_shape.py").write_text("x = 1\n")
    monkeypatch.setattr(planmod, "ROOT", tmp_path)
    monkeypatch.setattr(planmod, "PACKAGE_PARENT", tmp_path)
    monkeypatch.setattr(planmod, "STAGES", ("demo",))
    monkeypatch.setattr(planmod, "declaration", lambda stage: Stage(discovers=("emo.kinds",)))
    assert {"emo.kinds.tp", "emo.kinds._shape"} <= set(planmod.stage_modules("demo"))

    def digest():
        planmod.code_digest.cache_clear()
        return planmod.code_digest("demo")

    before = digest()
    for f in ("kinds/_shape.py", "kinds/tp.py", "kinds/toy.py"):  # what a kind imports, the kind, a new one
        (pkg / f).write_text("# changed\n")
        assert digest() != before, f
        before = digest()
    planmod.code_digest.cache_clear()


def test_a_stage_sees_only_the_config_its_hash_covers(tmp_path, monkeypatch):
    import emo.stages.pack as pack_stage

    seen = {}
    monkeypatch.setattr(pack_stage, "run", lambda cfg, inputs, out: seen.update(cfg) or {})
    run_in_place("pack", compose([]), {}, tmp_path)
    assert set(seen) == set(declaration("pack").reads) == {"packing"}


def test_a_recorded_trace_is_hashed_by_content(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    cfg = lambda: compose(["workload=recorded", f"workload.path={trace}", f"results={tmp_path}/r"])
    first = plan(cfg())["trace"]
    assert plan(cfg())["trace"].hash == first.hash
    trace.write_text('{"traceEvents": []}')  # the same path, new content: a new trace stage folder
    assert plan(cfg())["trace"].hash != first.hash
    with pytest.raises(ValueError, match="cannot read"):
        planmod.content_digest(tmp_path / "missing.json")


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


def test_a_full_disk_while_a_stage_finishes_leaves_the_folder_empty(tmp_path, monkeypatch):
    import emo.stages as stages
    import emo.stages.graph as graph_stage

    def full(path, obj):  # the disk fills up as the stage writes what says what its folder holds
        if Path(path).name == "config.json":
            raise OSError(28, "No space left on device")
        Path(path).write_text(str(obj))

    monkeypatch.setattr(graph_stage, "run", lambda cfg, inputs, out: (out / "nodes.parquet").write_text("x") and {})
    monkeypatch.setattr(stages, "write_json", full)
    out = tmp_path / "graph" / "abc"
    params = {"cfg": compose([f"results={tmp_path}"]), "hash": "abc", "covers": {}}
    with pytest.raises(OSError):
        run_stage("graph", params, {}, out)
    assert list(out.iterdir()) == [] and [p.name for p in out.parent.iterdir()] == ["abc"]


def emo(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "emo.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


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
    # the README's result line is what the code prints (its figures, on the default configuration)
    printed = re.search(r"emo on a100, budget 2 %: [^;]*;", r.stdout + r.stderr)
    readme = re.search(r"emo: defaults: (emo on a100, budget 2 %: [^;]*;)", (ROOT / "README.md").read_text())
    assert printed and readme and printed.group(0) == readme.group(1), (printed, readme)
    r = emo("run", res, "-n")
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr, r.stdout + r.stderr
    # outputs older than the workflow's scripts, as after a fresh clone or a git pull: the hashes
    # say the folders are current, and Snakemake's code trigger must not say otherwise
    old = time.time() - 86400
    for f in tmp_path.rglob("*"):
        os.utime(f, (old, old), follow_symlinks=False)
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


@pytest.mark.parametrize("profile", sorted(p.name for p in (ROOT / "profiles").iterdir() if p.is_dir()))
def test_every_profile_leaves_code_changes_to_the_hashes(profile):
    """A user's --profile replaces profiles/default, so each must drop Snakemake's code trigger (the
    test above shows what it does to a fresh clone) and keep the mtime one (a re-measured input)."""
    import yaml

    triggers = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text()).get("rerun-triggers")
    assert triggers and "code" not in triggers and "mtime" in triggers
