"""`emo run [-m] KEY=VALUE ...`: compose the configuration and run the Snakemake pipeline on it.

With -m (multirun), comma lists sweep: `emo run -m budget=0.02,0.05 workload.tp=2,4,8` puts every
combination's targets into one Snakemake run (emo.sweep), so independent jobs run at once (`-j N`) and
stage folders the jobs share run once; MLflow gets one parent run and a child per job when it ends.

A run holds its results folder's lock (emo.locks) and runs Snakemake without Snakemake's own lock,
which lives in the working directory and outlives a killed run. A failure ends with one line
(`emo: error: FILE: problem (stage S, log L)`), the traceback only in the stage log or with
--verbose; Ctrl-C, SIGTERM and SIGHUP stop the jobs and end with one line, exit 128 + the signal.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path

from emo import errors, locks
from emo.plan import ROOT


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline (Snakemake) on a Hydra-composed configuration")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=pp workload.pp=4 budget=0.05")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    p.add_argument("-c", "--cores", "-j", "--jobs", dest="cores", type=int, default=None,
                   help="jobs at once (default: every core; with --profile, the profile's jobs)")
    p.add_argument("--profile", metavar="NAME", help="a Snakemake workflow profile: profiles/NAME (default, slurm, "
                                                     "kubernetes, cluster-generic) or a folder; e.g. a cluster's executor")
    p.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. trace)")
    p.add_argument("--unlock", action="store_true",
                   help="remove what killed runs left (Snakemake locks in this folder, hidden .tmp and empty stage folders)")
    p.add_argument("-v", "--verbose", action="store_true", help="show Snakemake's log and the stages' tracebacks")
    p.add_argument("--report", metavar="FILE", help="then write Snakemake's HTML report of the run (table, plots)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from emo import sweep

    check_flags(args)
    jobs = sweep.expand(args.overrides, args.multirun)
    sw = sweep.build(jobs)  # every job's configuration is checked before any runs
    if args.unlock:
        return unlock(sw.jobs[0].cfg)
    if args.verbose:
        os.environ[errors.VERBOSE_ENV] = "1"
    name = "sweep " + " ".join(args.overrides) if args.multirun else None
    held = contextlib.nullcontext() if args.dry_run else \
        locks.hold(sorted({Path(j.cfg["results"]) for j in sw.jobs}), "emo run " + " ".join(args.overrides))
    try:
        with held, errors.signals_raise():
            locks.refuse_future(sw.results, "emo run")
            locks.check_writable(sw.results)
            return run_jobs(args, jobs, sw, name)
    except KeyboardInterrupt as e:
        if not args.dry_run:
            log_killed(sw, name, args.overrides, errors.one_line(e))
        print(interrupted_line(e), file=sys.stderr)
        return errors.exit_status(e)


def log_killed(sw, name: str | None, overrides: list[str], error: str) -> None:
    """Log the interrupted run (KILLED) to MLflow. The signal may have cut MLflow's import short and
    left its modules half-initialised (an AttributeError on the next use): then they are imported
    afresh, once. A failure is said in one line; the interrupt is what ended the run."""
    from emo import sweep

    for attempt in (0, 1):
        try:
            sweep.finish(sw, name, overrides, error=error, killed=True, print_results=False)
            return
        except KeyboardInterrupt:  # a second signal while logging: stop now
            return
        except (ValueError, OSError) as logging_failed:  # the store
            print(f"emo: error: {errors.one_line(logging_failed)}", file=sys.stderr)
            return
        except Exception as logging_failed:
            if attempt == 0 and isinstance(logging_failed, (AttributeError, ImportError)):
                for m in [m for m in sys.modules if m.split(".")[0] in ("mlflow", "alembic", "sqlalchemy")]:
                    del sys.modules[m]
                continue
            print(f"emo: error: the interrupted run was not logged to MLflow: {errors.one_line(logging_failed)}",
                  file=sys.stderr)


def check_flags(args: argparse.Namespace) -> None:
    """--until and --report, checked before anything runs (Snakemake would fail on them only at the end)."""
    from emo.stages import STAGES

    if args.until and args.until not in STAGES:
        raise ValueError(f"--until {args.until}: not a stage (one of {', '.join(STAGES)})")
    if args.report:
        report = Path(args.report)
        if report.suffix not in (".html", ".zip"):
            raise ValueError(f"--report {args.report}: Snakemake writes a report as .html or .zip")
        if not report.parent.is_dir():
            raise ValueError(f"--report {args.report}: no folder {report.parent}")
        if report.exists() and not report.is_file() or report.is_symlink():  # a device, a folder: never replaced
            raise ValueError(f"--report {args.report}: not a regular file")


def run_jobs(args: argparse.Namespace, jobs: list[list[str]], sw, name: str | None) -> int:
    from emo import sweep

    if len(jobs) > 1:
        print(f"emo: {len(jobs)} jobs in one Snakemake run", file=sys.stderr)
        if args.dry_run:  # what the sweep expanded to, one line a job
            for j in sw.jobs:
                print(f"emo: job {j.name}", file=sys.stderr)
    cores = args.cores if args.cores or args.profile else os.cpu_count() or 1
    gpus = None if args.profile else sweep.gpus_available(sw.jobs[0].cfg, cores)  # a scheduler places GPUs itself
    run = dict(gpus=gpus, profile=args.profile, verbose=args.verbose, planned=sw)
    failed_folders.clear()
    error = snakemake(jobs, cores, dry_run=args.dry_run, until=args.until, **run)
    if error is None and args.report and not args.dry_run:
        error = snakemake(jobs, cores, report=args.report, **run)
    if not args.dry_run:  # MLflow and the result lines, also when nothing had to run
        sweep.finish(sw, name, args.overrides, error=error, failed=failed_folders if error else None)
        if error is None and sweep.unreadable_results(sw):  # a cut-short result.json: said, and not a success
            return 1
    return 0 if error is None else 1


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


PROFILES = ROOT / "profiles"


def snakemake(jobs: list[list[str]], cores: int | None, *, dry_run: bool = False, until: str | None = None,
              gpus: int | None = 1, report: str | None = None, profile: str | None = None,
              verbose: bool = False, planned=None) -> str | None:
    """Run the Snakefile on every job's targets at once (one DAG), as the `snakemake` command line
    would (so a workflow profile, its executor plugin and its settings apply unchanged); None when it
    succeeded, else the one error line (already printed). `gpus`: the `gpu` resource the
    GPU-touching rules share on this machine (None: the executor's scheduler decides); `profile`: a
    folder of profiles/ or a path; `planned`: the emo.sweep.Sweep of `jobs` when the caller built it
    (the Snakefile then does not plan them again). Snakemake's own lock is off: emo.locks guards the results folder,
    and Snakemake's would outlive a kill -9. KeyboardInterrupt (or Interrupted) when a signal stopped it."""
    import json
    import socket
    import tempfile

    from snakemake.cli import args_to_api, parse_args

    from emo import sweep

    argv = ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(Path.cwd()),
            "--config", f"jobs={json.dumps([list(j) for j in jobs])}",
            # no hooks: the Snakefile's onsuccess/onerror log for plain `snakemake`; emo run logs itself
            "--no-hooks", "--rerun-incomplete", "--nolock"]
    if profile:
        path = PROFILES / profile if (PROFILES / profile).is_dir() else Path(profile)
        if not (path / "config.yaml").is_file():
            names = ", ".join(sorted(p.name for p in PROFILES.iterdir() if p.is_dir()))
            raise ValueError(f"--profile {profile}: no such workflow profile (profiles/: {names})")
        argv += ["--workflow-profile", str(path)]
    if cores is not None:
        argv += ["--jobs" if profile else "--cores", str(cores)]
    if gpus is not None:
        argv += ["--resources", f"gpu={gpus}"]
    if dry_run:
        argv += ["--dry-run"]
    elif not verbose:
        argv += ["--quiet", "all"]  # a line per stage comes from the stages
    if until:
        argv += ["--until", until]
    if report:
        argv += ["--report", str(report)]
    # in the results folder under EMO's mark (emo.locks.ERRORS_FILE): what a kill -9 leaves, the next run removes
    held = planned is not None and not dry_run and Path(planned.results).is_dir()  # under the run's lock
    if held:
        reports = str(Path(planned.results) / f".emo-errors-{os.getpid()}.jsonl")
        Path(reports).unlink(missing_ok=True)
        Path(reports).touch()
    else:  # no results folder yet (a first run, a dry run): a fresh file nobody else can have named
        fd, reports = tempfile.mkstemp(prefix=".emo-errors-", suffix=".jsonl")
        os.close(fd)
    os.environ[errors.ERRORS_ENV] = reports
    os.environ[locks.RUN_ENV] = f"{socket.gethostname()}:{os.getpid()}"  # the stages watch it (locks.stop_with_parent)
    keep_handlers()
    try:
        parser, args = quiet_profile_line(parse_args, argv, verbose)
        with sweep.planned(planned):
            ok = bool(args_to_api(args, parser))
        if ok:
            if report:
                print(f"emo: report {report}", file=sys.stderr)
            return None
        return failure(errors.read_reports(Path(reports)), report)
    finally:
        os.environ.pop(errors.ERRORS_ENV, None)
        os.environ.pop(locks.RUN_ENV, None)
        Path(reports).unlink(missing_ok=True)


