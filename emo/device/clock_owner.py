"""The clock owner: a small side process that sets a trainer's GPU clocks and resets them when it dies.

A training process can die where no code of its own runs: SIGKILL after a grace period while its
main thread is stuck in C (a rank hung in NCCL), `os.abort()` (NCCL's watchdog), `os._exit`, a
framework's SIGTERM handler installed over EMO's. So the trainer does not set clocks itself: it
spawns one owner (`python -m emo.device.clock_owner`, once per process, shared by its appliers) and
sends it requests over a socketpair; the owner makes them (NVML as root, else relayed to zeusd:
emo.device.nvml.ClockController) and answers each, so a failure comes back to the trainer and is said
there. The owner notices the trainer's death itself: the kernel closes the trainer's end of the
socket (EOF) and makes its pidfd readable, however it died. It then resets every GPU it locked and
exits, within RESET_BOUND_S (it sleeps in select() until then, so the reset follows at once).

It runs in its own session, so a terminal's or a process group's SIGINT/SIGHUP do not reach it.
SIGTERM/SIGINT/SIGHUP sent to it directly (a scheduler that signals every process of a job) make
it reset at once and refuse further locks until the trainer is gone: when SIGKILL then reaches both,
the clocks are already back. No PR_SET_PDEATHSIG: it would kill the owner with the trainer, the
very moment it must reset. A forked child of the trainer has no access to the owner (its copy of
the socket is closed at fork) and its inherited appliers refuse to act (emo.runtime).

One owner per GPU on the node: before its first change of a GPU it records the lock
(emo.device.gpu_locks), is refused a GPU another live job holds (cause HELD), resets only GPUs whose
record is still its own (a GPU reset or taken over by someone else answers cause LOST), and at its
start resets the GPUs dead owners left locked, saying so. Every clock asked for is checked against
the GPU's supported clocks first (out of range). When it dies under a live trainer, the trainer's
handle starts a new owner, whose start resets what the dead one held.

Protocol: one JSON object per line. Request {"id", "op": "set"|"reset", "gpu", "mhz"}; answer
{"id", "ok": true} or {"id", "ok": false, "cause", "error"}; the first line the owner writes is
a hello ({"id": 0, "ok", "via"} or the error that stops it from controlling clocks).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from emo.device import gpu_locks
from emo.device.control import GpuAccessError
from emo.device.gpu_locks import LOST
from emo.runtime import ClockLost, RequestDropped

RESET_BOUND_S = 1.0  # stated bound: the trainer's death to the last GPU reset (measured: milliseconds)
START_S = 60.0  # the owner's start (a Python interpreter and emo.device.nvml)
REPLY_S = 30.0  # one request: zeusd's own timeout is 5 s; NVML answers in milliseconds
NVML_ENV = "EMO_CLOCK_OWNER_NVML"  # "module:factory" returning a pynvml stand-in (tests' NVML fake)
DRAINING, OWNER_DIED = "owner resetting", "clock owner gone"


# --------------------------------------------------------------------------- the trainer's side
class ClockOwner:
    """The trainer's handle on its clock owner: a ClockSetter (emo.runtime) whose calls are made by
    the owner. Thread-safe (one request at a time); refuses to act in a forked child."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc = proc
        self._sock: socket.socket | None = sock
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._next = 1
        self._buf = b""
        sock.settimeout(START_S)
        hello = self._read(0)
        self.via = hello.get("via", "?")
        self.error = None if hello.get("ok") else _error(hello)  # controlling clocks is impossible

    def alive(self) -> bool:
        return self._sock is not None and self.proc.poll() is None

    def set_clock(self, device: int, mhz: int) -> None:
        self._request({"op": "set", "gpu": int(device), "mhz": int(mhz)})

    def reset_clock(self, device: int) -> None:
        self._request({"op": "reset", "gpu": int(device)})

    def _request(self, req: dict) -> None:
        if os.getpid() != self._pid:
            raise GpuAccessError(
                "refused in a forked child: only the process that started the clock owner may change its GPUs",
                cause="forked child",
                reason="refused in a forked child",
            )
        with self._lock:
            if self._sock is None:
                raise GpuAccessError(f"{OWNER_DIED}: run `emo reset-clocks`", cause=OWNER_DIED)
            rid, self._next = self._next, self._next + 1
            try:
                self._sock.settimeout(REPLY_S)
                self._sock.sendall((json.dumps({"id": rid, **req}) + "\n").encode())
                answer = self._read(rid)
            except (OSError, ValueError) as e:
                why = f"no answer in {REPLY_S:g}s" if isinstance(e, TimeoutError) else f"exit status {self.proc.poll()}"
                raise GpuAccessError(f"{OWNER_DIED} ({why}): {self._replace()}", cause=OWNER_DIED) from e
        if not answer.get("ok"):
            raise _error(answer)

    def _replace(self) -> str:
        """The owner died or hangs: end it and start another, whose start-up resets the GPUs the dead
        one left locked (their records name a dead owner, emo.device.gpu_locks) and says so; later
        requests go to it. Returns what happened, in words."""
        assert self._sock is not None  # called under the lock with the socket in use
        self._sock.close()
        self._sock = None
        if self.proc.poll() is None:  # stuck (a hung zeusd call): its locks are reset by the next owner
            self.proc.kill()
            self.proc.wait()
        try:
            fresh = spawn()
        except GpuAccessError as e:
            return f"no new one started ({e}): run `emo reset-clocks`"
        self.proc, self._sock, self._buf, self._next = fresh.proc, fresh._sock, b"", 1
        fresh._sock = None
        return "a new clock owner reset the GPUs it left locked"

    def _read(self, rid: int) -> dict:
        sock = self._sock
        assert sock is not None  # the caller checked it under the lock
        while True:
            while b"\n" not in self._buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the clock owner closed its socket")
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("id") == rid:  # an answer to a request that timed out earlier is dropped
                return msg

    def close(self, timeout_s: float = 5.0) -> None:
        """End the owner as a death would: it resets every GPU it locked and exits."""
        with self._lock:
            if self._sock is not None and os.getpid() == self._pid:
                self._sock.close()
            self._sock = None
        if os.getpid() == self._pid:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass

    def _forget(self) -> None:
        """In a forked child: drop the child's copy of the socket (it must neither use it nor keep it open)."""
        if self._sock is not None:
            self._sock.close()
        self._sock = None


