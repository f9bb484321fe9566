"""Failing well, round 3 (issue 36): no user file destroyed (outputs over inputs, devices, existing
files; temporary copies bounded; only what EMO made is cleaned), no stale or confident wrong answer."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from emo.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_analyze_errors import one_line  # noqa: E402

BUNDLED = Path(__file__).resolve().parent / "data" / "traces"
ES1 = BUNDLED / "hta_event_sync_a100_1stream.json.gz"


def cli(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- outputs never destroy a file
def test_perfetto_over_its_own_input_a_device_or_an_existing_file_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.json.gz"
    shutil.copy(ES1, trace)
    before = trace.read_bytes()
    code, _, err = cli(["analyze", trace, "--perfetto", trace], capsys)
    assert code == 2 and trace.read_bytes() == before
    one_line(err, f"--perfetto {trace}: cannot write (it is the PATH input)")
    code, _, err = cli(["analyze", trace, "--perfetto", trace, "--force"], capsys)  # never, even with --force
    assert code == 2 and trace.read_bytes() == before

    code, _, err = cli(["analyze", trace, "--perfetto", "/dev/null", "--force"], capsys)
    one_line(err, "--perfetto /dev/null: cannot write (not a regular file)")
    assert Path("/dev/null").is_char_device()

    out = tmp_path / "out.json"
    out.write_text("mine")
    code, _, err = cli(["analyze", trace, "--perfetto", out], capsys)
    one_line(err, "it exists; pass --force to replace it")
    assert out.read_text() == "mine"
    assert cli(["analyze", trace, "--perfetto", out, "--force"], capsys)[0] == 0 and "traceEvents" in out.read_text()

    code, _, err = cli(["analyze", trace, "--perfetto", tmp_path / "no" / "such" / "x.json"], capsys)
    one_line(err, f"no folder {tmp_path / 'no' / 'such'}")
    assert not (tmp_path / "no").exists()

    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    code, _, err = cli(["analyze", trace, "--perfetto", link], capsys)
    one_line(err, "a symbolic link")
    assert link.is_symlink()


def test_model_fit_out_over_its_bench_input_is_refused(tmp_path, capsys):
    bench = tmp_path / "b.csv"
    bench.write_text("name,sm_mhz,time_s,energy_j\na,1000,1.0,100\na,1500,0.7,110\n")
    targets = tmp_path / "t.csv"
    targets.write_text("name,sm_mhz,time_s,energy_j\nk,1500,0.1,10\n")
    before = bench.read_bytes()
    code, _, err = cli(["model", "fit", "--bench", bench, "--targets", targets, "--out", bench], capsys)
    one_line(err, f"--out {bench}: cannot write (it is the --bench input)")
    assert code == 2 and bench.read_bytes() == before
    code, _, err = cli(["model", "fit", "--bench", bench, "--targets", targets, "--out", targets, "--force"], capsys)
    one_line(err, "it is the --targets input")


# --------------------------------------------------------------------------- temporary copies are bounded and removed
def test_a_pipe_or_device_is_copied_only_up_to_a_bound(tmp_path, capsys, monkeypatch):
    import tempfile

    from emo.trace import read

    monkeypatch.setattr(read, "SPOOL_LIMIT_BYTES", 8 << 20)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, _, err = cli(["analyze", "/dev/zero"], capsys)
    assert code == 2
    one_line(err, "/dev/zero: more than 8 MiB from a pipe or device: refused")
    assert list(tmp_path.iterdir()) == []  # the copy is gone


def test_sigterm_while_a_pipe_is_copied_removes_the_copy(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen(
        [sys.executable, "-m", "emo.cli", "analyze", "/dev/zero"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(tmp_path)},
    )
    end = time.monotonic() + 60
    while not any(tmp_path.glob("emo-trace-*/trace")) and time.monotonic() < end and p.poll() is None:
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 128 + signal.SIGTERM and err == "emo: interrupted (SIGTERM)\n", err
    assert list(tmp_path.iterdir()) == []


def test_a_gzip_bomb_is_refused_before_it_is_held_in_memory(tmp_path, capsys):
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (200 << 20) + b"]}"))
    code, _, err = cli(["analyze", bomb], capsys)
    assert code == 2
    one_line(err, f"{bomb}: inflates to more than 64 MiB", "a gzip bomb?")


# --------------------------------------------------------------------------- EMO deletes only what it made
def test_cleanup_removes_only_what_emo_made(tmp_path):
    from emo.workflow.locks import cleanup

    res = tmp_path / "results"
    mine = [
        res / "trace" / ".0123456789ab.emo-stage-k2j4_x9q.tmp",
        res / "trace" / ".0123456789ab.x1y2z3w4.tmp",
        res / "graph" / "0123456789ab",
        res / ".emo-errors-4242.jsonl",
        res / ".emo-plan-4242.pickle",
        res / ".emo-jobs-4242.json",
    ]
    theirs = [
        res / "trace" / ".vscode.tmp" / "settings.json",
        res / "trace" / "notes",
        res / "trace" / ".cache.tmp",
        res / "graph" / "0123456789abX",
        res / "emo-errors-1.jsonl",
        res / ".emo-plan-x.pickle",
    ]
    for p in mine[:3] + theirs[1:4]:
        p.mkdir(parents=True)
    for p in [*mine[3:], theirs[0], theirs[4], theirs[5]]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    assert sorted(cleanup(res)) == sorted(mine)
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in mine)


def test_a_stage_marks_its_hidden_folder():
    import re

    from emo.workflow.locks import STAGE_TMP

    src = (Path(__file__).resolve().parents[1] / "emo" / "stages" / "__init__.py").read_text()
    prefix = re.search(r'mkdtemp\(prefix=f"\.\{out\.name\}\.([^"]+)", suffix="\.tmp"', src).group(1)
    assert STAGE_TMP.fullmatch(f".0123456789ab.{prefix}abc_123x.tmp")


# --------------------------------------------------------------------------- calibrations
def _cal_folder(tmp_path, gpu="a100") -> Path:
    d = tmp_path / f"cal-{gpu}"
    d.mkdir()
    pd.DataFrame({"bench": ["a"], "sm_mhz": [1500], "time_s": [1e-3], "energy_j": [0.2]}).to_parquet(
        d / "bench.parquet"
    )
    (d / "calibration.json").write_text(json.dumps({"gpu": gpu, "gpu_model": f"NVIDIA {gpu.upper()}", "driver": "1"}))
    return d


def _rewrite(src: Path, dst: Path, **changes) -> Path:
    import zipfile

    with zipfile.ZipFile(src) as z:
        manifest, data = json.loads(z.read("manifest.json")), z.read("bench.parquet")
    with zipfile.ZipFile(dst, "w") as z:
        z.writestr("manifest.json", json.dumps({**manifest, **changes}))
        z.writestr("bench.parquet", data)
    return dst


def test_a_calibrations_id_covers_its_gpu_field(tmp_path):
    from emo.cli.calibration import calibration_id, export_calibration, import_calibration

    m = export_calibration(_cal_folder(tmp_path), tmp_path / "a100.emocal")
    relabelled = _rewrite(tmp_path / "a100.emocal", tmp_path / "h100.emocal", gpu="h100")
    with pytest.raises(ValueError, match="does not match its manifest's hash"):
        import_calibration(relabelled, tmp_path / "dst", "h100")
    # a file from before the id covered gpu: read, but installed only with --force
    legacy = _rewrite(
        tmp_path / "a100.emocal",
        tmp_path / "old.emocal",
        gpu="h100",
        id=calibration_id(m["gpu_model"], m["driver"], m["bench_sha256"]),
    )
    with pytest.raises(ValueError, match="exported before a calibration's id covered its gpu field"):
        import_calibration(legacy, tmp_path / "dst", "h100")
    assert import_calibration(legacy, tmp_path / "dst", "h100", force=True)["gpu"] == "h100"
    # gpu: unknown could be any GPU's
    export_calibration(_cal_folder(tmp_path, "unknown"), tmp_path / "u.emocal")
    with pytest.raises(ValueError, match="a calibration of an unknown GPU .* pass --force"):
        import_calibration(tmp_path / "u.emocal", tmp_path / "dst2", "h100")
    assert not (tmp_path / "dst2").exists()


def test_a_zip_bomb_calibration_is_refused_before_it_is_inflated(tmp_path):
    import zipfile

    from emo.cli.calibration import read_calibration

    bomb = tmp_path / "bomb.emocal"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", "{}")
        z.writestr("bench.parquet", b"\0" * (300 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=r"its bench.parquet inflates to 300 MiB \(more than 256 MiB\)"):
        read_calibration(bomb)


def test_calibration_import_waits_for_no_run_it_refuses_while_one_holds_the_folder(tmp_path, capsys):
    from emo.cli.calibration import export_calibration
    from emo.workflow import locks

    export_calibration(_cal_folder(tmp_path), tmp_path / "a.emocal")
    res = tmp_path / "results"
    with locks.hold([res], "emo run"):
        code, out, err = cli(["calibration", "import", tmp_path / "a.emocal", "gpu=a100", f"results={res}"], capsys)
    assert code == 2 and out == "" and "in use by another emo run" in err
    assert not list(res.glob("calibrate/*/bench.parquet"))


def test_files_dated_in_the_future_are_said_before_an_import_or_a_run(tmp_path, capsys):
    from emo.cli.calibration import export_calibration

    export_calibration(_cal_folder(tmp_path), tmp_path / "a.emocal")
    res = tmp_path / "results"
    model = res / "fit" / "0123456789ab" / "model.parquet"
    model.parent.mkdir(parents=True)
    model.write_text("")
    os.utime(model, (os.path.getmtime(model) + 86400,) * 2)  # written by a machine whose clock is a day ahead
    code, _, err = cli(["calibration", "import", tmp_path / "a.emocal", "gpu=a100", f"results={res}"], capsys)
    one_line(err, f"{model}: dated 24.0 h in the future (1 file(s) under {res})", "fix the clock")
    code, _, err = cli(["run", f"results={res}", "--until", "trace"], capsys)
    assert code == 2
    one_line(err, f"{model}: dated 24.0 h in the future")


# --------------------------------------------------------------------------- emo model fit: units and shape
@pytest.fixture(scope="module")
def ncu_tables():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_tables import sim_tables

    return sim_tables(form="ncu")


def _fit(tmp_path, capsys, bench, targets, *extra):
    bp, tp = tmp_path / "bench.csv", tmp_path / "targets.csv"
    bench.to_csv(bp, index=False)
    targets.to_csv(tp, index=False)
    return (*cli(["model", "fit", "--bench", bp, "--targets", tp, *extra], capsys), bp, tp)


def test_model_fit_warns_of_unit_slips_refuses_watts_out_of_range_and_prints_its_verdicts(ncu_tables, tmp_path, capsys):
    bench, targets = ncu_tables
    code, out, err, bp, tp = _fit(tmp_path, capsys, bench, targets)
    assert code == 0, err
    assert f"check: --bench {bp}: power_w" in out and "another unit or scale" not in err
    assert f"check: --bench {bp}: time_s falls or stays as sm_mhz rises" in out
    # a unit slip in one table: every feature read as a count peaks 1000x higher in the targets (said
    # feature by feature by emo.model.columns, which knows how each is read)
    code, _, err, bp, tp = _fit(tmp_path, capsys, bench.assign(time_s=bench["time_s"] * 1000), targets)  # ms
    assert "in the targets but" in err and "another unit or scale in one table?" in err
    counters = [c for c in targets if "__" in c and "pct" not in c]
    code, _, err, bp, tp = _fit(tmp_path, capsys, bench, targets.assign(**{c: targets[c] * 1000 for c in counters}))
    assert sum("another unit or scale in one table?" in ln for ln in err.splitlines()) >= len(counters) - 1
    code, _, err, bp, _ = _fit(tmp_path, capsys, bench.assign(power_w=bench["power_w"] * 1000), targets)  # mW
    one_line(err, f"--bench {bp}: power_w is", "outside a GPU's 1-3000 W")


def test_model_fit_refuses_a_cut_short_csv_and_conflicting_duplicates(ncu_tables, tmp_path, capsys):
    bench, targets = ncu_tables
    bp, tp = tmp_path / "bench.csv", tmp_path / "targets.csv"
    bench.to_csv(bp, index=False)
    targets.to_csv(tp, index=False)
    text = bp.read_text()
    bp.write_text(text[: len(text) - 40])  # cut mid-row
    code, _, err = cli(["model", "fit", "--bench", bp, "--targets", tp], capsys)
    one_line(err, f"--bench {bp}: line {len(bench) + 1} has", "(a file cut short, or a stray separator)")

    dup = pd.concat([bench, bench.iloc[[5]].assign(power_w=bench["power_w"].iloc[5] * 1.3)], ignore_index=True)
    code, _, err, bp, _ = _fit(tmp_path, capsys, dup, targets)
    one_line(
        err,
        f"--bench {bp}: {bench['name'].iloc[5]} at {bench['sm_mhz'].iloc[5]} MHz is measured 2 times "
        "with different power_w",
    )
    code, out, err, bp, _ = _fit(tmp_path, capsys, pd.concat([bench, bench.iloc[[5]]], ignore_index=True), targets)
    assert code == 0 and f"check: --bench {bp}: 1 identical duplicate row(s) ignored" in out


# --------------------------------------------------------------------------- emo analyze: no unsupported breakdown
def test_a_trace_without_correlation_ids_or_with_shifted_events_gets_no_breakdown(tmp_path, capsys):
    doc = json.loads(gzip.decompress(ES1.read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("args"), dict):
            e["args"].pop("correlation", None)
    bare = tmp_path / "nocorr.json"
    bare.write_text(json.dumps(doc))
    code, out, err = cli(["analyze", bare], capsys)
    assert code == 2 and out == ""
    one_line(err, f"{bare}: ", "GPU ops have no runtime call that launched them", "dependencies a critical path needs")

    doc = json.loads(gzip.decompress(ES1.read_bytes()))
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["ts"] += 500  # recorded later than anything in the trace explains
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(doc))
    code, out, err = cli(["analyze", moved], capsys)
    if code:
        one_line(err, f"{moved}: replaying its dependencies misses its recorded times by")
    else:  # a kernel may wait for nothing recorded only when nothing bound it; then the replay is exact
        assert "replay error    0.000 us" in out


NSYS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / "pipit_nsys_cloverleaf_a100.sqlite"


@pytest.mark.skipif(not NSYS.is_file(), reason="shared nsys export not present")
@pytest.mark.parametrize(
    "table, column, value, says",
    [
        (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "start",
            "'abc'",
            "table CUPTI_ACTIVITY_KIND_KERNEL, column start, row 1 holds 'abc'",
        ),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId", "NULL", "column correlationId, row 1 holds NULL"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "deviceId", "'d'", "column deviceId, row 1 holds 'd'"),
    ],
)
def test_text_or_null_in_an_nsys_column_is_one_line_naming_the_file(tmp_path, capsys, table, column, value, says):
    import sqlite3

    db = tmp_path / "t.sqlite"
    shutil.copy(NSYS, db)
    db.chmod(0o644)
    with sqlite3.connect(db) as con:
        con.execute(f"update {table} set {column} = {value} where rowid = (select min(rowid) from {table})")
    code, _, err = cli(["analyze", db], capsys)
    assert code == 2
    one_line(err, f"{db}: ", says, ": not an integer")


# --------------------------------------------------------------------------- the MLflow store
def _store(tmp_path) -> Path:
    import sqlite3

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("create table alembic_version (version_num varchar(32) not null)")
        con.execute("insert into alembic_version values ('ffffffffffff')")  # a revision of a newer MLflow
    return db


def test_a_store_written_by_a_newer_mlflow_is_one_line(tmp_path, capsys):
    db = _store(tmp_path)
    code, _, err = cli(["compare", "--uri", f"sqlite:///{db}"], capsys)
    assert code == 2
    one_line(
        err,
        f"{db}: written by a newer MLflow than the one installed",
        "schema ffffffffffff",
        "mlflow and mlflow-skinny at one version",
    )


def test_mlflow_and_mlflow_skinny_out_of_step_is_one_line(monkeypatch):
    import importlib.metadata as md

    from emo.cli.ui import in_step

    monkeypatch.setattr(md, "version", lambda name: {"mlflow": "3.17.2", "mlflow-skinny": "3.18.0"}[name])
    with pytest.raises(ValueError, match=r"mlflow 3.17.2 and mlflow-skinny 3.18.0 differ: .*'mlflow==3.18.0'"):
        in_step()


def test_a_read_only_store_is_one_line_without_mlflows_traceback(tmp_path, capsys):
    import sys

    from emo.workflow import tracking

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_compare_cli import fake_job

    res = tmp_path / "results"
    job = fake_job(res, ["workload.tp=2"], 10.0, 1.0)
    tracking.log_sweep([job], None)
    capsys.readouterr()

    def read_only(*a, **k):
        import sqlite3

        raise sqlite3.OperationalError("attempt to write a readonly database")

    from mlflow.tracking import MlflowClient

    orig = MlflowClient.create_run
    try:
        MlflowClient.create_run = lambda self, *a, **k: _wrapped(read_only)
        with pytest.raises(
            ValueError, match=r"mlflow.db: the MLflow store failed: attempt to write a readonly database$"
        ):
            tracking.log_sweep([job], None)
    finally:
        MlflowClient.create_run = orig
    assert "Traceback" not in capsys.readouterr().err


def _wrapped(fail):
    """The error as MLflow raises it: an MlflowException from SQLAlchemy's from sqlite3's."""
    import logging

    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import OperationalError

    try:
        try:
            fail()
        except Exception as e:
            raise OperationalError("INSERT INTO runs ...", {}, e) from e
    except OperationalError as e:
        logging.getLogger("mlflow.store.db.utils").exception(
            "SQLAlchemy database error. The following exception is caught."
        )
        raise MlflowException(f"(raised as a result of Query-invoked autoflush) {e}") from e


# --------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_while_mlflow_is_imported_is_one_line(tmp_path, capsys, monkeypatch):
    """The signal cut MLflow's import short in `finish`; logging the interrupted run then met the
    half-initialised module: an AttributeError traceback (2 of 3 tries)."""
    from emo import errors
    from emo.cli import run
    from emo.workflow import sweep

    def interrupted(*a, **k):
        raise errors.Interrupted(2)

    calls = []

    def half_imported(*a, **k):
        calls.append(k["killed"])
        raise AttributeError("partially initialized module 'mlflow' has no attribute 'version'")

    import sys

    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # what the retry purges, in a copy
    monkeypatch.setattr(run, "run_jobs", interrupted)
    monkeypatch.setattr(sweep, "finish", half_imported)
    code, _, err = cli(["run", f"results={tmp_path / 'r'}", "--until", "trace"], capsys)
    assert code == 130 and "Traceback" not in err
    assert calls == [True, True]  # MLflow imported afresh and tried once more
    lines = err.strip().splitlines()
    assert lines[0].startswith("emo: error: the interrupted run was not logged to MLflow: AttributeError: partially")
    assert lines[1].startswith("emo: interrupted (SIGINT)") and len(lines) == 2


@pytest.mark.parametrize("script", ["titanx_power_model.py", "hta_runner.py"])
def test_benchmark_scripts_answer_help(script):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, str(root / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr and r.stdout.strip(), r.stderr[-500:]


def test_an_unwritable_stage_folder_is_named_before_the_run(tmp_path, capsys):
    import subprocess

    res = tmp_path / "results"
    (res / "trace").mkdir(parents=True)
    if os.geteuid() == 0:  # root writes anywhere a mode forbids; an immutable folder stops it too
        if subprocess.run(["chattr", "+i", str(res / "trace")], capture_output=True).returncode:
            pytest.skip("no chattr here")
    else:
        (res / "trace").chmod(0o555)
    try:
        code, _, err = cli(["run", f"results={res}", "--until", "trace"], capsys)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(res / "trace")])
        else:
            (res / "trace").chmod(0o755)
    assert code == 2
    one_line(err, f"{res / 'trace'}: cannot write into this folder")


# --------------------------------------------------------------------------- a failed re-run, end to end
@pytest.mark.slow
def test_a_failed_rerun_of_emo_run_prints_no_earlier_result(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]

    def run():
        return subprocess.run(
            [sys.executable, "-m", "emo.cli", "run", "results=res", "-c", "2"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(root)},
        )

    first = run()
    assert first.returncode == 0 and "ES " in first.stdout, first.stderr[-2000:]
    (model,) = (tmp_path / "res" / "fit").glob("*/model.parquet")
    model.write_bytes(b"not parquet")  # newer than what optimize made from it: optimize runs again, and fails
    second = run()
    assert second.returncode == 1 and "(stage optimize, log " in second.stderr
    assert (
        "ES " not in second.stdout
        and "no result: this run failed (an earlier run's result is not shown)" in second.stdout
    )


def test_model_fit_reads_a_gzipped_csv_as_pandas_does(ncu_tables, tmp_path, capsys):
    bench, targets = ncu_tables
    bp, tp = tmp_path / "bench.csv.gz", tmp_path / "targets.csv"
    bench.to_csv(bp, index=False)  # pandas compresses by the suffix
    targets.to_csv(tp, index=False)
    code, out, err = cli(["model", "fit", "--bench", bp, "--targets", tp], capsys)
    assert code == 0, err
