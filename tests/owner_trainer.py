"""A training job that ends in one of the ways real ones do (run by tests/test_clock_owner.py).

usage: python owner_trainer.py LOG MODE. The NVML fake logs to LOG, each call stamped with
time.monotonic(): this process's own NVML calls
(reads only: its clocks are set by its clock owner) and its clock owner's, through nvml_fake.owner_env
in the environment. It changes two GPUs' clocks every 5 ms, prints `ready <owner pid>`, then
(writing ["dying", time] to LOG first when it ends itself):

  hang         a thread keeps stepping while the main thread blocks in C for good (pthread_mutex_lock on
               a mutex it already holds: no signal interrupts it), as a rank hung in NCCL; the test
               sends SIGTERM, then SIGKILL after a grace period
  abort        os.abort(), as NCCL's watchdog does on a timeout
  _exit        os._exit(3)
  foreign-dfl  a framework sets SIGTERM back to SIG_DFL after EMO; the test sends SIGTERM
  foreign-exit a framework's SIGTERM handler calls os._exit(1); the test sends SIGTERM
  run          keeps training; the test sends SIGTERM (or SIGTERM, then SIGKILL 0.5 s later, or SIGKILL)
  raise        an uncaught exception
  second       a second applier in the same process (GPU 1), then the script ends without close()
  fork         a forked DataLoader-like worker tries to close/step/set through what it inherited, is
               sent SIGTERM and dies of it; the parent writes ["marker"] to LOG, keeps training and ends
"""

import ctypes
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvml_fake  # noqa: E402

log, mode = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may inherit SIGINT ignored
sys.modules["pynvml"] = nvml_fake.FakeNVML(gpus=2, log_path=log, stamp=True)


def dying() -> None:
    """Note when this process ends itself (the clock the fake stamps the owner's calls with)."""
    with open(log, "a") as f:
        f.write(json.dumps(["dying", time.monotonic()]) + "\n")


from emo.device import clock_owner  # noqa: E402
from emo.device.nvml_control import nvml_applier  # noqa: E402
from emo.policy import FrequencyPolicy, Step  # noqa: E402

CLOCKS = [1410, 1395, 1380, 900, 705]
steps = [Step(5 * t, CLOCKS[t % len(CLOCKS)]) for t in range(10)]  # a change every 5 ms
if mode == "second":
    ap = nvml_applier(FrequencyPolicy(gpu="a100", steps={0: steps}, period_ms=50), devices={0: 0}, lead_ms=0)
    ap2 = nvml_applier(FrequencyPolicy(gpu="a100", steps={1: steps[::-1]}, period_ms=50), devices={1: 1}, lead_ms=0)
else:
    ap = nvml_applier(FrequencyPolicy(gpu="a100", steps={0: steps, 1: steps[::-1]}, period_ms=50), lead_ms=0)
    ap2 = None


def train(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ap.step()
        if ap2 is not None:
            ap2.step()
        time.sleep(0.05)  # an iteration: the policy's period


def ready() -> None:
    print("ready", clock_owner._OWNER.proc.pid, flush=True)


def ready_once_main_is_blocked(main: int) -> None:
    """Say ready only when the main thread sleeps in the kernel (the second lock), then train on."""
    while open(f"/proc/self/task/{main}/stat").read().rsplit(")", 1)[1].split()[0] != "S":
        time.sleep(0.001)
    time.sleep(0.05)
    ready()
    train(3600)


train(0.12)
deadline = time.monotonic() + 20
while {t for a in (ap, ap2) if a for _, t, _ in a.log} != {0, 1} and time.monotonic() < deadline:
    train(0.05)  # both GPUs locked before the end begins (a loaded machine is slow)
if mode == "foreign-dfl":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
elif mode == "foreign-exit":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
if mode != "hang":
    ready()

if mode == "hang":
    libc = ctypes.CDLL(None)
    threading.Thread(target=ready_once_main_is_blocked, args=(threading.get_native_id(),), daemon=True).start()
    mutex = ctypes.create_string_buffer(64)  # a pthread_mutex_t (40 bytes on x86-64 glibc)
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # a default mutex locked twice by its owner: blocks in C for good
elif mode == "abort":
    train(0.01)
    dying()
    os.abort()
elif mode == "_exit":
    train(0.01)
    dying()
    os._exit(3)
elif mode == "raise":
    train(0.01)
    dying()
    raise RuntimeError("the loss went NaN")
elif mode == "second":
    train(0.03)
    dying()  # and end without close(): atexit stops both appliers' threads and resets
elif mode == "fork":
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: every way it could touch the parent's GPUs must do nothing
        ap.step()
        ap.close()
        try:
            ap.setter.set_clock(0, 210)
            os._exit(9)  # it must have refused
        except ValueError:
            pass
        os.write(w, b"1")  # (a signal before the child's after-fork handling would be lost)
        time.sleep(60)  # SIGTERM arrives here: EMO's inherited handler runs, and must reset nothing
        os._exit(8)
    train(0.02)
    os.read(r, 1)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    with open(log, "a") as f:
        f.write(json.dumps(["marker", os.waitstatus_to_exitcode(status)]) + "\n")
    train(0.1)  # the parent trains on at its own clocks
    dying()
    ap.close()
else:  # run
    train(3600)