class Dropped(GpuAccessError, RequestDropped):
    """The owner got a signal, reset the clocks and takes no more locks: counted as dropped."""


class Lost(GpuAccessError, ClockLost):
    """The GPU's record is no longer this owner's: someone reset or took it. Counted as lost."""


def _error(answer: dict) -> GpuAccessError:
    reason, cause = answer.get("error", "?"), answer.get("cause")
    kind = {DRAINING: Dropped, LOST: Lost}.get(cause or "", GpuAccessError)
    return kind(reason, cause=cause, reason=reason)


_OWNER: ClockOwner | None = None
_OWNER_LOCK = threading.Lock()


def owner() -> ClockOwner:
    """This process's clock owner, started on first use (and again if it died)."""
    global _OWNER
    with _OWNER_LOCK:
        if _OWNER is None or not _OWNER.alive():
            _OWNER = spawn()
        return _OWNER


def spawn() -> ClockOwner:
    ours, theirs = socket.socketpair()
    root = str(Path(__file__).resolve().parents[2])  # the owner imports the same emo as this process
    # the owner imports the same emo, but not the sitecustomize `emo trace`/`emo apply` inject into the job
    site = os.path.realpath(Path(root) / "emo" / "_site")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != site]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *paths]))
    err = relay_stderr()  # not the trainer's stderr: a reader of that waits for every holder to end
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "emo.device.clock_owner", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env=env,
        )
    finally:
        theirs.close()
        os.close(err)
    try:
        return ClockOwner(proc, ours)
    except (OSError, ValueError) as e:
        ours.close()
        raise GpuAccessError(f"the clock owner did not start (exit status {proc.poll()}): {e}", cause=OWNER_DIED) from e


def relay_stderr() -> int:
    """A pipe's write end for the owner's stderr; a daemon thread copies its lines to this process's
    stderr while this process lives. (What the owner says after the trainer's death is lost with the
    pipe; the node's lock records keep what matters, emo.device.gpu_locks.)"""
    r, w = os.pipe()

    def copy() -> None:
        with open(r, "rb") as f:
            for line in f:
                try:
                    sys.stderr.write(line.decode(errors="replace"))
                    sys.stderr.flush()
                except (OSError, ValueError):  # this process's stderr closed: drain on, quietly
                    pass

    threading.Thread(target=copy, name="emo-clock-owner-stderr", daemon=True).start()
    return w


def _after_fork_in_child() -> None:
    global _OWNER, _OWNER_LOCK
    if _OWNER is not None:
        _OWNER._forget()
    _OWNER, _OWNER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------- the owner's side
