"""Failing well (issue 13): one-line errors through the pipeline, locks that cannot go stale, runs that
share a results folder, signals, MLflow run status, and recorded traces that are taken as given."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emo.config import TrackingConfig
from emo.stages import run_in_place, run_stage
from emo.workflow.plan import compose

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="needs ../shared/data/traces")


def emo(*args, cwd, timeout=600, **kw):
    return subprocess.run(
        [sys.executable, "-m", "emo.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        **kw,
    )


def spawn(*args, cwd):
    return subprocess.Popen(
        [sys.executable, "-m", "emo.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )


def runs(results: Path) -> list[dict]:
    """The runs in that folder's store (no mlflow.set_tracking_uri: it exports MLFLOW_TRACKING_URI,
    and every later `emo run` this process spawns would log into this store)."""
    from emo.workflow.tracking import search

    return search(f"sqlite:///{results}/mlflow.db", "emo").to_dict("records")


def wait_for(predicate, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    raise AssertionError("timed out")


# --------------------------------------------------------------------------- errors a person can read
def test_a_bad_recorded_trace_is_one_line_naming_the_users_file_stage_and_log(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X"')  # truncated
    res = tmp_path / "results"
    r = emo("run", "--until", "trace", "workload=recorded", f"workload.path={bad}", f"results={res}", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2  # an InputError: what it was given (docs/design.md, "Exit status")
    assert lines[-1].startswith(f"emo: error: {bad}: truncated or malformed JSON"), r.stderr
    log = next((res / "trace" / "logs").glob("*.log"))
    assert f"(stage trace, log {log})" in lines[-1]
    assert ".tmp" not in r.stderr and "Traceback" not in r.stderr and len(lines) == 1  # not Snakemake's profile line
    assert "Traceback" in log.read_text()  # the stage log is never empty
    assert [p.name for p in (res / "trace").iterdir()] == ["logs"]  # nothing half-written, no empty folder
    (run,) = runs(res)
    assert run["status"] == "FAILED" and str(bad) in run["tags.emo.trace.error"]

    v = emo(
        "run",
        "--verbose",
        "--until",
        "trace",
        "workload=recorded",
        f"workload.path={bad}",
        f"results={res}",
        cwd=tmp_path,
    )
    assert v.returncode == 2 and "Traceback" in v.stderr, v.stderr[-2000:]
    assert v.stderr.strip().splitlines()[-1] == lines[-1], v.stderr[-2000:]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--until", "nosuch"], "--until nosuch: not a stage (one of trace, graph, calibrate,"),
        (["--report", "x.txt"], "--report x.txt: Snakemake writes a report as .html or .zip"),
        (["--report", "nodir/x.html"], "--report nodir/x.html: no folder nodir"),
    ],
)
def test_run_flags_are_checked_before_anything_runs(tmp_path, monkeypatch, capsys, flags, says):
    from emo.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    assert cli_main(["run", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"emo: error: {says}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_stage_failing_on_a_full_disk_reports_the_path_not_the_hidden_copy(tmp_path, monkeypatch):
    import emo.stages.graph as graph_stage

    def full(cfg, inputs, out):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "nodes.parquet"))

    monkeypatch.setattr(graph_stage, "run", full)
    reports = tmp_path / "errors.jsonl"
    monkeypatch.setenv("EMO_ERRORS", str(reports))
    out, log = tmp_path / "graph" / "abc", tmp_path / "graph" / "logs" / "abc.log"
    params = {"cfg": compose([f"results={tmp_path}", "tracking.enabled=false"]), "hash": "abc", "covers": {}}
    with pytest.raises(OSError):
        run_stage("graph", params, {}, out, str(log))
    (rec,) = [json.loads(ln) for ln in reports.read_text().splitlines()]
    assert rec == {
        "stage": "graph",
        "error": f"{out / 'nodes.parquet'}: No space left on device",
        "log": str(log),
        "killed": False,
        "folder": str(out),
        "status": 1,  # a failure of the stage, not of its input (errors.InputError: 2)
    }  # the folder: no job from it shows a result
    assert "Traceback" in log.read_text() and not list(out.parent.glob(".*.tmp"))


def test_results_folder_that_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = emo("run", f"results={blocker / 'results'}", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "cannot write to the results folder" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_results_folder_is_one_line(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    res.chmod(0o555)
    r = emo("run", f"results={res}", cwd=tmp_path)
    res.chmod(0o755)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot write" in r.stderr


# --------------------------------------------------------------------------- locks and concurrency
def test_stage_files_are_as_readable_as_the_umask_lets(tmp_path):
    """Written through a temporary name, yet with the mode a plain open gives (mkstemp's is 0600):
    a results folder on a shared box is read by the others the umask lets."""
    from emo.io import write_json

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        os.umask(0o077)
        write_json(tmp_path / "b.json", {"x": 1})
    finally:
        os.umask(old)
    assert [oct((tmp_path / n).stat().st_mode & 0o777) for n in ("a.json", "b.json")] == ["0o644", "0o600"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from emo.workflow import locks
    with locks.hold([Path(sys.argv[1])], "emo run workload=pp"):
        print("held", flush=True)
        time.sleep(120)
""")


