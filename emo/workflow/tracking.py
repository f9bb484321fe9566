"""MLflow logging: the embedded store (`sqlite:///results/mlflow.db`) needs no server.

One writer: stages only write their `metrics.json`; when a Snakemake run ends, its main process
(`emo run`, or plain `snakemake`) logs every job from its stage folders (`log_sweep`): one parent run
per sweep with the sweep's params, a child per job with the resolved configuration as params, every
stage's metrics (also for stages reused from an earlier run) and the artifacts a reader wants. Parallel
jobs therefore never write to the SQLite store at once; `MLFLOW_TRACKING_URI` points every run at a
tracking server instead (a cluster whose jobs do not share a disk).
A job that failed ends FAILED (KILLED when a signal stopped the run) with the error line as its
`emo.error` tag. Opening the store is serialised by a file lock beside the database, so processes
that start at once on a fresh folder do not race to create MLflow's tables.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from emo.sections import TrackingConfig

logging.getLogger("alembic").setLevel(logging.WARNING)
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."


def tracking_uri(tracking_cfg: TrackingConfig) -> str:
    """The store: MLFLOW_TRACKING_URI when set (a tracking server), else the configured one."""
    return os.environ.get("MLFLOW_TRACKING_URI") or tracking_cfg.uri


# the stores MLflow itself knows (mlflow.tracking._tracking_service.utils); plugins add theirs by entry point
SCHEMES = {"", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc"}


def check_uri(tracking_cfg: TrackingConfig) -> None:
    """Refuse, before any stage runs, a URI no MLflow store answers to (importing MLflow takes seconds)."""
    from importlib.metadata import entry_points
    from urllib.parse import urlparse

    uri = tracking_uri(tracking_cfg)
    scheme = urlparse(uri).scheme.split("+")[0]  # postgresql+psycopg2://
    if scheme not in SCHEMES | {e.name for e in entry_points(group="mlflow.tracking_store")}:
        key = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "tracking.uri"
        raise ValueError(
            f"{key}: {uri!r} is not an MLflow tracking URI (e.g. sqlite:///results/mlflow.db, http://host:5000)"
        )


# a tracking server that does not answer: a few tries, then one line (MLflow's own default retries for minutes)
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


@contextlib.contextmanager
def store_errors(uri: str):
    """The store's failures as one line naming it: a file that is not an MLflow database, a full disk,
    a server that does not answer (its retries counted, see HTTP_DEFAULTS)."""
    for k, v in HTTP_DEFAULTS.items():
        os.environ.setdefault(k, v)
    where = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else uri
    db_log = logging.getLogger("mlflow.store.db.utils")  # logs a caught database error with its whole traceback
    level, db_log.level = db_log.level, logging.CRITICAL
    try:
        if uri.startswith("sqlite:///"):
            check_schema(Path(where))
        yield
    except ValueError:
        raise
    except OSError as e:
        if e.filename:
            raise
        raise ValueError(f"{where}: {e.strerror or e}") from e
    except (
        Exception
    ) as e:  # MlflowException, sqlalchemy's DatabaseError, alembic's unknown revision, requests' ConnectionError
        if type(e).__module__.split(".")[0] not in (
            "mlflow",
            "sqlalchemy",
            "alembic",
            "requests",
            "urllib3",
            "sqlite3",
        ):
            raise
        text = " ".join(str(_root_cause(e)).split())[:300]
        raise ValueError(f"{where}: the MLflow store failed: {text}") from e
    finally:
        db_log.level = level


def _root_cause(e: BaseException) -> BaseException:
    """The database's own error under MLflow's and SQLAlchemy's wrappers (a read-only file: "attempt
    to write a readonly database", not the INSERT that met it)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "orig", None) or e.__cause__
        if inner is None:
            break
        e = inner
    return e


def known_revisions() -> set[str]:
    """The schema revisions the installed MLflow can read (its alembic migrations, by file name)."""
    import mlflow

    versions = Path(mlflow.__file__).parent / "store" / "db_migrations" / "versions"
    return {p.name.split("_")[0] for p in versions.glob("*.py") if not p.name.startswith("_")}


def check_schema(db: Path) -> None:
    """Refuse, in one line, a SQLite store written by a newer MLflow than the installed one (an install
    that downgraded MLflow): MLflow would fail on it in every command, and cannot migrate it back."""
    import sqlite3

    if db.exists() and not db.is_file():  # MLflow would retry opening it for minutes
        raise ValueError(f"{db}: not a file (an MLflow SQLite store is one file)")
    if not db.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            row = con.execute("select version_num from alembic_version").fetchone()
    except sqlite3.Error:  # not a store yet, or not a database: MLflow's own error says which
        return
    if row and row[0] not in known_revisions():
        import mlflow

        raise ValueError(
            f"{db}: written by a newer MLflow than the one installed ({mlflow.__version__}; schema "
            f"{row[0]} is unknown to it): upgrade MLflow, keeping mlflow and mlflow-skinny at one version "
            "(pip install -U mlflow-skinny, and mlflow of the same version for `emo ui`)"
        )