def _load_nvml():
    spec = os.environ.get(NVML_ENV)
    if spec:  # tests: the NVML fake, the only stand-in, at the NVML boundary
        import importlib

        mod, _, attr = spec.partition(":")
        return getattr(importlib.import_module(mod), attr)()
    from emo.device.nvml import import_pynvml

    return import_pynvml()


def _watch_parent(parent: int) -> int | None:
    """A file descriptor that becomes readable when `parent` exits (its pidfd), or None."""
    try:
        return os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfd (old kernel): the socket's EOF alone tells
        return None


def serve(sock: socket.socket, parent: int) -> int:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # noted through the wakeup fd, handled in the loop below
    pidfd = _watch_parent(parent)
    if os.getppid() != parent:  # the trainer died before we started: nothing was locked
        return 0
    owner = _Owner(sock, gpu_locks.Holder.me(parent))
    try:
        owner.loop(wake_r, pidfd)
    finally:  # whatever ended the loop, even a bug of ours: the clocks come back
        if owner.ctl is not None:
            owner.reset_all()
    return 0


def _say(line: str) -> None:
    print(f"emo clock owner: {line}", file=sys.stderr, flush=True)


class _Owner:
    """The clock owner's state: the controller (or why there is none), the GPUs whose lock record is
    ours (`locked`) and those a set of ours landed on (`changed`), and whether a signal made it reset
    and refuse further sets (`draining`)."""

    def __init__(self, sock: socket.socket, me: gpu_locks.Holder):
        from emo.device.nvml import ClockController, nvml_init

        self.sock, self.me = sock, me
        self.ctl: ClockController | None = None
        self.init_error: GpuAccessError | None = None
        try:
            self.nvml = _load_nvml()
            nvml_init(self.nvml)
            self.ctl = ClockController.auto(self.nvml, guarded=False)
        except GpuAccessError as e:
            self.init_error = e
        self.locked: set[int] = set()
        self.changed: set[int] = set()
        self.draining = False
        self.supported: dict[int, list[int]] = {}

    def hello(self) -> dict:
        """The first answer: the controller's way to the clocks, after a dead owner's locks on this
        node were reset (said), or why there is no controller."""
        if self.ctl is None:
            assert self.init_error is not None  # ClockController.auto either returned one or raised
            return {"id": 0, "ok": False, "cause": self.init_error.cause, "error": str(self.init_error)}
        try:
            for found in gpu_locks.recover(self.ctl.reset_clock):
                _say(found)
        except OSError as e:  # an unusable lock folder is said at the first set; not a reason to stop here
            _say(f"cannot read the GPU lock records in {gpu_locks.lock_dir()} ({e.strerror or e})")
        return {"id": 0, "ok": True, "via": self.ctl.via}

    def loop(self, wake_r: int, pidfd: int | None) -> None:
        """Answer requests until the trainer is gone (its pidfd, or EOF on its socket); a signal resets
        the clocks at once and refuses later sets."""
        watched: list[socket.socket | int] = [self.sock, wake_r]
        if pidfd is not None:
            watched.append(pidfd)
        buf = b""
        alive = self.send(self.hello())
        while alive:
            ready, _, _ = select.select(watched, [], [])
            if pidfd is not None and pidfd in ready:
                return  # the trainer is gone, whatever its socket says (a forked child may still hold a copy)
            if wake_r in ready:
                os.read(wake_r, 512)
                self.draining = True
                self.reset_all()
            if self.sock in ready:
                try:
                    chunk = self.sock.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    return  # EOF: the kernel closed the trainer's end, however it died
                buf += chunk
                while alive and b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    alive = self.send(self.handle(json.loads(line)))

    def send(self, msg: dict) -> bool:
        try:
            self.sock.sendall((json.dumps(msg) + "\n").encode())
            return True
        except OSError:
            return False

    def release(self, gpu: int) -> None:
        """Reset `gpu` if its record is still ours (never another job's clock), and forget it."""
        assert self.ctl is not None  # a GPU is only locked through a working controller
        try:
            ours = gpu_locks.release(gpu, self.me, self.ctl.reset_clock)
        except OSError as e:  # the records cannot be read or locked: reset anyway, ours as far as we know
            _say(f"GPU {gpu}: the lock records in {gpu_locks.lock_dir()} failed ({e}): resetting without them")
            self.ctl.reset_clock(gpu)
            ours = True
        self.locked.discard(gpu)
        if not ours:
            raise GpuAccessError(
                f"GPU {gpu}: its clock was reset by someone else while this job held it ({_holder(gpu)})",
                cause=LOST,
                reason=f"reset by someone else ({_holder(gpu)})",
            )

    def take(self, gpu: int, mhz: int) -> None:
        """Before a set: the clock is one the GPU supports, and the GPU is this job's on the node."""
        from emo.device import zeusd
        from emo.policy import check_clock

        if gpu not in self.supported:
            self.supported[gpu] = _supported(self.nvml, gpu)
        try:
            check_clock(mhz, self.supported[gpu], f"GPU {gpu}")
        except ValueError as e:
            raise GpuAccessError(str(e), cause=zeusd.OUT_OF_RANGE, reason=str(e)) from None
        if gpu in self.locked:
            if gpu_locks.mine(gpu, self.me):
                return
            self.locked.discard(gpu)
            why = f"reset by someone else ({_holder(gpu)})"
            raise GpuAccessError(f"GPU {gpu}: {why}", cause=LOST, reason=why)
        stale = gpu_locks.take(gpu, self.me)
        if stale is not None:
            _say(f"GPU {gpu} was left locked by {stale.describe()}, now dead: this job takes it over")

    def reset_all(self) -> None:
        for gpu in sorted(self.locked):
            try:
                self.release(gpu)
            except GpuAccessError as e:
                if e.cause == LOST:  # another job's now, or reset already: not ours to reset
                    continue
                _say(f"could not reset GPU {gpu}: {e.reason}; run `emo reset-clocks`")

    def handle(self, req: dict) -> dict:
        from emo.device import zeusd

        rid, op, gpu = req.get("id"), req.get("op"), int(req.get("gpu", -1))
        if self.init_error is not None:
            return {"id": rid, "ok": False, "cause": self.init_error.cause, "error": str(self.init_error)}
        if op == "set" and self.draining:
            return {
                "id": rid,
                "ok": False,
                "cause": DRAINING,
                "error": "the clock owner got a signal and reset the clocks",
            }
        if op not in ("set", "reset"):
            return {"id": rid, "ok": False, "cause": zeusd.OTHER, "error": f"unknown request {op!r}"}
        try:
            if op == "set":
                self.set(gpu, int(req["mhz"]))
            elif gpu in self.locked:  # a GPU this owner never locked is not its to reset (another job's)
                self.release(gpu)
        except GpuAccessError as e:
            # refused outright (no permission, a bad clock) on a GPU no set of ours changed: drop its record
            # unreset; unreachable or unknown: it may have landed before the answer was lost, reset at the end
            unset = op == "set" and gpu in self.locked and gpu not in self.changed
            if unset and e.cause not in (zeusd.UNREACHABLE, zeusd.OTHER):
                gpu_locks.release(gpu, self.me, lambda g: None)
                self.locked.discard(gpu)
            return {"id": rid, "ok": False, "cause": e.cause, "error": e.reason}
        return {"id": rid, "ok": True}

    def set(self, gpu: int, mhz: int) -> None:
        assert self.ctl is not None  # ClockController.auto either returned one or set init_error
        self.take(gpu, mhz)
        self.locked.add(gpu)  # recorded as ours: reset at the end even if this set fails midway
        self.ctl.set_clock(gpu, mhz)
        self.changed.add(gpu)


def _supported(nvml, gpu: int) -> list[int]:
    """The SM clocks GPU `gpu` supports at its highest memory clock ([] if NVML cannot say: unchecked)."""
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(gpu)
        mem = max(int(m) for m in nvml.nvmlDeviceGetSupportedMemoryClocks(h))
        return sorted({int(c) for c in nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem)})
    except Exception:  # a stand-in or driver without the query: zeusd/NVML still refuse a bad clock
        return []


def _holder(gpu: int) -> str:
    rec = gpu_locks.read(gpu)
    return f"now held by {rec.describe()}" if rec is not None else "`emo reset-clocks`, or a take-over of a stuck owner"


class _BestEffort:
    """The owner's stderr: a pipe whose reader dies with the trainer; a line nobody reads is no
    reason to skip a reset."""

    def __init__(self, f):
        self.f = f

    def write(self, text: str) -> int:
        try:
            return self.f.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self.f.flush()
        except (OSError, ValueError):
            pass


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    sys.stderr = _BestEffort(sys.stderr)
    sock = socket.socket(fileno=fd)
    return serve(sock, parent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
