"""MLflow logging: the embedded store (`sqlite:///results/mlflow.db`) needs no server.

`emo run` opens one parent run per sweep and one child run per job and passes the child's id to the
stages through EMO_MLFLOW_RUN_ID; a stage run by plain `snakemake` opens a run of its own.
A failed stage tags the run with its error line (`emo.<stage>.error`) and a failed or killed job ends
FAILED or KILLED. Opening the store is serialised by a file lock beside the database, so processes
that start at once on a fresh folder do not race to create MLflow's tables.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

RUN_ID_ENV = "EMO_MLFLOW_RUN_ID"
logging.getLogger("alembic").setLevel(logging.WARNING)
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."


def _mlflow(tracking_cfg: dict):
    import mlflow

    uri, name = tracking_cfg["uri"], tracking_cfg["experiment"]
    store = Path(uri.removeprefix("sqlite:///")).resolve().parent if uri.startswith("sqlite:///") else None
    mlflow.set_tracking_uri(uri)
    with _store_lock(store):
        if store and mlflow.get_experiment_by_name(name) is None:
            # artifacts beside the database, not in ./mlruns of whatever folder the user is in
            with contextlib.suppress(mlflow.exceptions.MlflowException):  # another stage created it first
                mlflow.create_experiment(name, artifact_location=(store / "mlartifacts").as_uri())
        mlflow.set_experiment(name)
    return mlflow


@contextlib.contextmanager
def _store_lock(store: Path | None):
    """Exclusive while the first process creates the database's tables (the others wait)."""
    if store is None:
        yield
        return
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".mlflow.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def stage_failed(cfg: dict, stage: str, stage_hash: str, error: str, *, killed: bool = False) -> None:
    """Tag the job's run with the stage's error line; a stage run on its own gets a run that ends
    FAILED (KILLED when a signal stopped it). The job's run itself is ended by `emo run` (finish)."""
    tracking = cfg["tracking"]
    if not tracking["enabled"]:
        return
    mlflow = _mlflow(tracking)
    run_id = os.environ.get(RUN_ID_ENV)
    if run_id:
        mlflow.MlflowClient().set_tag(run_id, f"emo.{stage}.error", error[:5000])
        return
    mlflow.start_run(run_name=f"{stage}-{stage_hash}")
    mlflow.log_params(flatten({k: cfg[k] for k in ("gpu", "workload", "optimizer", "budget", "results") if k in cfg}))
    mlflow.set_tags({f"emo.{stage}.hash": stage_hash, f"emo.{stage}.error": error[:5000]})
    mlflow.end_run("KILLED" if killed else "FAILED")


def finish(tracking_cfg: dict, run_id: str | None, status: str, error: str | None = None) -> None:
    """End a run (after its `with` block) as FAILED or KILLED, the error line as the `emo.error` tag."""
    if not run_id or not tracking_cfg["enabled"]:
        return
    client = _mlflow(tracking_cfg).MlflowClient()
    if error:
        client.set_tag(run_id, "emo.error", error[:5000])
    client.set_terminated(run_id, status)


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"workload.tp": "2", ...} (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


def log_stage(cfg: dict, stage: str, stage_hash: str, metrics: dict, artifacts: list[Path]) -> None:
    """Log a stage's numeric metrics (prefixed by the stage) into the job's run, or a run of its own."""
    tracking = cfg["tracking"]
    if not tracking["enabled"]:
        return
    mlflow = _mlflow(tracking)
    run_id = os.environ.get(RUN_ID_ENV)
    ctx = mlflow.start_run(run_id=run_id) if run_id else mlflow.start_run(run_name=f"{stage}-{stage_hash}")
    with ctx:
        if not run_id:
            mlflow.log_params(flatten({k: cfg[k] for k in ("gpu", "workload", "optimizer", "budget", "results") if k in cfg}))
        mlflow.set_tag(f"emo.{stage}.hash", stage_hash)
        mlflow.log_metrics({f"{stage}.{k}": float(v) for k, v in metrics.items() if _is_number(v)})
        for path in artifacts:
            mlflow.log_artifact(str(path), artifact_path=f"{stage}")


@contextlib.contextmanager
def job_run(cfg: dict, name: str, parent_id: str | None = None):
    """A child run for one job of a sweep, its params the resolved configuration; yields its id."""
    tracking = cfg["tracking"]
    if not tracking["enabled"]:
        yield None
        return
    mlflow = _mlflow(tracking)
    with mlflow.start_run(run_name=name, parent_run_id=parent_id, nested=parent_id is not None) as run:
        mlflow.log_params(flatten(cfg))
        yield run.info.run_id


@contextlib.contextmanager
def sweep_run(tracking: dict, name: str):
    if not tracking["enabled"]:
        yield None
        return
    mlflow = _mlflow(tracking)
    with mlflow.start_run(run_name=name) as run:
        yield run.info.run_id


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
