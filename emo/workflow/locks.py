"""One `emo run` at a time per results folder, and nothing a dead run left behind.

The lock is an advisory `flock` on `<results>/.emo-run.lock`, held for the whole run: the kernel
releases it when its owner exits, however it exits (kill -9 included), so a lock can never be stale.
The file also says who holds it (pid, command, working directory, start time), for the message a
second run gets. Runs from different working directories that share a `results=` folder lock each
other, since the lock lives in the folder itself (Snakemake's own lock lives in the working directory
and is not used by `emo run`, see emo.workflow.run). While the lock is held, hidden `.tmp` folders and empty
stage folders belong to no live run and are removed. flock needs a local file system (or NFSv4).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from pathlib import Path

LOCK_NAME = ".emo-run.lock"


class Busy(ValueError):
    """Another live `emo run` holds the results folder (a ValueError: `emo` prints one line)."""


@contextlib.contextmanager
def hold(folders: list[Path] | tuple[Path, ...], command: str):
    """Hold the lock of every results folder (created when missing) for the duration; yields what
    the cleanup at the start removed."""
    with contextlib.ExitStack() as stack:
        removed: list[Path] = []
        for folder in sorted({results_folder(Path(f)) for f in folders}):
            removed += stack.enter_context(_hold_one(folder, command))
        yield removed


def results_folder(path: Path) -> Path:
    """`results=` as a real folder EMO may own: not a link loop, not the root of the file system
    nor the home folder (a run walks and cleans its results folder: there, that is every file)."""
    try:
        real = path.resolve()
    except (RuntimeError, OSError) as e:  # a symbolic link loop (RuntimeError before Python 3.13)
        raise ValueError(f"results={path}: cannot be resolved ({e}); choose another with results=PATH") from None
    if real == real.parent or real == Path.home().resolve():
        raise ValueError(
            f"results={path}: {real} is {'the root of the file system' if real == real.parent else 'your home folder'}"
            ", which an emo run would walk and clean; choose a folder of its own with results=PATH"
        )
    return real


@contextlib.contextmanager
def _hold_one(results: Path, command: str):
    fd = _open(results)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(busy_message(results, _owner(fd))) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "command": command,
                    "cwd": os.getcwd(),
                    "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                }
            ).encode(),
            0,
        )
        removed = cleanup(results)
        try:
            yield removed
        finally:
            cleanup(results)
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _open(results: Path) -> int:
    try:
        results.mkdir(parents=True, exist_ok=True)
        return os.open(results / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ValueError(
            f"{results}: cannot write to the results folder ({e.strerror}); "
            "make it writable or choose another with results=PATH"
        ) from None


def _owner(fd: int) -> dict:
    for _ in range(20):  # the owner writes its record just after taking the lock
        with contextlib.suppress(ValueError):
            data = json.loads(os.pread(fd, 65536, 0) or b"null")
            if data:
                return data
        time.sleep(0.05)
    return {}


def busy_message(results: Path, owner: dict) -> str:
    if not owner:
        return f"{results}: in use by another emo run; wait for it to finish"
    pid = owner.get("pid")
    return (
        f"{results}: in use by another emo run (pid {pid}, `{owner.get('command')}` in {owner.get('cwd')}, "
        f"since {owner.get('since')}); wait for it to finish, or stop it with `kill {pid}`"
    )


# What EMO makes in a stage's folder, by name (the mark: `results=` may point into a tree that holds
# the user's own hidden `.tmp` and empty folders, which are never touched): a stage folder is a
# 12-digit hash, a stage's hidden folder `.<hash>.emo-stage-<random>.tmp` (emo.stages.run_stage; before
# the mark, `.<hash>.<8 random>.tmp`), the files a run hands its Snakemake, `.emo-<kind>-<pid>.<suffix>`
# (RUN_FILES; emo.workflow.run.run_file).
STAGE_FOLDER = re.compile(r"[0-9a-f]{12}")
STAGE_TMP = re.compile(r"\.[0-9a-f]{12}\.(emo-stage-[a-z0-9_]+|[a-z0-9_]{8})\.tmp")
RUN_FILES = {"errors": "jsonl", "plan": "pickle", "jobs": "json"}
RUN_FILE = re.compile(r"\.emo-(" + "|".join(rf"{kind}-\d+\.{suffix}" for kind, suffix in RUN_FILES.items()) + ")")


def cleanup(results: Path) -> list[Path]:
    """Remove what belongs to no live run (call with the lock held): the hidden folders killed stages
    left, empty stage folders and the files of killed runs; only what EMO made, by its marks
    (STAGE_TMP, STAGE_FOLDER, RUN_FILE). Returns what it removed."""
    from emo.workflow.plan import STAGES

    removed: list[Path] = []
    for p in results.glob(".emo-*"):
        if RUN_FILE.fullmatch(p.name) and p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    for stage in STAGES:
        folder = results / stage
        if not folder.is_dir() or folder.is_symlink():
            continue
        for p in folder.iterdir():
            if not p.is_dir() or p.is_symlink():
                continue
            if STAGE_TMP.fullmatch(p.name):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
            elif STAGE_FOLDER.fullmatch(p.name) and not any(p.iterdir()):
                with contextlib.suppress(OSError):
                    p.rmdir()
                    removed.append(p)
    return removed


FUTURE_SLACK_S = 5.0  # clocks of machines sharing a folder differ by this much without harm


def future_files(results: Path, now: float | None = None) -> list[tuple[Path, float]]:
    """Files under `results` dated later than now (+ slack), the farthest first, with how far (s)."""
    now = time.time() if now is None else now
    out = []
    for root, _dirs, files in os.walk(results):
        for name in files:
            with contextlib.suppress(OSError):
                ahead = os.lstat(os.path.join(root, name)).st_mtime - now
                if ahead > FUTURE_SLACK_S:
                    out.append((Path(root) / name, ahead))
    return sorted(out, key=lambda x: -x[1])


def refuse_future(results: Path, command: str) -> None:
    """Snakemake decides what is stale by file dates: a file dated in the future (clock skew, a copy
    from a machine whose clock runs ahead) looks newer than anything written now, so what depends on
    it is never redone (an imported calibration never reached the model). Said at once, in one line."""
    results_folder(results)  # (a dry run holds no lock: the folder is checked here too)
    ahead = future_files(results)
    if ahead:
        path, s = ahead[0]
        when = f"{s:.0f} s" if s < 300 else f"{s / 3600:.1f} h"
        raise ValueError(
            f"{path}: dated {when} in the future ({len(ahead)} file(s) under {results}); "
            f"{command} cannot tell what is stale: fix the clock, or date them now with "
            f"`find {results} -newermt now -exec touch -h {{}} +`"
        )


def check_writable(results: Path) -> None:
    """Refuse, before Snakemake starts, a stage folder EMO cannot write into: Snakemake fails on it
    before a stage runs, so no stage could say which folder it was ("pipeline failed")."""
    from emo.workflow.plan import STAGES

    for p in [results, *(results / s for s in STAGES), *(results / s / "logs" for s in STAGES)]:
        if p.is_dir() and not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(
                f"{p}: cannot write into this folder (permissions, or an immutable attribute); "
                "make it writable or choose another results=PATH"
            )


RUN_ENV = "EMO_RUN"  # "host:pid" of the `emo run` whose Snakemake starts the stages (set by emo.workflow.run)


def stop_with_parent() -> None:
    """A stage process ends when the run that started it dies, also by kill -9: on Linux the kernel
    sends it SIGTERM (PR_SET_PDEATHSIG), which a stage handles as Ctrl-C (it removes its hidden
    folder). Otherwise it would run on beside the next run, which takes its folder for a dead one's."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    # the run may have died before the call (Python's start-up and Snakemake's preamble take a while):
    # the parent read above is then already the reaper, so ask after the run itself
    if os.getppid() != parent or not run_alive(os.environ.get(RUN_ENV, "")):
        os.kill(os.getpid(), signal.SIGTERM)


def run_alive(run: str) -> bool:
    """False only when `run` ("host:pid") is a process of this machine that is gone (or a zombie);
    True when it is unknown (a plain `snakemake`) or on another machine (a cluster job)."""
    import socket

    host, _, pid = run.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