def quiet_profile_line(parse_args, argv: list[str], verbose: bool):
    """Snakemake's parse_args, without its "Using workflow specific profile ..." line on every run
    (kept with --verbose); anything else it prints (a profile's error) still shows."""
    import io

    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return parse_args(argv)
    finally:
        lines = buf.getvalue().splitlines(keepends=True)
        sys.stderr.write("".join(ln for ln in lines if verbose or not ln.startswith("Using ")))


def keep_handlers() -> None:
    """Snakemake's scheduler makes SIGTERM "graceful" (wait for the running jobs, however long): a
    scheduler's grace period would end in SIGKILL mid-job. Keep emo's handler (errors.signals_raise:
    stop the jobs now, as Ctrl-C does) by giving the scheduler a `signal` module that leaves SIGTERM be."""
    import types

    from snakemake.scheduling import job_scheduler

    if isinstance(job_scheduler.signal, types.ModuleType):
        job_scheduler.signal = types.SimpleNamespace(SIGTERM=signal.SIGTERM, signal=lambda *a: None)


failed_folders: list[Path] = []  # the stage folders the last failed Snakemake run could not make (failure)


def failure(reports: list[dict], report: str | None = None) -> str:
    """Print the one line that says what failed: the failing stages' own lines when they reported
    one, else a pointer to Snakemake's log; a stage stopped by a signal means the run was interrupted."""
    if errors.caught or any(r.get("killed") for r in reports):
        raise errors.Interrupted(errors.caught[-1] if errors.caught else signal.SIGINT)
    failed_folders[:] = [Path(r["folder"]) for r in reports if r.get("folder")]
    what = f"--report {report}: Snakemake could not write the report" if report else "pipeline failed"
    lines = [errors.stage_line(r) for r in reports] or [f"emo: error: {what} (run with --verbose for Snakemake's log)"]
    for line in dict.fromkeys(lines):
        print(line, file=sys.stderr)
    return lines[0].removeprefix("emo: error: ")