def open_store(tracking_cfg: TrackingConfig):
    """(an MlflowClient on the store, the experiment's id), creating the experiment when it is new.
    No global state: mlflow.set_tracking_uri would export MLFLOW_TRACKING_URI to this process and its
    children, so a second run in the same process (or a job it starts) would log into the first's store."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri, name = tracking_uri(tracking_cfg), tracking_cfg.experiment
    store = Path(uri.removeprefix("sqlite:///")).resolve().parent if uri.startswith("sqlite:///") else None
    if store:
        store.mkdir(parents=True, exist_ok=True)
    with _store_lock(store), store_errors(uri):  # the first access creates MLflow's tables: one process at a time
        db = Path(uri.removeprefix("sqlite:///")) if store else None
        if db is not None and not db.exists():
            _create_store(db)
        c = MlflowClient(tracking_uri=uri)
        exp = c.get_experiment_by_name(name)
        if exp is None:
            # artifacts beside the database, not in ./mlruns of whatever folder the user is in
            with contextlib.suppress(MlflowException):  # another process created it first
                c.create_experiment(name, artifact_location=(store / "mlartifacts").as_uri() if store else None)
            exp = c.get_experiment_by_name(name)
        assert exp is not None  # created above, by this process or another
    return c, exp.experiment_id


def _create_store(db: Path) -> None:
    """A new SQLite store, created and migrated by MLflow itself under a temporary name and moved into
    place whole: a run killed during the migrations (seconds on a loaded machine) leaves no
    half-migrated store for the next run to fail on."""
    import os

    from mlflow.tracking import MlflowClient

    tmp = db.with_name(f".{db.name}.emo-new.tmp")
    tmp.unlink(missing_ok=True)  # what a killed run left
    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()  # the first access migrates
    os.replace(tmp, db)


def create_while_running(tracking_cfg: TrackingConfig):
    """Have MLflow create a new SQLite store in a thread while the pipeline runs: it builds one by
    running every schema migration it has (about a second, several on a loaded machine), which the
    logging at the end of a run into a fresh results folder would otherwise wait for. Not a daemon
    thread: a half-migrated store is never left behind; the logging waits for it (the store's lock).
    A failure is left to that logging, which says it in one line. Returns the thread, or None."""
    import threading

    uri = tracking_uri(tracking_cfg)
    if not tracking_cfg.enabled or not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).exists():
        return None
    t = threading.Thread(target=_open_quietly, args=(tracking_cfg,), name="emo-mlflow-store")
    t.start()
    return t


def _open_quietly(tracking_cfg: TrackingConfig) -> None:
    with contextlib.suppress(Exception):
        open_store(tracking_cfg)


def search(uri: str, experiment: str, filter_string: str = "") -> pd.DataFrame:
    """Every run of the experiment, newest first, as mlflow.search_runs frames them (run_id, status,
    params.*, metrics.*, tags.*), without touching MLflow's global tracking URI."""
    from mlflow.tracking import MlflowClient

    with store_errors(uri):
        return _search(MlflowClient(tracking_uri=uri), uri, experiment, filter_string)


def _search(c, uri: str, experiment: str, filter_string: str) -> pd.DataFrame:
    import pandas as pd

    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"{uri}: no MLflow experiment {experiment!r} (run `emo run` first)")
    rows, token = [], None
    while True:
        page = c.search_runs(
            [exp.experiment_id],
            filter_string,
            order_by=["attributes.start_time DESC"],
            max_results=1000,
            page_token=token,
        )
        for r in page:
            rows.append(
                {
                    "run_id": r.info.run_id,
                    "status": r.info.status,
                    "start_time": r.info.start_time,
                    **{f"params.{k}": v for k, v in r.data.params.items()},
                    **{f"metrics.{k}": v for k, v in r.data.metrics.items()},
                    **{f"tags.{k}": v for k, v in r.data.tags.items()},
                }
            )
        token = page.token
        if not token:
            return pd.DataFrame(rows)


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


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# --------------------------------------------------------------------------- a finished Snakemake run
ARTIFACTS = {"optimize": ("policy.json",), "validate": ("result.json", "pareto.parquet")}


def job_record(plans: dict) -> tuple[dict[str, float], dict[str, str], list[Path]]:
    """A job's metrics (`<stage>.<name>`), tags (`emo.<stage>.hash`) and artifacts, read from its
    stage folders: the same whether a stage ran now or was reused."""
    import json

    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    artifacts: list[Path] = []
    for stage, p in plans.items():
        mfile = p.dir / "metrics.json"
        if not (p.dir / "config.json").exists() or not mfile.exists():
            continue  # not computed (the run failed before it, or --until stopped earlier)
        tags[f"emo.{stage}.hash"] = p.hash
        metrics.update({f"{stage}.{k}": float(v) for k, v in json.loads(mfile.read_text()).items() if _is_number(v)})
        artifacts += [p.dir / name for name in ARTIFACTS.get(stage, ()) if (p.dir / name).exists()]
    return metrics, tags, artifacts


