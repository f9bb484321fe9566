"""`emo run [-m] KEY=VALUE ...`: compose the configuration and run the Snakemake pipeline on it.

With -m (multirun), comma lists sweep: `emo run -m budget=0.02,0.05 workload.tp=2,4,8` runs every
combination one after the other (parallel Snakemake runs in one folder would lock each other), each a
child of one MLflow parent run; the content-hashed stage folders make jobs share what they can.

A run holds its results folder's lock (emo.locks) and runs Snakemake without Snakemake's own lock,
which lives in the working directory and outlives a killed run. A failure ends with one line
(`emo: error: FILE: problem (stage S, log L)`), the traceback only in the stage log or with
--verbose; Ctrl-C, SIGTERM and SIGHUP stop the jobs and end with one line, exit 128 + the signal.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
from pathlib import Path

from emo import errors, locks
from emo.plan import ROOT, compose


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline (Snakemake) on a Hydra-composed configuration")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=pp workload.pp=4 budget=0.05")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    p.add_argument("-c", "--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. trace)")
    p.add_argument("--unlock", action="store_true",
                   help="remove what killed runs left (Snakemake locks in this folder, hidden .tmp and empty stage folders)")
    p.add_argument("-v", "--verbose", action="store_true", help="show Snakemake's log and the stages' tracebacks")
    p.set_defaults(func=main)


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The jobs of a run: one without -m; the cartesian product of the sweep values with it."""
    if not multirun:
        return [list(overrides)]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = []
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*choices)]


def main(args: argparse.Namespace) -> int:
    if args.unlock:
        return unlock(compose(args.overrides))
    jobs = expand(args.overrides, args.multirun)
    cfgs = [compose(job) for job in jobs]  # every job's configuration is checked before any runs
    if args.verbose:
        os.environ[errors.VERBOSE_ENV] = "1"
    held = contextlib.nullcontext() if args.dry_run else \
        locks.hold([Path(c["results"]) for c in cfgs], "emo run " + " ".join(args.overrides))
    try:
        with held, errors.signals_raise():
            return run_jobs(args, jobs, cfgs)
    except KeyboardInterrupt as e:
        print(interrupted_line(e), file=sys.stderr)
        return errors.exit_status(e)


def run_jobs(args: argparse.Namespace, jobs: list[list[str]], cfgs: list[dict]) -> int:
    from emo import tracking

    failed = 0
    with tracking.sweep_run(cfgs[0]["tracking"], "sweep " + " ".join(args.overrides)) if args.multirun and not args.dry_run else contextlib.nullcontext() as parent:
        for job, cfg in zip(jobs, cfgs):
            print(f"emo: job {' '.join(job) or '(defaults)'}", file=sys.stderr)
            if args.dry_run:
                ok = snakemake(job, args.cores, dry_run=True, until=args.until, verbose=args.verbose) is None
            else:
                error, run_id = None, None
                try:
                    with tracking.job_run(cfg, " ".join(job) or "defaults", parent) as run_id:
                        error = snakemake(job, args.cores, run_id=run_id, until=args.until, verbose=args.verbose)
                except KeyboardInterrupt as e:
                    tracking.finish(cfg["tracking"], run_id, "KILLED", errors.one_line(e))
                    raise
                if error:
                    tracking.finish(cfg["tracking"], run_id, "FAILED", error)
                ok = error is None
            failed += not ok
    if failed and parent:
        tracking.finish(cfgs[0]["tracking"], parent, "FAILED", f"{failed} of {len(jobs)} jobs failed")
    return 1 if failed else 0


def interrupted_line(e: KeyboardInterrupt) -> str:
    return (f"emo: interrupted ({errors.signal_name(e)}): the run was stopped; finished stages are kept and "
            "the next `emo run` resumes from them")


def unlock(cfg: dict) -> int:
    """`emo run --unlock`: Snakemake's locks in this folder (left by a killed plain `snakemake`),
    hidden .tmp and empty stage folders; refused while a live `emo run` holds the results folder."""
    removed = []
    snake_locks = Path.cwd() / ".snakemake" / "locks"
    with locks.hold([Path(cfg["results"])], "emo run --unlock") as cleaned:
        removed += cleaned
        if snake_locks.is_dir():
            for f in snake_locks.iterdir():
                f.unlink()
                removed.append(f)
    print(f"emo: unlocked {cfg['results']}: removed {len(removed)} stale item(s)"
          + (f" ({', '.join(str(p) for p in removed[:5])}{', ...' if len(removed) > 5 else ''})" if removed else ""),
          file=sys.stderr)
    return 0


def snakemake(overrides: list[str], cores: int, *, dry_run: bool = False, run_id: str | None = None,
              until: str | None = None, verbose: bool = False) -> str | None:
    """Run the Snakefile through the Snakemake API; None when it succeeded, else the error line
    (already printed). KeyboardInterrupt (or Interrupted) when a signal stopped it."""
    import tempfile

    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings,
                                          ResourceSettings)
    from emo.tracking import RUN_ID_ENV

    if run_id:
        os.environ[RUN_ID_ENV] = run_id
    fd, reports = tempfile.mkstemp(prefix="emo-errors-", suffix=".jsonl")
    os.close(fd)
    os.environ[errors.ERRORS_ENV] = reports
    keep_handlers()
    quiet = None if verbose or dry_run else {Quietness.ALL}  # a line per stage comes from the stages
    try:
        with SnakemakeApi(OutputSettings(dryrun=dry_run, quiet=quiet, show_failed_logs=False)) as api:
            workflow = api.workflow(
                resource_settings=ResourceSettings(cores=cores, resources={"gpu": 1}),
                config_settings=ConfigSettings(config={"overrides": list(overrides)}),
                snakefile=ROOT / "Snakefile",
                workdir=Path.cwd(),
            )
            dag = workflow.dag(DAGSettings(until=frozenset([until]) if until else frozenset(), force_incomplete=True))
            # our lock (emo.locks) guards the results folder; Snakemake's would outlive a kill -9
            dag.execute_workflow(executor="dryrun" if dry_run else "local",
                                 execution_settings=ExecutionSettings(lock=False))
        return None
    except Exception as e:
        return failure(e, errors.read_reports(Path(reports)))
    finally:
        os.environ.pop(RUN_ID_ENV, None)
        os.environ.pop(errors.ERRORS_ENV, None)
        Path(reports).unlink(missing_ok=True)


def keep_handlers() -> None:
    """Snakemake's scheduler makes SIGTERM "graceful" (wait for the running jobs, however long): a
    scheduler's grace period would end in SIGKILL mid-job. Keep emo's handler (errors.signals_raise:
    stop the jobs now, as Ctrl-C does) by giving the scheduler a `signal` module that leaves SIGTERM be."""
    import types

    from snakemake.scheduling import job_scheduler

    if isinstance(job_scheduler.signal, types.ModuleType):
        job_scheduler.signal = types.SimpleNamespace(SIGTERM=signal.SIGTERM, signal=lambda *a: None)


def failure(e: Exception, reports: list[dict]) -> str:
    """Print the one line that says what failed: the failing stages' own lines when they reported
    one, else Snakemake's first line; a stage stopped by a signal means the run was interrupted."""
    if errors.caught or any(r.get("killed") for r in reports):
        raise errors.Interrupted(errors.caught[-1] if errors.caught else signal.SIGINT)
    lines = [errors.stage_line(r) for r in reports] or [f"emo: error: pipeline failed: {errors.one_line(e)} (run with --verbose for Snakemake's log)"]
    for line in dict.fromkeys(lines):
        print(line, file=sys.stderr)
    return lines[0].removeprefix("emo: error: ")