def test_a_live_run_holding_the_results_folder_is_named(tmp_path):
    res = tmp_path / "shared-results"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(res)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        other = tmp_path / "elsewhere"
        other.mkdir()
        for args in (("run", "--until", "trace"), ("run", "--unlock")):
            r = emo(*args, f"results={res}", cwd=other)  # another working directory, the same results
            assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
            assert f"in use by another emo run (pid {holder.pid}, `emo run workload=pp` in {tmp_path}" in r.stderr
            assert f"kill {holder.pid}" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert not (res / "trace").exists()


def test_two_runs_at_once_on_a_fresh_folder_from_two_working_directories(tmp_path):
    res = tmp_path / "results"
    cwds = [tmp_path / "a", tmp_path / "b"]
    for c in cwds:
        c.mkdir()
    procs = [spawn("run", "--until", "trace", f"results={res}", cwd=c) for c in cwds]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    codes = [p.returncode for p in procs]
    for err, code in zip(errs, codes):
        assert "Traceback" not in err and "already exists" not in err, err
        assert code == 0 or (code == 2 and "in use by another emo run" in err), err
    assert 0 in codes


def _open_store(uri: str, q) -> None:
    try:
        from emo.workflow import tracking

        tracking.open_store(TrackingConfig(uri=uri))
        q.put("ok")
    except Exception as e:  # the race shows as sqlalchemy's "table ... already exists"
        q.put(f"{type(e).__name__}: {e}"[:300])


