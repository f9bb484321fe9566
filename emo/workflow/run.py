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
import re
import signal
import sys
from pathlib import Path

from emo import errors
from emo.workflow import locks
from emo.workflow.plan import ROOT


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
        return unlock(sw.jobs[0].cfg)
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


def store_while_running(tracking_cfg: dict) -> None:
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
        raise ValueError(
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
        raise ValueError(
            f"bad configuration: gpu.backend=nvml needs an NVIDIA GPU: {why}; "
            "run it on a GPU box, or on a virtual GPU (gpu=a100, h100, rtx3080ti, v100)"
        )


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
    from emo.workflow import sweep

    if len(jobs) > 1:
        print(f"emo: {len(jobs)} jobs in one Snakemake run", file=sys.stderr)
        if args.dry_run:  # what the sweep expanded to, one line a job
            for j in sw.jobs:
                print(f"emo: job {j.name}", file=sys.stderr)
    cores = args.cores if args.cores or args.profile else os.cpu_count() or 1
    gpus = None if args.profile else sweep.gpus_available(sw.jobs[0].cfg, cores)  # a scheduler places GPUs itself
    run = dict(gpus=gpus, profile=args.profile, verbose=args.verbose, planned=sw)
    failed_folders.clear()
    store = None if args.dry_run else functools.partial(store_while_running, sw.jobs[0].cfg["tracking"])
    error = snakemake(jobs, cores, dry_run=args.dry_run, until=args.until, started=store, **run)
    if error is None and args.report and not args.dry_run:
        error = snakemake(jobs, cores, report=args.report, **run)
    if not args.dry_run:  # MLflow and the result lines, also when nothing had to run
        store_ready()
        sweep.finish(sw, name, args.overrides, error=error, failed=failed_folders if error else None)
        if error is None and sweep.unreadable_results(sw):  # a cut-short result.json: said, and not a success
            return 1
    return 0 if error is None else failed_status[0]


def interrupted_line(e: KeyboardInterrupt) -> str:
    return (
        f"emo: interrupted ({errors.signal_name(e)}): the run was stopped; finished stages are kept and "
        "the next `emo run` resumes from them"
    )


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
    print(
        f"emo: unlocked {cfg['results']}: removed {len(removed)} stale item(s)"
        + (f" ({', '.join(str(p) for p in removed[:5])}{', ...' if len(removed) > 5 else ''})" if removed else ""),
        file=sys.stderr,
    )
    return 0


PROFILES = ROOT / "profiles"


def snakemake(
    jobs: list[list[str]],
    cores: int | None,
    *,
    dry_run: bool = False,
    until: str | None = None,
    gpus: int | None = 1,
    report: str | None = None,
    profile: str | None = None,
    verbose: bool = False,
    planned=None,
    started=None,
) -> str | None:
    """Run the Snakefile on every job's targets at once (one DAG) with the `snakemake` command line,
    in a process of its own (so a workflow profile, its executor plugin and its settings apply
    unchanged, and its signal handlers are its own); None when it
    succeeded, else the one error line (already printed). `gpus`: the `gpu` resource the
    GPU-touching rules share on this machine (None: the executor's scheduler decides); `profile`: a
    folder of profiles/ or a path; `planned`: the emo.workflow.sweep.Sweep of `jobs` when the caller built it
    (the Snakefile then does not plan them again); `started`: called once Snakemake has started.
    Snakemake's own lock is off: emo.workflow.locks guards the results folder,
    and Snakemake's would outlive a kill -9. KeyboardInterrupt (or Interrupted) when a signal stopped it."""
    import socket
    import subprocess

    from emo.workflow import sweep

    argv = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(Path.cwd()),
        # no hooks: the Snakefile's onsuccess/onerror log for plain `snakemake`; emo run logs itself
        "--no-hooks",
        "--rerun-incomplete",
        "--nolock",
    ]
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
    # in the results folder under EMO's mark (emo.workflow.locks.RUN_FILE): what a kill -9 leaves, the next run removes
    held = planned is not None and not dry_run and Path(planned.results).is_dir()  # under the run's lock
    if held:
        reports, plan_file, jobs_file = (run_file(Path(planned.results), k) for k in ("errors", "plan", "jobs"))
    else:  # a first run, a dry run: fresh files nobody else can have named
        reports, plan_file, jobs_file = fresh_file(".jsonl"), fresh_file(".pickle"), fresh_file(".json")
    if planned is not None:  # the Snakefile takes the sweep planned here instead of composing every job again
        sweep.save_planned(planned, plan_file)
    argv += jobs_config(jobs, jobs_file, plan_file if planned is not None else None)
    env = {
        **os.environ,
        errors.ERRORS_ENV: str(reports),
        locks.RUN_ENV: f"{socket.gethostname()}:{os.getpid()}",
    }  # the stages watch it (locks.stop_with_parent)
    try:
        with stderr_without_profile_line(keep=verbose) as stderr:  # all of it copied before emo's own lines
            proc = subprocess.Popen(argv, env=env, stderr=stderr, preexec_fn=die_with_parent())
            try:
                if started is not None:
                    started()
                code = proc.wait()
            except KeyboardInterrupt:  # errors.signals_raise passed the signal on to Snakemake and its jobs
                stop(proc)
                raise
        if code == 0:
            if report:
                print(f"emo: report {report}", file=sys.stderr)
            return None
        return failure(errors.read_reports(reports), report)
    finally:
        reports.unlink(missing_ok=True)
        plan_file.unlink(missing_ok=True)
        jobs_file.unlink(missing_ok=True)


