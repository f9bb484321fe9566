"""A sweep as one Snakemake DAG: jobs, shared stage folders once, a GPU per job, MLflow from one writer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emo.cli import main as cli_main
from emo.config import TrackingConfig
from emo.workflow import sweep

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "workload=tp",
    "workload.tp=2",
    "workload.model.layers=1",
    "model.clocks_stride=8",
    "model.repeats=1",
    "model.min_seconds=0.2",
    "trace.iterations=2",
    "validate.min_seconds=0.5",
]


def test_a_sweep_plans_every_job_and_shares_stage_folders(tmp_path):
    jobs = sweep.expand([f"results={tmp_path}", "workload.tp=2,4", "budget=0.02,0.05", "optimizer=emo,zeus"], True)
    sw = sweep.build(jobs)
    assert len(sw.jobs) == 8 and sw.results == tmp_path
    count = {s: len(sw.folders(s)) for s in sw.by_stage}
    assert count["calibrate"] == 1  # one GPU model: one calibration
    assert count["trace"] == count["graph"] == count["pack"] == count["profile"] == count["fit"] == 2  # per workload
    assert count["validate"] == 8
    assert {j.name for j in sw.jobs} >= {
        "workload.tp=2 budget=0.02 optimizer=emo",
        "workload.tp=4 budget=0.05 optimizer=zeus",
    }
    j = sw.jobs[0]
    assert sw.upstream("fit", j.plans["fit"].hash, "calibrate", "bench.parquet") == j.plans["calibrate"].out(
        "bench.parquet"
    )


def test_hydras_sweep_grammar_expands_as_its_basic_sweeper_does():
    assert sweep.expand(["budget=range(0,0.06,0.02)"], True) == [["budget=0.0"], ["budget=0.02"], ["budget=0.04"]]
    assert sweep.expand(["optimizer=choice(emo,zeus)", "workload.tp=2"], True) == [
        ["optimizer=emo", "workload.tp=2"],
        ["optimizer=zeus", "workload.tp=2"],
    ]
    assert sweep.expand(["budget=0.01,0.02", "budget=0.05"], True) == [["budget=0.05"]]  # a key twice: the last
    # glob lists the group's configs in conf/, not the typed-config schemas registered beside them
    assert sweep.expand(["gpu=glob(*,exclude=[nvml,rtx*])"], True) == [["gpu=a100"], ["gpu=h100"], ["gpu=v100"]]


@pytest.mark.parametrize(
    "override, line",
    [
        ("budget=interval(0,0.1)", r"^budget=interval\(0,0.1\): an interval is not a list of values"),
        ("optimizer=glob(nosuch*)", r"^optimizer=glob\(nosuch\*\): matches no value$"),
        ("budget=range(0,", r"^bad configuration: budget=range\(0,: Hydra cannot parse this override"),
    ],
)
def test_a_sweep_hydra_cannot_enumerate_is_one_line(override, line):
    with pytest.raises(ValueError, match=line):
        sweep.expand([override], True)


def test_emo_run_dry_run_lists_a_glob_sweeps_jobs(tmp_path, capsys):
    assert cli_main(["run", "-n", "-m", "optimizer=glob(*)", f"results={tmp_path}"]) == 0
    err = capsys.readouterr().err
    listed = re.findall(r"^emo: job (.+)$", err, re.M)
    assert listed == [f"optimizer={m}" for m in sorted(p.stem for p in (ROOT / "conf" / "optimizer").glob("*.yaml"))]
    assert "Traceback" not in err


def test_a_sweep_writes_into_one_results_folder(tmp_path):
    with pytest.raises(ValueError, match="results: a sweep writes into one results folder"):
        sweep.build(sweep.expand([f"results={tmp_path}/a,{tmp_path}/b"], True))


def test_a_folder_the_sweep_does_not_plan_is_named_in_one_line(tmp_path):
    # what Snakemake asks for when the code or conf/ changed between planning and running a job
    sw = sweep.build(sweep.expand([f"results={tmp_path}"], True))
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(tmp_path / 'fit' / '0123456789ab'))}: no job of this sweep plans"
    ):
        sw.job("fit", "0123456789ab")


def test_the_snakefile_takes_the_sweep_emo_run_planned_and_plans_afresh_otherwise(tmp_path, monkeypatch):
    jobs = sweep.expand([f"results={tmp_path}", "budget=0.02,0.05"], True)
    sw = sweep.build(jobs)
    sweep.save_planned(sw, tmp_path / "plan.pickle")
    build = sweep.build

    def no_composing(job_overrides):
        raise AssertionError("composed again")

    monkeypatch.setattr(sweep, "build", no_composing)
    taken = sweep.from_snakemake_config({"jobs": jobs, "planned": str(tmp_path / "plan.pickle")})
    assert taken == sw and taken.by_stage == sw.by_stage
    monkeypatch.setattr(sweep, "build", build)
    other = sweep.from_snakemake_config({"jobs": jobs[:1], "planned": str(tmp_path / "plan.pickle")})
    assert [list(j.overrides) for j in other.jobs] == jobs[:1]  # not the planned jobs: composed here
    (tmp_path / "cut.pickle").write_bytes((tmp_path / "plan.pickle").read_bytes()[:100])
    assert sweep.from_snakemake_config({"jobs": jobs, "planned": str(tmp_path / "cut.pickle")}) == sw  # composed afresh


def test_a_fresh_mlflow_store_is_made_by_mlflow_itself(tmp_path, monkeypatch):
    """MLflow creates and migrates each new store (its public client only), with its Default
    experiment and ours; stores side by side stay apart."""
    import sqlite3

    from emo.workflow import tracking

    monkeypatch.chdir(tmp_path)
    stores = []
    for name in ("a", "b"):
        client, exp = tracking.open_store(TrackingConfig(uri=f"sqlite:///{tmp_path / name / 'mlflow.db'}"))
        run = client.create_run(exp, run_name=name).info.run_id
        client.log_metric(run, "x", 1.0)
        client.set_terminated(run)
        stores.append(client)
    for name, client in zip("ab", stores):
        assert sorted(e.name for e in client.search_experiments()) == ["Default", "emo"]
        runs = client.search_runs([client.get_experiment_by_name("emo").experiment_id])
        assert [(r.info.run_name, r.data.metrics) for r in runs] == [(name, {"x": 1.0})]
        revision = sqlite3.connect(tmp_path / name / "mlflow.db").execute("select version_num from alembic_version")
        assert revision.fetchone()[0] in tracking.known_revisions()  # migrated to the installed MLflow's head
    assert not (tmp_path / "mlruns").exists()  # artifacts beside the database


def test_a_store_mlflow_cannot_use_is_one_line_naming_it(tmp_path, monkeypatch):
    """A URI no store answers to, before anything runs; a file that is not a database, a server that
    does not answer (a counted number of tries), a folder where the database would be: one line each."""
    import contextlib
    import sqlite3

    from emo.workflow import tracking

    with pytest.raises(ValueError, match=r"^tracking.uri: 'foo://bar' is not an MLflow tracking URI"):
        sweep.build(sweep.expand([f"results={tmp_path}", "tracking.uri=foo://bar"], False))
    sweep.build(sweep.expand([f"results={tmp_path}", "tracking.uri=foo://bar", "tracking.enabled=false"], False))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nope://x")
    with pytest.raises(ValueError, match=r"^MLFLOW_TRACKING_URI: 'nope://x' is not"):
        sweep.build(sweep.expand([f"results={tmp_path}"], False))
    monkeypatch.delenv("MLFLOW_TRACKING_URI")

    bad = tmp_path / "bad" / "mlflow.db"
    bad.parent.mkdir()
    bad.write_text("not a database")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: the MLflow store failed: file is not a database"):
        tracking.search(f"sqlite:///{bad}", "emo")
    newer = tmp_path / "newer" / "mlflow.db"  # made by an MLflow newer than this one (alembic's revision)
    newer.parent.mkdir()
    with contextlib.closing(sqlite3.connect(newer)) as db:
        db.execute("create table alembic_version (version_num varchar(32) not null primary key)")
        db.execute("insert into alembic_version values ('deadbeef0000')")
        db.commit()
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(newer))}: written by a newer MLflow than the one installed "
        r"\(.*; schema deadbeef0000 is unknown to it\): upgrade MLflow",
    ):
        tracking.search(f"sqlite:///{newer}", "emo")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    with pytest.raises(ValueError, match=r"^http://127.0.0.1:9: the MLflow store failed: .*Max retries exceeded"):
        tracking.search("http://127.0.0.1:9", "emo")  # port 9 (discard): refused at once
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == tracking.HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]

    db = tmp_path / "folder" / "mlflow.db"
    db.mkdir(parents=True)  # a folder where the database would be: said at once (MLflow retries for minutes)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(db))}: not a file \(an MLflow SQLite store is one file\)$"):
        tracking.open_store(TrackingConfig(uri=f"sqlite:///{db}"))


def job_stats(out: str) -> dict[str, int]:
    block = out[out.index("Job stats:") :].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


def test_the_sweep_is_one_dag_with_each_shared_stage_once(tmp_path):
    """Snakemake's own dry run of three jobs: one calibration, a trace chain per workload, optimize only
    for the offline methods, a validate per job."""
    jobs = '[["budget=0.02","optimizer=emo"],["budget=0.05","optimizer=zeus"],["budget=0.05","optimizer=emo","workload.tp=4"]]'
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-s",
            str(ROOT / "Snakefile"),
            "-d",
            str(tmp_path),
            "--config",
            f"jobs={jobs}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    stats = job_stats(r.stdout + r.stderr)
    assert stats == {
        "calibrate": 1,
        "trace": 2,
        "graph": 2,
        "pack": 2,
        "profile": 2,
        "fit": 2,
        "optimize": 2,
        "validate": 3,
        "summary": 1,
        "all": 1,
        "total": 18,
    }


def test_parallel_jobs_get_their_own_gpus(tmp_path):
    held: list[list[str]] = []
    lock = threading.Lock()
    gate = threading.Barrier(2)

    def job(n):
        with sweep.claim_gpus(n, tmp_path, ["0", "1", "2"], poll_s=0.01) as ids:
            with lock:
                held.append(ids)
            gate.wait(timeout=10)  # both hold their GPUs at the same time

    threads = [threading.Thread(target=job, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(len(h) for h in held) == [1, 2]
    assert len({g for h in held for g in h}) == 3  # no GPU handed to two jobs

    # a third claim waits until a GPU is free again
    with sweep.claim_gpus(3, tmp_path, ["0", "1", "2"]):
        start = time.perf_counter()
        done = threading.Event()
        t = threading.Thread(
            target=lambda: (sweep.claim_gpus(1, tmp_path, ["0", "1", "2"], poll_s=0.01).__enter__(), done.set())
        )
        t.start()
        time.sleep(0.2)
        assert not done.is_set()
    t.join(timeout=5)
    assert done.is_set() and time.perf_counter() - start >= 0.2


def test_a_stage_on_a_real_backend_sees_only_its_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg = {"gpu": {"backend": "nvml"}, "workload": {"kind": "tp", "tp": 2}}
    assert sweep.gpus_needed(cfg) == 2 and sweep.gpus_available(cfg, cores=2) == 4
    hybrid = {**cfg, "workload": {"kind": "hybrid", "tp": 2, "pp": 2, "dp": 2}}
    assert sweep.gpus_needed(hybrid) == 8
    command = lambda argv, nproc=1: {**cfg, "workload": {"kind": "command", "command": argv, "nproc": nproc}}
    assert sweep.gpus_needed(command(["torchrun", "--nproc-per-node", "3", "train.py"])) == 3  # was 1
    assert sweep.gpus_needed(command(["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "t.py"])) == 2
    assert sweep.gpus_needed(command(["python", "train.py"], nproc=2)) == 2  # EMO starts it under torchrun
    assert sweep.gpus_needed(command(["python", "train.py"])) == 1
    assert sweep.gpus_needed(command(["deepspeed", "train.py"])) == 4  # no count said: every visible GPU
    with sweep.gpu_for_stage(cfg, 2, tmp_path) as ids:
        assert ids == ["4", "5"] and os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    with sweep.gpu_for_stage({"gpu": {"backend": "sim"}}, 1, tmp_path) as ids:  # the virtual GPU: nothing to hold
        assert ids == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    with pytest.raises(ValueError, match="needs 8 GPUs but 4 are visible"):
        with sweep.gpu_for_stage({**cfg, "workload": {"kind": "tp", "tp": 8}}, 8, tmp_path):
            pass


def mlflow_runs(results: Path):
    from mlflow.tracking import MlflowClient

    from emo.workflow.tracking import search

    uri = f"sqlite:///{results}/mlflow.db"
    return search(uri, "emo"), MlflowClient(tracking_uri=uri)


@pytest.mark.slow
def test_parallel_sweep_logs_one_parent_and_a_complete_child_per_job(tmp_path, monkeypatch, capfd):
    from emo.policy import FrequencyPolicy

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    args = ["run", "-m", "-j", "2", f"results={results}", *SMALL, "optimizer=emo,zeus", "budget=0.02,0.05"]
    assert cli_main(args) == 0
    lines = [ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("emo: ")]
    assert len(lines) == 4 and all(" ES " in ln and " PL " in ln for ln in lines)
    assert any("policy " in ln and "policy.json" in ln for ln in lines)

    assert (
        cli_main([*args, "--report", str(tmp_path / "report.html")]) == 0
    )  # nothing runs; every metric is still logged
    report = (tmp_path / "report.html").read_text()
    assert "compare.tsv" in report and "jobs.tsv" in report and "energy_time_a100_tp2.png" in report
    assert len([ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("emo: ")]) == 4
    df, client = mlflow_runs(results)
    parents = df[df["tags.mlflow.parentRunId"].isna()]
    children = df[df["tags.mlflow.parentRunId"].notna()]
    assert len(parents) == 2 and len(children) == 8  # nothing lost, nothing twice
    assert set(parents["params.sweep.budget"]) == {"0.02,0.05"} and set(parents["params.sweep.jobs"]) == {"4"}
    for _, group in children.groupby("tags.mlflow.parentRunId"):
        assert sorted(group["tags.mlflow.runName"]) == sorted(
            f"optimizer={o} budget={b}" for o in ("emo", "zeus") for b in ("0.02", "0.05")
        )
    assert (children["status"] == "FINISHED").all()
    assert children["metrics.validate.es_pct"].notna().all() and children["metrics.trace.trace_wall_s"].notna().all()
    emo_runs = children[children["params.optimizer.name"] == "emo"]
    assert emo_runs["metrics.optimize.predicted_time_s"].notna().all()
    for run_id in emo_runs["run_id"]:
        names = {a.path for d in ("optimize", "validate", "plots") for a in client.list_artifacts(run_id, d)}
        assert {"optimize/policy.json", "validate/result.json", "plots/energy_time_a100_tp2.png"} <= names
        policy = FrequencyPolicy.load(client.download_artifacts(run_id, "optimize/policy.json", str(tmp_path)))
        changes = any(len({s.sm_mhz for s in steps}) > 1 for steps in policy.steps.values())
        # a timeline only where a clock changes: one clock all iteration shows nothing the table does not
        assert any(n.startswith("plots/timeline_") for n in names) == changes
    for run_id in children[children["params.optimizer.name"] == "zeus"]["run_id"]:  # one power limit, one clock
        assert not any(a.path.startswith("plots/timeline_") for a in client.list_artifacts(run_id, "plots"))
    check_timeline(results)
    first, second = (children[children["tags.mlflow.parentRunId"] == p] for p in parents["run_id"])
    assert sorted(first["metrics.validate.es_pct"]) == sorted(second["metrics.validate.es_pct"])


def check_timeline(results: Path) -> None:
    """The timeline draws kernels where the predictor puts them under a method's clocks: at the max
    clock, at a static low clock (slower, every kernel at that clock), and under EMO's policy (the
    time the optimize stage predicted, each kernel at one of the policy's clocks)."""
    import json

    from emo.model.predict import load_pack_tables
    from emo.policy import FrequencyPolicy
    from emo.report.plots import planned_latency_ms, predicted_timeline

    covers = lambda d: json.loads((d / "config.json").read_text())["covers"]
    opt = next(p.parent for p in sorted(results.glob("optimize/*/policy.json")))
    pack, fit = (results / st / covers(opt)["inputs"][st] for st in ("pack", "fit"))
    graph = results / "graph" / covers(pack)["inputs"]["graph"]
    policy = FrequencyPolicy.load(opt / "policy.json")
    clocks = load_pack_tables(pack, fit).clocks_mhz.tolist()
    top = predicted_timeline(pack, fit, graph, None, None)
    low = predicted_timeline(pack, fit, graph, FrequencyPolicy.static("a100", list(policy.steps), min(clocks)), None)
    latency = planned_latency_ms(opt, covers(opt)["config"]["optimizer"]["name"])  # the measured latency the plan used
    assert latency is not None and latency > 0
    mine = predicted_timeline(pack, fit, graph, policy, latency)
    kernels = lambda tl: tl.work[tl.work["kind"] == "kernel"]
    assert set(kernels(top)["sm_mhz"]) == {max(clocks)} and set(kernels(low)["sm_mhz"]) == {min(clocks)}
    assert low.time_s > 1.5 * top.time_s and low.t1 - low.t0 > 1.5 * (top.t1 - top.t0)
    span = lambda tl: (kernels(tl)["start"] + kernels(tl)["dur"]).max() - kernels(tl)["start"].min()
    assert span(low) > 1.5 * span(top)
    # one scenario of the stage's prediction (which is an expectation over the latencies): every
    # request at the mean latency the plan assumed
    from emo.model.predict import predict

    assert mine.time_s == pytest.approx(
        predict(load_pack_tables(pack, fit), policy, transition_ms=latency).time_s, rel=1e-9
    )
    assert set(kernels(mine)["sm_mhz"]) <= {s.sm_mhz for ss in policy.steps.values() for s in ss}


def test_a_sweep_too_large_for_a_command_line_reaches_snakemake_whole(tmp_path, monkeypatch):
    # Linux refuses one argument over 128 KiB: the 810 jobs of paper_tables.py once stopped there
    from emo.workflow import run

    jobs = [[f"results={tmp_path}", f"gpu.seed={i}", "optimizer=emo", "budget=0.02"] for i in range(2000)]
    seen = {}

    class Snakemake:
        def __init__(self, argv, **kw):
            seen["argv"] = argv
            seen["config"] = Path(argv[argv.index("--configfile") + 1]).read_text()

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Snakemake)
    monkeypatch.chdir(tmp_path)
    assert run.snakemake(jobs, 1, dry_run=True) is None
    assert max(len(a) for a in seen["argv"]) < 4096
    assert json.loads(seen["config"])["jobs"] == jobs
    assert not Path(seen["argv"][seen["argv"].index("--configfile") + 1]).exists()  # handed over, then removed
