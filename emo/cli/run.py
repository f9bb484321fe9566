"""`emo run [-m] KEY=VALUE ...`: compose the configuration and run the Snakemake pipeline on it.

With -m (multirun), comma lists sweep: `emo run -m budget=0.02,0.05 workload.tp=2,4,8` puts every
combination's targets into one Snakemake run (emo.workflow.sweep), so independent jobs run at once (`-j N`) and
stage folders the jobs share run once; MLflow gets one parent run and a child per job when it ends.

A run holds its results folder's lock (emo.workflow.locks) and runs the `snakemake` command without Snakemake's
own lock, which lives in the working directory and outlives a killed run. A failure ends with one line
(`emo: error: FILE: problem (stage S, log L)`), the traceback only in the stage log or with
--verbose; Ctrl-C, SIGTERM and SIGHUP are passed on to Snakemake and its jobs, which stop, and the
run ends with one line, exit 128 + the signal.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from emo import errors
from emo.errors import ConfigError
from emo.workflow import locks
from emo.workflow import run as pipeline

if TYPE_CHECKING:
    from emo.sections import TrackingConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline (Snakemake) on a Hydra-composed configuration")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=pp workload.pp=4 budget=0.05")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    p.add_argument(
        "-c",
        "--cores",
        "-j",
        "--jobs",
        dest="cores",
        type=int,
        default=None,
        help="jobs at once (default: every core; with --profile, the profile's jobs)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME",
        help="a Snakemake workflow profile: profiles/NAME (default, slurm, "
        "kubernetes, cluster-generic) or a folder; e.g. a cluster's executor",
    )
    p.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. trace)")
    p.add_argument(
        "--unlock",
        action="store_true",
        help="remove what killed runs left (Snakemake locks in this folder, hidden .tmp and empty stage folders)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show Snakemake's log and the stages' tracebacks")
    p.add_argument("--report", metavar="FILE", help="then write Snakemake's HTML report of the run (table, plots)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from emo.workflow import sweep

    check_flags(args)
    jobs = sweep.expand(args.overrides, args.multirun)
    sw = sweep.build(jobs)  # every job's configuration is checked before any runs
    if args.unlock:
        return unlock(Path(sw.jobs[0].cfg["results"]))
    if not (args.dry_run or args.profile):  # a cluster's nodes have the GPUs its login node may lack
        require_gpu([j.cfg for j in sw.jobs])
    if args.verbose:
        os.environ[errors.VERBOSE_ENV] = "1"
    name = "sweep " + " ".join(args.overrides) if args.multirun else None
    held = (
        contextlib.nullcontext()
        if args.dry_run
        else locks.hold(sorted({Path(j.cfg["results"]) for j in sw.jobs}), "emo run " + " ".join(args.overrides))
    )
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
    from emo.workflow import sweep

    for attempt in (0, 1):
        try:
            store_ready()
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
            print(
                f"emo: error: the interrupted run was not logged to MLflow: {errors.one_line(logging_failed)}",
                file=sys.stderr,
            )


_store: list = []  # the thread creating a fresh MLflow store while the pipeline runs (store_while_running)


def store_while_running(tracking_cfg: TrackingConfig) -> None:
    from emo.workflow import tracking

    _store[:] = [t for t in [tracking.create_while_running(tracking_cfg)] if t is not None]


def store_ready() -> None:
    """Wait for the store's creation to end before this thread touches MLflow (one importer at a time)."""
    while _store:
        _store[0].join()
        _store.clear()