PROFILE_LINE = re.compile(rb"Using .*profile.* for setting default command line arguments\.\r?\n")


@contextlib.contextmanager
def stderr_without_profile_line(keep: bool = False):
    """The stderr to start Snakemake with: ours, less the "Using workflow specific profile ..." line
    its command line prints on every run (kept with `keep`, for --verbose). A terminal stays a
    terminal (a pseudo-terminal of its size, so the stages' progress bars show). A thread copies it
    until every process holding it has ended (the caller waits for Snakemake inside)."""
    import pty
    import threading

    if keep:
        yield None
        return
    if os.isatty(2):
        ours, theirs = pty.openpty()
        with contextlib.suppress(OSError):
            import fcntl
            import termios

            fcntl.ioctl(theirs, termios.TIOCSWINSZ, fcntl.ioctl(2, termios.TIOCGWINSZ, b"\0" * 8))
    else:
        ours, theirs = os.pipe()
    copy = threading.Thread(target=_copy_stderr, args=(ours,), daemon=True)
    copy.start()
    try:
        yield theirs
    finally:
        os.close(theirs)  # the child held its own copy: the copy ends when the child's processes have
        copy.join(timeout=COPY_WAIT_S)


COPY_WAIT_S = 10  # for what a stage still writes as it stops, once Snakemake has ended


def _copy_stderr(fd: int) -> None:
    """Copy `fd` to our stderr as it comes, the first line only once whole (it may be the profile line)."""
    first: bytes | None = b""
    try:
        while chunk := os.read(fd, 65536):
            if first is not None:
                first += chunk
                if b"\n" not in first:
                    continue
                line, _, rest = first.partition(b"\n")
                chunk = rest if PROFILE_LINE.fullmatch(line + b"\n") else first
                first = None
            _write_stderr(chunk)
    except OSError:  # a pseudo-terminal whose last writer closed it (EIO), or our stderr gone
        pass
    finally:
        if first:
            with contextlib.suppress(OSError, ValueError):
                _write_stderr(first)
        os.close(fd)


def _write_stderr(data: bytes) -> None:
    """To sys.stderr, as Snakemake run in this process wrote (what a caller captures sees it too)."""
    out = getattr(sys.stderr, "buffer", None)
    if out is None:
        sys.stderr.write(data.decode(errors="replace"))
    else:
        sys.stderr.flush()
        out.write(data)
        out.flush()
    sys.stderr.flush()


def jobs_config(jobs: list[list[str]], path: Path, planned: Path | None = None) -> list[str]:
    """Snakemake's arguments handing it `jobs` (and the file of the sweep planned for them): a config
    file written at `path`, since a large sweep's overrides outgrow one command-line argument (128 KiB
    on Linux, about 800 jobs)."""
    import json

    config: dict = {"jobs": [list(j) for j in jobs]}
    if planned is not None:
        config["planned"] = str(planned)
    path.write_text(json.dumps(config))
    return ["--configfile", str(path)]


def run_file(results: Path, kind: str) -> Path:
    """`<results>/.emo-<kind>-<pid>.<suffix>`, empty: what this run hands its Snakemake (locks.RUN_FILE)."""
    path = results / f".emo-{kind}-{os.getpid()}.{locks.RUN_FILES[kind]}"
    path.unlink(missing_ok=True)
    path.touch()
    return path


def fresh_file(suffix: str) -> Path:
    import tempfile

    fd, name = tempfile.mkstemp(prefix=".emo-run-", suffix=suffix)
    os.close(fd)
    return Path(name)


def die_with_parent():
    """What the Snakemake process runs before it starts: be killed with emo run (a kill -9 too), so
    that its jobs, which die with it (locks.stop_with_parent), do not run on beside the next run.
    Resolved here, so that the forked child only makes the call."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(ctypes.CDLL(None, use_errno=True).prctl, 1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


STOP_S = 60  # how long Snakemake may take to stop its jobs after a signal, before it is killed


def stop(proc) -> None:
    """Wait for Snakemake to stop its jobs (they have the signal too); after STOP_S it is killed
    (its jobs then get SIGTERM as it dies)."""
    import subprocess

    try:
        proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


failed_folders: list[Path] = []  # the stage folders the last failed Snakemake run could not make (failure)
failed_status = [1]  # the exit status the last failed Snakemake run asks for (failure)


def failure(reports: list[dict], report: str | None = None) -> str:
    """Print the one line that says what failed: the failing stages' own lines when they reported
    one, else a pointer to Snakemake's log; a stage stopped by a signal means the run was interrupted."""
    if errors.caught or any(r.get("killed") for r in reports):
        raise errors.Interrupted(errors.caught[-1] if errors.caught else signal.SIGINT)
    failed_folders[:] = [Path(r["folder"]) for r in reports if r.get("folder")]
    # 2 when every failure was the input's (errors.InputError), as for bad configuration
    failed_status[0] = 2 if reports and all(r.get("status") == 2 for r in reports) else 1
    what = f"--report {report}: Snakemake could not write the report" if report else "pipeline failed"
    lines = [errors.stage_line(r) for r in reports] or [f"emo: error: {what} (run with --verbose for Snakemake's log)"]
    for line in dict.fromkeys(lines):
        print(line, file=sys.stderr)
    return lines[0].removeprefix("emo: error: ")
