"""Clocks come back however the trainer dies, and a forked child never touches its parent's GPUs.

Each way a training job ends (tests/owner_trainer.py) is run REPEATS times at once, against the NVML
fake (its log holds the trainer's and its clock owner's calls). In every run: the last clock call for
every GPU touched is a reset, made within emo.device.clock_owner.RESET_BOUND_S of the death, and the
owner has exited. The 11 ways of issue 33: SIGTERM then SIGKILL while the main thread is blocked in
C (2 s and 10 s grace), os.abort, os._exit, a foreign SIGTERM handler (SIG_DFL; one calling
os._exit), a forked worker receiving SIGTERM (it must not reset the parent's GPUs), plain SIGTERM,
SIGTERM + 0.5 s SIGKILL, an uncaught exception, a second applier; and SIGKILL alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emo.device.clock_owner import RESET_BOUND_S

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import nvml_fake  # noqa: E402

REPEATS = 10
MEASURED: dict[str, float] = {}  # mode -> the slowest death-to-reset seen (printed with -s)


def _last_clock_calls(calls) -> dict[int, str]:
    last = {}
    for c in calls:
        if c[0] in ("lock", "reset"):
            last[c[1]] = c[0]
    return last


def _all_reset(log: Path) -> bool:
    last = _last_clock_calls(nvml_fake.read_log(log))
    return bool(last) and set(last.values()) == {"reset"}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie has exited
    except (FileNotFoundError, ProcessLookupError):
        return True


class Run:
    def __init__(self, tmp: Path, mode: str, i: int, env: dict | None = None):
        self.log = tmp / f"{mode}-{i}.jsonl"
        env = env if env is not None else nvml_fake.owner_env(self.log, gpus=2, stamp=True)
        self.p = subprocess.Popen(
            [sys.executable, str(HERE / "owner_trainer.py"), str(self.log), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env},
        )
        self.owner = self.death = self.reset_s = None

    def ready(self) -> None:
        line = self.p.stdout.readline().split()
        assert line[:1] == ["ready"], (line, self.p.stderr.read() if self.p.poll() is not None else "")
        self.owner = int(line[1])

    def end(self, action: str) -> None:
        """Kill it as `action` says (or let it end itself); then wait for the resets and time them
        from the death (the fake stamps each call with time.monotonic(), one clock for all)."""
        if action.startswith("TERM+KILL"):
            t = time.monotonic()
            self.p.send_signal(signal.SIGTERM)
            while self.p.poll() is None and time.monotonic() < t + float(action.split("@")[1]):
                time.sleep(0.002)
            if self.p.poll() is None:
                self.death = time.monotonic()
                self.p.kill()
            else:
                self.death = t  # it died of the SIGTERM, at some moment after t
        elif action in ("TERM", "KILL"):
            self.death = time.monotonic()
            self.p.send_signal(getattr(signal, "SIG" + action))
        self.p.wait()
        if self.death is None:  # it ended itself: its last words say when
            self.death = next(c[1] for c in nvml_fake.read_log(self.log) if c[0] == "dying")
        while not _all_reset(self.log) and time.monotonic() - self.death < 3 * RESET_BOUND_S:
            time.sleep(0.002)
        resets = {}
        for c in nvml_fake.read_log(self.log):
            if c[0] in ("lock", "reset"):
                resets[c[1]] = c[-1]  # when each GPU's last clock call was made
        self.reset_s = max(resets.values()) - self.death
        end = time.monotonic() + RESET_BOUND_S
        while not _gone(self.owner) and time.monotonic() < end:
            time.sleep(0.005)


def _run_all(tmp: Path, mode: str, action: str, env=lambda i: None) -> list[Run]:
    runs = [Run(tmp, mode, i, env(i)) for i in range(REPEATS)]  # at once: the grace periods overlap
    try:
        for r in runs:
            r.ready()
        threads = [threading.Thread(target=r.end, args=(action,)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for r in runs:
            if r.p.poll() is None:
                r.p.kill()
            r.p.wait()
            if r.owner and not _gone(r.owner):
                os.kill(r.owner, signal.SIGKILL)
    return runs


DEATHS = {  # mode of owner_trainer.py, how the test ends it, its exit status
    "TERM+KILL 2 s grace, main thread blocked in C": ("hang", "TERM+KILL@2", -signal.SIGKILL),
    "TERM+KILL 10 s grace, main thread blocked in C": ("hang", "TERM+KILL@10", -signal.SIGKILL),
    "os.abort": ("abort", "self", -signal.SIGABRT),
    "os._exit": ("_exit", "self", 3),
    "foreign SIGTERM handler: SIG_DFL": ("foreign-dfl", "TERM", -signal.SIGTERM),
    "foreign SIGTERM handler: os._exit": ("foreign-exit", "TERM", 1),
    "SIGTERM": ("run", "TERM", -signal.SIGTERM),
    "SIGTERM + 0.5 s SIGKILL": ("run", "TERM+KILL@0.5", -signal.SIGTERM),
    "SIGKILL": ("run", "KILL", -signal.SIGKILL),
    "uncaught exception": ("raise", "self", 1),
    "second applier": ("second", "self", 0),
}


@pytest.mark.parametrize("death", list(DEATHS))
def test_every_gpu_touched_is_reset_within_the_bound(tmp_path, death):
    mode, action, status = DEATHS[death]
    runs = _run_all(tmp_path, mode, action)
    for i, r in enumerate(runs):
        assert r.p.returncode == status, (i, r.p.returncode, r.p.stderr.read())
        calls = nvml_fake.read_log(r.log)
        last = _last_clock_calls(calls)
        assert set(last) == {0, 1}, f"run {i}: both GPUs were locked first ({last})"
        assert set(last.values()) == {"reset"}, f"run {i}: last clock calls {last}"
        assert r.reset_s <= RESET_BOUND_S, f"run {i}: reset {r.reset_s:.3f} s after the death"
        assert _gone(r.owner), f"run {i}: the clock owner outlived its trainer"
    MEASURED[death] = max(r.reset_s for r in runs)
    print(f"\n{death}: slowest reset {1000 * MEASURED[death]:.0f} ms after the death")


def test_a_forked_worker_neither_sets_nor_resets_the_parents_gpus(tmp_path):
    runs = _run_all(tmp_path, "fork", "self")
    for i, r in enumerate(runs):
        assert r.p.returncode == 0, r.p.stderr.read()
        calls = nvml_fake.read_log(r.log)
        marker = next(k for k, c in enumerate(calls) if c[0] == "marker")
        assert calls[marker][1] == -signal.SIGTERM  # the worker died of its SIGTERM ...
        before, after = calls[:marker], calls[marker + 1 :]
        assert not [c for c in before if c[0] == "reset"], f"run {i}: the worker reset the parent's GPUs"
        assert _last_clock_calls(before) == {0: "lock", 1: "lock"}  # ... and the parent's clocks stayed set
        assert [c for c in after if c[0] == "lock"], f"run {i}: the parent trained on at its clocks"
        assert not [c for c in calls if c[0] == "lock" and c[2] == 210], "the worker set a clock"
        assert _last_clock_calls(calls) == {0: "reset", 1: "reset"}


def test_a_clock_owner_signalled_directly_resets_at_once_and_takes_no_more_locks(tmp_path):
    """A scheduler that signals every process of a job reaches the owner too: it resets then, so
    that a SIGKILL to both later finds the clocks back already."""
    r = Run(tmp_path, "run", 0)
    try:
        r.ready()
        os.kill(r.owner, signal.SIGTERM)
        end = time.monotonic() + RESET_BOUND_S
        while not _all_reset(r.log) and time.monotonic() < end:
            time.sleep(0.002)
        assert _all_reset(r.log)
        time.sleep(0.1)
        n = len(nvml_fake.read_log(r.log))
        time.sleep(0.1)
        assert not [c for c in nvml_fake.read_log(r.log)[n:] if c[0] == "lock"]  # the trainer still steps
        r.p.kill()
        r.p.wait()
        os.kill(r.owner, signal.SIGKILL)  # both die: nothing left to reset
        assert _all_reset(r.log)
    finally:
        if r.p.poll() is None:
            r.p.kill()


def test_the_owner_does_not_run_the_sitecustomize_injected_into_the_job(monkeypatch):
    """Under `emo trace` / `emo apply` the job's PYTHONPATH starts with emo/_site; the owner the job
    spawns must not arm EMO's hooks (or the user's chained sitecustomize) in itself."""
    import subprocess

    from emo.device import clock_owner
    from emo.device.launcher import SITE_DIR

    seen = {}

    def fake_popen(argv, **kw):
        seen.update(kw)
        raise OSError("not started in this test")

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SITE_DIR), "/somewhere/else"]))
    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    with pytest.raises(OSError):
        clock_owner.spawn()
    paths = seen["env"]["PYTHONPATH"].split(os.pathsep)
    assert str(SITE_DIR) not in paths and "/somewhere/else" in paths