def require_gpu(cfgs: list[dict]) -> None:
    """A real-GPU configuration on a machine NVML finds no GPU on: one line before any stage (each
    stage would fail on it, after the calibration had started)."""
    if not any(c["gpu"].get("backend") == "nvml" for c in cfgs):
        return
    fake = os.environ.get("EMO_FAKE_GPU")
    if fake:  # its GPUs answer NVML's calls, but the stages need a GPU's kernels (microbenchmarks, a trace)
        raise ConfigError(
            f"bad configuration: gpu.backend=nvml with EMO_FAKE_GPU={fake}: the fake GPUs answer NVML's calls only "
            "(emo apply, emo.apply, emo.measure); emo run's stages need a GPU's kernels: unset EMO_FAKE_GPU on a GPU "
            "box, or run your command on a virtual GPU (gpu=a100, h100, rtx3080ti, v100: your program on the CPU, "
            "its kernels simulated)"
        )
    from emo.device.control import GpuAccessError, open_control

    try:
        control = open_control()
        try:
            found = control.count()
        finally:
            control.close()
    except GpuAccessError as e:
        found, why = 0, errors.one_line(e)
    else:
        why = "NVML sees no GPU (check CUDA_VISIBLE_DEVICES)"
    if not found:
        raise ConfigError(
            f"bad configuration: gpu.backend=nvml needs an NVIDIA GPU: {why}; "
            "run it on a GPU box, or on a virtual GPU (gpu=a100, h100, rtx3080ti, v100)"
        )


def check_flags(args: argparse.Namespace) -> None:
    """--until and --report, checked before anything runs (Snakemake would fail on them only at the end)."""
    from emo.stages import STAGES

    if args.until and args.until not in STAGES:
        raise ConfigError(f"--until {args.until}: not a stage (one of {', '.join(STAGES)})")
    if args.report:
        report = Path(args.report)
        if report.suffix not in (".html", ".zip"):
            raise ConfigError(f"--report {args.report}: Snakemake writes a report as .html or .zip")
        if not report.parent.is_dir():
            raise ConfigError(f"--report {args.report}: no folder {report.parent}")
        if report.exists() and not report.is_file() or report.is_symlink():  # a device, a folder: never replaced
            raise ConfigError(f"--report {args.report}: not a regular file")


def run_jobs(args: argparse.Namespace, jobs: list[list[str]], sw, name: str | None) -> int:
    from emo.workflow import sweep

    if len(jobs) > 1:
        print(f"emo: {len(jobs)} jobs in one Snakemake run", file=sys.stderr)
        if args.dry_run:  # what the sweep expanded to, one line a job
            for j in sw.jobs:
                print(f"emo: job {j.name}", file=sys.stderr)
    cores = args.cores if args.cores or args.profile else os.cpu_count() or 1
    gpus = None if args.profile else sweep.gpus_available(sw.jobs[0].cfg, cores)  # a scheduler places GPUs itself
    run = dict(gpus=gpus, profile=args.profile, verbose=args.verbose, planned=sw)
    pipeline.failed_folders.clear()
    from emo.sections import TrackingConfig, typed

    tracking = typed(TrackingConfig, sw.jobs[0].cfg["tracking"])
    store = None if args.dry_run else functools.partial(store_while_running, tracking)
    error = pipeline.snakemake(jobs, cores, dry_run=args.dry_run, until=args.until, started=store, **run)
    if error is None and args.report and not args.dry_run:
        error = pipeline.snakemake(jobs, cores, report=args.report, **run)
    if not args.dry_run:  # MLflow and the result lines, also when nothing had to run
        store_ready()
        sweep.finish(sw, name, args.overrides, error=error, failed=pipeline.failed_folders if error else None)
        if error is None and sweep.unreadable_results(sw):  # a cut-short result.json: said, and not a success
            return 1
    return 0 if error is None else pipeline.failed_status[0]


def interrupted_line(e: KeyboardInterrupt) -> str:
    return (
        f"emo: interrupted ({errors.signal_name(e)}): the run was stopped; finished stages are kept and "
        "the next `emo run` resumes from them"
    )


def unlock(results: Path) -> int:
    """`emo run --unlock`: Snakemake's locks in this folder (left by a killed plain `snakemake`),
    hidden .tmp and empty stage folders; refused while a live `emo run` holds the results folder."""
    removed = []
    snake_locks = Path.cwd() / ".snakemake" / "locks"
    with locks.hold([results], "emo run --unlock") as cleaned:
        removed += cleaned
        if snake_locks.is_dir():
            for f in snake_locks.iterdir():
                f.unlink()
                removed.append(f)
    print(
        f"emo: unlocked {results}: removed {len(removed)} stale item(s)"
        + (f" ({', '.join(str(p) for p in removed[:5])}{', ...' if len(removed) > 5 else ''})" if removed else ""),
        file=sys.stderr,
    )
    return 0