def sweep_params(cfgs: list[dict], overrides: list[str]) -> dict[str, str]:
    """A sweep's params: what every job shares, and each swept key with all its values (`sweep.<key>`)."""
    flat = [flatten(c) for c in cfgs]
    shared = {k: v for k, v in flat[0].items() if all(f.get(k) == v for f in flat[1:])}
    swept = {}
    for k in sorted({k for f in flat for k in f} - set(shared)):
        swept[f"sweep.{k}"] = ",".join(dict.fromkeys(f.get(k, "") for f in flat))[:500]
    return {**shared, **swept, "sweep.overrides": " ".join(overrides)[:500], "sweep.jobs": str(len(cfgs))}


def log_sweep(
    jobs: list,
    name: str | None,
    overrides: Sequence[str] = (),
    plots: dict[str, list[Path]] | None = None,
    *,
    error: str | None = None,
    killed: bool = False,
    failed: Collection[str] = frozenset(),
) -> dict[str, str]:
    """Log a finished Snakemake run: a child run per job (under one parent when `name` is given: a
    sweep), FINISHED when its result is there (and the job is not in `failed`: its result is an
    earlier run's), else FAILED (KILLED after a signal) with `error` as its emo.error tag. Returns
    {job name: run id}."""
    from emo.sections import TrackingConfig, typed

    tracking = typed(TrackingConfig, jobs[0].cfg["tracking"]) if jobs else None
    if tracking is None or not tracking.enabled:
        return {}
    with store_errors(tracking_uri(tracking)):
        return _log_sweep(jobs, name, overrides, plots, error=error, killed=killed, failed=failed)


def _log_sweep(
    jobs: list,
    name: str | None,
    overrides: Sequence[str],
    plots: dict[str, list[Path]] | None,
    *,
    error: str | None,
    killed: bool,
    failed: Collection[str] = frozenset(),
) -> dict[str, str]:
    from emo.sections import TrackingConfig, typed

    client, exp_id = open_store(typed(TrackingConfig, jobs[0].cfg["tracking"]))
    now = int(time.time() * 1000)
    parent = None
    open_runs: list[str] = []  # created, not yet ended: ended FAILED if logging fails (a full disk)
    try:
        if name is not None:
            parent = client.create_run(exp_id, run_name=name).info.run_id
            open_runs.append(parent)
            _batch(client, parent, params=sweep_params([j.cfg for j in jobs], list(overrides)))
        return _log_jobs(client, exp_id, jobs, parent, plots, now, open_runs, error, killed, failed)
    except BaseException:
        for run_id in open_runs:  # best effort: the store may refuse this too
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, "FAILED")
        raise


def _log_jobs(client, exp_id, jobs, parent, plots, now, open_runs, error, killed, failed) -> dict[str, str]:
    ids: dict[str, str] = {}
    ok_all = True
    for job in jobs:
        metrics, tags, artifacts = job_record(job.plans)
        if parent:
            tags["mlflow.parentRunId"] = parent
        run_id = client.create_run(exp_id, run_name=job.name, tags=tags).info.run_id
        open_runs.append(run_id)
        _batch(client, run_id, params=flatten(job.cfg), metrics=metrics, now=now)
        for path in artifacts:
            client.log_artifact(run_id, str(path), artifact_path=path.parents[1].name)  # under the stage's name
        for path in (plots or {}).get(job.name, []):
            if path.exists():
                client.log_artifact(run_id, str(path), artifact_path="plots")
        ok = (Path(job.result).exists() and job.name not in failed) or (
            error is None and not killed
        )  # --until: no result
        ok_all &= ok
        if not ok and error:
            client.set_tag(run_id, "emo.error", error[:5000])
            stage = re.search(r"\(stage (\w+),", error)
            if stage:  # the stage that failed, as the line names it
                client.set_tag(run_id, f"emo.{stage.group(1)}.error", error[:5000])
        client.set_terminated(run_id, "FINISHED" if ok else ("KILLED" if killed else "FAILED"))
        open_runs.remove(run_id)
        ids[job.name] = run_id
    if parent:
        client.set_terminated(parent, "FINISHED" if ok_all else ("KILLED" if killed else "FAILED"))
        open_runs.remove(parent)
    return ids


def _batch(client, run_id: str, params: dict | None = None, metrics: dict | None = None, now: int = 0) -> None:
    from mlflow.entities import Metric, Param

    ps = [Param(k, v) for k, v in (params or {}).items()]
    ms = [Metric(k, v, now, 0) for k, v in (metrics or {}).items()]
    for i in range(0, max(len(ps), len(ms)), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, metrics=ms[i : i + 100], params=ps[i : i + 100])