def test_processes_opening_a_fresh_mlflow_store_at_once_do_not_race(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    uri = f"sqlite:///{tmp_path}/r/mlflow.db"
    ps = [ctx.Process(target=_open_store, args=(uri, q)) for _ in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(300)
    assert sorted(q.get(timeout=5) for _ in ps) == ["ok"] * 3


def test_unlock_removes_what_dead_runs_left(tmp_path):
    res = tmp_path / "results"
    (res / "trace" / ".0123456789ab.x1y2z3w4.tmp").mkdir(parents=True)
    (res / "trace" / "0123456789ab").mkdir()  # an empty stage folder of a killed run
    (res / "graph" / "def").mkdir(parents=True)
    (res / "graph" / "def" / "config.json").write_text("{}")  # a finished one: kept
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text(
        str(res / "trace" / "0123456789ab" / "events.parquet")
    )  # plain snakemake, killed
    r = emo("run", "--unlock", f"results={res}", cwd=tmp_path)
    assert r.returncode == 0 and "removed 3 stale item(s)" in r.stderr, r.stderr
    assert sorted(p.name for p in (res / "trace").iterdir()) == []
    assert (res / "graph" / "def" / "config.json").exists() and not list(locks.iterdir())


def _calibrate_started(res: Path) -> bool:
    return (
        any("started" in p.read_text() for p in (res / "calibrate" / "logs").glob("*.log"))
        if (res / "calibrate" / "logs").is_dir()
        else False
    )


@pytest.mark.slow
def test_kill_9_then_the_next_run_works_and_cleans_up(tmp_path):
    res = tmp_path / "results"
    p = spawn("run", "--until", "calibrate", f"results={res}", "-c", "1", cwd=tmp_path)
    wait_for(lambda: _calibrate_started(res))
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert list((res / "calibrate").glob(".*.tmp"))  # what the killed stage left
    locks = tmp_path / ".snakemake" / "locks"  # and a stale Snakemake lock, as plain snakemake leaves
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.output.lock").write_text(str(res / "calibrate"))
    r = emo("run", "--until", "trace", f"results={res}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not list((res / "calibrate").glob(".*.tmp"))
    assert [d.name for d in (res / "calibrate").iterdir() if d.name != "logs"] == []  # the empty folder too


def test_kill_9_of_emo_run_alone_stops_its_stages_too(tmp_path):
    """`kill -9 PID` reaches emo run only: its running stage must not outlive it (it would run on
    beside the next run, which removes its hidden folder as a dead run's)."""
    import psutil

    res = tmp_path / "results"
    p = spawn("run", "--until", "calibrate", f"results={res}", "-c", "1", cwd=tmp_path)
    wait_for(lambda: _calibrate_started(res))
    stages = psutil.Process(p.pid).children(recursive=True)
    assert stages
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    gone, alive = psutil.wait_procs(stages, timeout=15)  # a calibration runs longer than that
    survivors = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            survivors.append((proc.status(), " ".join(proc.cmdline())[-80:]))
            proc.kill()
    assert not alive, survivors
    assert not list((res / "calibrate").glob("*/config.json"))  # stopped, not run to its end
    assert not list((res / "calibrate").glob(".*.tmp"))  # the stage removed its own hidden folder


def test_a_stage_whose_run_died_before_it_watched_stops_at_once():
    """kill -9 of emo run between its forking a stage and the stage's prctl: the stage's parent is
    already the reaper, so it asks after the run itself (locks.RUN_ENV); a live run, a run on another
    machine (a cluster job) or none (plain snakemake) lets it run."""
    import socket

    import psutil

    from emo.workflow import locks

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", ""])  # exited, not yet waited for
    wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE)
    host = socket.gethostname()
    stage = [sys.executable, "-c", "from emo.workflow.locks import stop_with_parent; stop_with_parent(); print('ran')"]
    for run, ran in [
        (f"{host}:{dead.pid}", False),
        (f"{host}:{zombie.pid}", False),
        (f"{host}:{os.getpid()}", True),
        (f"elsewhere:{dead.pid}", True),
        ("", True),
    ]:
        p = subprocess.run(stage, env={**os.environ, locks.RUN_ENV: run}, capture_output=True, text=True, timeout=60)
        assert (p.returncode, p.stdout.strip()) == ((0, "ran") if ran else (-signal.SIGTERM, "")), (run, p.stderr)
    zombie.wait()


def test_a_store_failing_after_an_interrupt_keeps_the_interrupt_line_and_status(tmp_path, monkeypatch, capsys):
    """Logging the KILLED run may fail too (a store folder it may not write): said in one line, but
    the interrupt is what ended the run, so its line and 128 + signal stay."""
    from emo import cli, errors
    from emo.cli import run
    from emo.workflow import sweep

    def interrupted(*a, **k):
        raise errors.Interrupted(signal.SIGTERM)

    def store_fails(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "store"))

    monkeypatch.setattr(run, "run_jobs", interrupted)
    monkeypatch.setattr(sweep, "finish", store_fails)
    assert cli.main(["run", f"results={tmp_path / 'r'}"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"emo: error: {tmp_path / 'store'}: Permission denied"
    assert err[-1].startswith("emo: interrupted (SIGTERM)") and len(err) == 2


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_run_with_one_line_and_128_plus_signal(tmp_path, sig):
    res = tmp_path / "results"
    p = spawn("run", "--until", "calibrate", f"results={res}", "-c", "1", cwd=tmp_path)
    wait_for(lambda: _calibrate_started(res))
    t0 = time.monotonic()
    p.send_signal(sig)  # to emo run only (a `kill`); it passes the signal on to its jobs
    out, err = p.communicate(timeout=120)
    assert time.monotonic() - t0 < 30  # the stage stopped; it did not run to its end
    assert p.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1].startswith(f"emo: interrupted ({signal.Signals(sig).name})")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not list((res / "calibrate").glob(".*.tmp"))
    assert {r["status"] for r in runs(res)} == {"KILLED"}


# --------------------------------------------------------------------------- recorded traces
def _recorded_cfg(path: Path, tmp_path: Path) -> dict:
    return compose(["workload=recorded", f"workload.path={path}", f"results={tmp_path / 'r'}"])


@needs_traces
def test_a_recorded_folder_gives_its_trace_files_only(tmp_path):
    src = tmp_path / "ranks"
    src.mkdir()
    shutil.copy(TRACES / "hta_event_sync_a100_1stream.json.gz", src / "rank0.json.gz")
    (src / "notes.txt").write_text("not a trace")
    (src / "sub").mkdir()  # a sub-folder (once: IsADirectoryError)
    (src / "sub" / "rank9.json").write_text("{}")
    outside = tmp_path / "outside.json"
    shutil.copy(TRACES / "hta_event_sync_a100_3stream.json.gz", outside)
    (src / "escape.json").symlink_to(outside)  # a link that leaves the folder: not followed
    (src / "hostname").symlink_to("/etc/hostname")
    out = tmp_path / "out"
    metrics = run_in_place("trace", _recorded_cfg(src, tmp_path), {}, out)
    assert sorted(p.name for p in (out / "kineto").iterdir()) == ["rank0.json.gz"]
    assert metrics["ranks"] == 1 and metrics["events"] > 0


@needs_traces
def test_an_nsys_sqlite_export_works_as_workload_path(tmp_path):
    out = tmp_path / "out"
    metrics = run_in_place("trace", _recorded_cfg(TRACES / "pipit_nsys_cloverleaf_a100.sqlite", tmp_path), {}, out)
    assert metrics["kernels"] > 0 and (out / "events.parquet").exists()


def test_a_truncated_recorded_file_is_named_as_the_user_gave_it(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text('{"traceEvents": [')
    with pytest.raises(ValueError) as e:
        run_in_place("trace", _recorded_cfg(bad, tmp_path), {}, tmp_path / "out")
    assert str(e.value).startswith(f"{bad}: ") and "kineto" not in str(e.value)


def test_a_folder_without_trace_files_says_so(tmp_path):
    src = tmp_path / "empty"
    src.mkdir()
    (src / "readme.md").write_text("")
    with pytest.raises(ValueError, match="folder holds no trace files"):
        run_in_place("trace", _recorded_cfg(src, tmp_path), {}, tmp_path / "out")


def test_a_signal_inside_code_that_can_only_print_its_error_is_not_printed_and_still_stops(monkeypatch):
    import gc
    import os
    import weakref

    from emo.errors import Interrupted, caught, signals_raise

    printed = []  # what Python would print as "Exception ignored in ...", with its traceback
    monkeypatch.setattr(sys, "unraisablehook", lambda u: printed.append(u.exc_type))

    class Held:
        pass

    with pytest.raises(Interrupted), signals_raise():
        obj = Held()
        # the signal arrives while a weakref callback runs (as in the import system's module locks)
        ref = weakref.ref(obj, lambda _: os.kill(os.getpid(), signal.SIGINT))  # noqa: F841
        del obj
        gc.collect()
        for _ in range(2000):  # the code after the callback: the signal is raised here, once
            time.sleep(0.001)
        pytest.fail("the signal was swallowed with the callback's error")
    assert printed == []
    assert caught == [signal.SIGINT]
