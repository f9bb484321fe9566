"""One owner per GPU on a node: the on-disk record of every GPU whose clock EMO locked.

A record `gpu<N>.json` in lock_dir() says who holds GPU N (NVML index): the owner process and the
trainer it serves (pid and start time, so a reused pid is not taken for them), the trainer's
command, the user and since when. The clock owner (emo.device.clock_owner) writes it before its
first clock change of a GPU and removes it after its reset; it resets only GPUs whose record is its
own, so one job's end never resets another's GPU. EMO's own stages that lock clocks in-process
(calibrate, validate's static clocks: emo.device.nvml.ClockController) record theirs the same way,
the stage's process both owner and trainer. A second job's owner is refused a GPU whose
holder lives. A record whose owner or trainer is dead is stale: any EMO command that meets one
(`emo apply`, a new clock owner, a stage's first lock, `emo reset-clocks`) resets that GPU and says so.

All changes of the folder happen under one flock (LOCK_FILE), and an owner's reset with it: a
holder's reset and another's take-over of its record never interleave. The folder is node-local
(/tmp by default, EMO_GPU_LOCK_DIR elsewhere) and sticky like /tmp: a user cannot remove another's
record. Records are plain JSON, never code.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

LOCK_DIR_ENV = "EMO_GPU_LOCK_DIR"
DEFAULT_DIR = "/tmp/emo-gpu-locks"
LOCK_FILE = ".flock"
HELD, LOST = "held by another job", "reset by someone else"  # why a GPU is refused or gone (causes)
SETTLE_S = 2.0  # a live owner whose trainer died resets within clock_owner.RESET_BOUND_S: wait that long first


def lock_dir() -> Path:
    """EMO_GPU_LOCK_DIR, else the node's folder (a folder of its own for EMO_FAKE_GPU's fake GPUs, whose
    indices are not the real ones)."""
    fake = "-fake" if os.environ.get("EMO_FAKE_GPU") else ""
    d = Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_DIR + fake)
    if not d.is_dir():
        with contextlib.suppress(OSError):  # cannot make it: the first write says so, where it is handled
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o1777)  # every user's jobs record here; sticky: none removes another's record
    return d


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return "?"
    text = " ".join(words)  # one line, even for a `python -c` program's newlines
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class Holder:
    """A clock owner and the trainer it serves, as a record names them."""

    pid: int
    start: int | None
    trainer: int
    trainer_start: int | None

    @classmethod
    def me(cls, trainer: int) -> Holder:
        return cls(os.getpid(), start_time(os.getpid()), trainer, start_time(trainer))

    def alive(self) -> bool:
        """Both the owner and its trainer run (the same processes, not a reused pid)."""
        if self.start is None or self.trainer_start is None:
            return False
        return start_time(self.pid) == self.start and start_time(self.trainer) == self.trainer_start


@dataclass(frozen=True)
class Record:
    gpu: int
    holder: Holder
    job: str
    user: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        owner = "" if self.holder.pid == self.holder.trainer else f", clock owner {self.holder.pid}"  # a stage: itself
        return f"EMO job {self.holder.trainer} of {self.user} (`{self.job}`, since {when}{owner})"

    def to_json(self) -> str:
        h = self.holder
        return json.dumps(
            {
                "gpu": self.gpu,
                "owner": h.pid,
                "owner_start": h.start,
                "trainer": h.trainer,
                "trainer_start": h.trainer_start,
                "job": self.job,
                "user": self.user,
                "since": self.since,
            }
        )

    @classmethod
    def parse(cls, text: str) -> Record | None:
        """A record, or None for anything else (a cut-short write, a stranger's file)."""
        try:
            d = json.loads(text)
            holder = Holder(int(d["owner"]), d["owner_start"], int(d["trainer"]), d["trainer_start"])
            return cls(int(d["gpu"]), holder, str(d["job"]), str(d["user"]), float(d["since"]))
        except (ValueError, KeyError, TypeError):
            return None


def _path(gpu: int) -> Path:
    return lock_dir() / f"gpu{int(gpu)}.json"


def read(gpu: int) -> Record | None:
    try:
        return Record.parse(_path(gpu).read_text())
    except OSError:
        return None


def records() -> list[Record]:
    out = []
    for f in sorted(lock_dir().glob("gpu*.json")):
        with contextlib.suppress(OSError):
            rec = Record.parse(f.read_text())
            if rec is not None:
                out.append(rec)
    return out


_HOLDS = threading.local()  # depth: how deep this thread is inside _locked()
os.register_at_fork(after_in_child=lambda: setattr(_HOLDS, "depth", 0))


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The folder's flock. Re-entrant in one thread: a stage's restore guard may reset (release) from a
    signal handler that interrupted this thread inside a change; a second flock of its own would wait forever."""
    depth = getattr(_HOLDS, "depth", 0)
    if depth:
        _HOLDS.depth = depth + 1
        try:
            yield
        finally:
            _HOLDS.depth = depth
        return
    fd = os.open(lock_dir() / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # every user's owners take it
        fcntl.flock(fd, fcntl.LOCK_EX)
        _HOLDS.depth = 1
        try:
            yield
        finally:
            _HOLDS.depth = 0
    finally:
        os.close(fd)


def _write(rec: Record) -> None:
    path = _path(rec.gpu)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(rec.to_json())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _settled(rec: Record) -> Record | None:
    """The record once a live owner whose trainer died had SETTLE_S to reset and remove it itself."""
    h = rec.holder
    if start_time(h.pid) != h.start or h.start is None:
        return rec  # the owner is gone: nobody else will reset it
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        now = read(rec.gpu)
        if now != rec:
            return now
        time.sleep(0.05)
    return rec


class Held(Exception):
    """The GPU is held by another live EMO job (dead=True: a dead one of another user, whose record
    only root or its user may remove)."""

    def __init__(self, rec: Record, dead: bool = False):
        text = (
            f"GPU {rec.gpu} was left locked by {rec.describe()}, now dead, whose record this user cannot "
            "replace: run `emo reset-clocks` as root or as that user"
            if dead
            else f"GPU {rec.gpu} is held by {rec.describe()}"
        )
        super().__init__(text)
        self.record = rec


def acquire(gpu: int, me: Holder) -> Record | None:
    """Record that `me` holds `gpu`. Raises Held if another live job does; returns the stale record it
    replaced (its holder died without resetting: the caller's clock change overrides it), else None."""
    stale = None
    for _ in range(3):
        rec = read(gpu)
        if rec is not None and rec.holder != me and not rec.holder.alive():
            rec = _settled(rec)
        with _locked():
            now = read(gpu)
            if now is not None and now != rec:
                continue  # changed while we waited: look again
            if now is not None and now.holder == me:
                return None
            if now is not None and now.holder.alive():
                raise Held(now)
            stale = now
            try:
                _write(Record(int(gpu), me, _cmdline(me.trainer), _user(), time.time()))
            except PermissionError:  # a dead holder of another user: its record cannot be replaced
                assert now is not None  # a fresh name in the sticky folder is always ours to make
                raise Held(now, dead=True) from None
            return stale
    rec = read(gpu)
    raise (
        Held(rec)
        if rec is not None and rec.holder != me
        else RuntimeError(f"GPU {gpu}: its lock record keeps changing")
    )


def take(gpu: int, me: Holder) -> Record | None:
    """acquire, its failures as the one-line GpuAccessError every locker of a GPU raises: HELD when
    another live job holds it, OTHER when the record cannot be written."""
    from emo.device.control import GpuAccessError
    from emo.device.zeusd import OTHER

    try:
        return acquire(gpu, me)
    except Held as e:
        why = f"{e}: wait for it to end, or give this job other GPUs (CUDA_VISIBLE_DEVICES)"
        raise GpuAccessError(why, cause=HELD, reason=why) from None
    except OSError as e:  # e.g. a lock folder another user made without write access for all
        why = (
            f"cannot record the GPU's lock in {lock_dir()} ({e.strerror or e}): "
            f"set {LOCK_DIR_ENV} to a folder every EMO user of this node can write"
        )
        raise GpuAccessError(why, cause=OTHER, reason=why) from None


def mine(gpu: int, me: Holder) -> bool:
    rec = read(gpu)
    return rec is not None and rec.holder == me


def release(gpu: int, me: Holder, reset: Callable[[int], None]) -> bool:
    """Reset `gpu` and remove its record if `me` holds it; else leave both (another job holds it, or
    someone reset it already). Returns whether it was ours. `reset` raising keeps the record."""
    with _locked():
        rec = read(gpu)
        if rec is None or rec.holder != me:
            return False
        reset(gpu)
        _remove(gpu)
        return True


def recover(reset: Callable[[int], None], gpus: list[int] | None = None) -> list[str]:
    """Reset every GPU (of `gpus`, default all) whose recorded holder is dead and remove its record.
    Returns one line per stale record found: reset, or why not."""
    lines = []
    for rec in records():
        if (gpus is not None and rec.gpu not in gpus) or rec.holder.alive():
            continue
        rec2 = _settled(rec)
        if rec2 != rec:
            continue  # its owner reset it in the meantime
        with _locked():
            if read(rec.gpu) != rec:
                continue
            try:
                reset(rec.gpu)
            except Exception as e:  # no permission, zeusd gone: say so, keep the record for a later try
                why = getattr(e, "reason", None) or str(e)
                lines.append(
                    f"GPU {rec.gpu} was left locked by {rec.describe()}, now dead; could not reset it ({why}): "
                    "run `emo reset-clocks` as root"
                )
                continue
            kept = (
                ""
                if _remove(rec.gpu)
                else " (its record, another user's, stays: `emo reset-clocks` as root removes it)"
            )
        lines.append(f"GPU {rec.gpu} was left locked by {rec.describe()}, now dead: reset it{kept}")
    return lines


def _remove(gpu: int) -> bool:
    """Remove `gpu`'s record; False when it is another user's in the sticky folder (kept)."""
    try:
        _path(gpu).unlink()
    except FileNotFoundError:
        pass
    except PermissionError:
        return False
    return True


def forget(gpu: int) -> Record | None:
    """Remove `gpu`'s record whoever holds it (`emo reset-clocks` reset the GPU by hand); the record removed."""
    with _locked():
        rec = read(gpu)
        _remove(gpu)
        return rec


def held_by_others(gpus: list[int], me: Holder | None = None) -> list[Record]:
    """The live records of `gpus` held by another job than `me`."""
    out = []
    for g in gpus:
        rec = read(g)
        if rec is not None and rec.holder != me and rec.holder.alive():
            out.append(rec)
    return out
