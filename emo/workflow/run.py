"""The `snakemake` command line on planned jobs, for `emo run` (emo.cli.run): one Snakemake run in a
process of its own, its stderr copied less its profile line, its failures read back as one line.

It runs without Snakemake's own lock, which lives in the working directory and outlives a killed run;
the caller holds the results folder's lock (emo.workflow.locks). Ctrl-C, SIGTERM and SIGHUP, passed on
by errors.signals_raise, stop Snakemake and its jobs (`stop`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
from pathlib import Path

from emo import errors
from emo.errors import ConfigError
from emo.workflow import locks
from emo.workflow.plan import ROOT

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

    argv = snakemake_argv(cores, dry_run, until, gpus, report, profile, verbose)
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


def snakemake_argv(
    cores: int | None,
    dry_run: bool,
    until: str | None,
    gpus: int | None,
    report: str | None,
    profile: str | None,
    verbose: bool,
) -> list[str]:
    """The `snakemake` command line `snakemake()` runs, before the jobs' config."""
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
            raise ConfigError(f"--profile {profile}: no such workflow profile (profiles/: {names})")
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
    return argv


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
    # the status every failed stage asked for (errors.stage_status: 2 config or input, 3 the device), else 1
    statuses = {r.get("status", 1) for r in reports}
    failed_status[0] = statuses.pop() if len(statuses) == 1 else 1
    what = f"--report {report}: Snakemake could not write the report" if report else "pipeline failed"
    lines = [errors.stage_line(r) for r in reports] or [f"emo: error: {what} (run with --verbose for Snakemake's log)"]
    for line in dict.fromkeys(lines):
        print(line, file=sys.stderr)
    return lines[0].removeprefix("emo: error: ")
