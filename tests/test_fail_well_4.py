"""The smaller items of issue 48 (item 8), each a one-line answer or a state that cannot lie: a
`results=` link loop or the file system's root, a password in `tracking.uri`, and an MLflow run
left RUNNING by a full disk. (The clock owner's stderr: tests/test_owner_stderr.py.)"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest

from emo.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))


def one_line(err: str, *parts: str) -> None:
    assert err.count("\n") == 1 and err.startswith("emo: error: "), err
    for p in parts:
        assert p in err, (p, err)


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_results_folder_that_is_a_link_loop_is_one_line(tmp_path, capsys, dry_run):
    """Was: a RuntimeError traceback (Symlink loop) from the lock, or Snakemake's OSError under -n."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code = main(["run", *(["-n"] if dry_run else []), "--until", "trace", f"results={loop}"])
    assert code == 2
    one_line(capsys.readouterr().err, f"results={loop}: cannot be resolved", "results=PATH")


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_file_systems_root_is_not_a_results_folder(capsys, dry_run):
    """Was: a walk of the whole file system, then a suggestion to `find / ... -exec touch` it."""
    code = main(["run", *(["-n"] if dry_run else []), "--until", "trace", "results=/"])
    assert code == 2
    err = capsys.readouterr().err
    one_line(err, "results=/: / is the root of the file system", "results=PATH")
    assert "find /" not in err


def test_a_password_in_the_tracking_uri_is_never_printed(tmp_path, capsys):
    """Was: the password in the error line, twice."""
    code = main(["run", "--until", "trace", f"results={tmp_path / 'r'}", "tracking.uri=bogus://alice:s3cret@host/db"])
    assert code == 2
    err = capsys.readouterr().err
    one_line(err, "tracking.uri: 'bogus://alice:***@host/db' is not an MLflow tracking URI")
    assert "s3cret" not in err


def test_a_job_named_by_a_password_bearing_override_prints_no_password(tmp_path):
    from test_compare_cli import fake_job

    from emo.workflow.sweep import result_line

    job = fake_job(tmp_path / "results", ["tracking.uri=http://alice:s3cret@host:5000"], 10.0, 1.0)
    (Path(job.result)).unlink()
    line = result_line(job)
    assert "alice:***@host:5000" in line and "s3cret" not in line


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("postgresql+psycopg2://u:p%40ss@db:5432/x", "postgresql+psycopg2://u:***@db:5432/x"),
        ("http://host:5000/api", "http://host:5000/api"),  # a port is no password
        ("sqlite:///results/mlflow.db", "sqlite:///results/mlflow.db"),
        ("a https://:tok@h and http://x:y@z", "a https://:***@h and http://x:***@z"),
    ],
)
def test_redact(text, want):
    from emo.errors import redact

    assert redact(text) == want


def test_a_full_disk_while_logging_leaves_no_run_running(tmp_path):
    """Was: the run created, its artifact refused (ENOSPC), and the run RUNNING in MLflow for ever."""
    from mlflow.tracking import MlflowClient
    from test_compare_cli import fake_job

    from emo.workflow import tracking

    job = fake_job(tmp_path / "results", ["workload.tp=2"], 10.0, 1.0)
    uri = job.cfg["tracking"]["uri"]

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    orig = MlflowClient.log_artifact
    MlflowClient.log_artifact = full
    try:
        with pytest.raises(ValueError, match="No space left on device"):
            tracking.log_sweep([job], "a sweep", ["workload.tp=2"])
    finally:
        MlflowClient.log_artifact = orig
    runs = tracking.search(uri, job.cfg["tracking"]["experiment"])
    assert len(runs) == 2 and set(runs["status"]) == {"FAILED"}, runs[["status"]]
