"""Clocks always come back: after any exit, the last NVML call for every GPU touched is a reset.

The hardware path (emo.device.nvml: ClockController, the restore guard, nvml_applier's threads)
runs against the NVML fake (tests/nvml_fake.py), which logs every call to a file, so that what a
killed process did can be read afterwards.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from emo.policy import FrequencyPolicy, Step
from emo.runtime import PolicyApplier

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import nvml_fake  # noqa: E402

# A training loop at 1 ms policy steps on two GPUs, killed (by the parent) at a random point.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may inherit SIGINT ignored
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # ... and SIGHUP, under nohup: EMO rightly leaves an ignored one be
    sys.path.insert(0, {here!r})
    import nvml_fake
    sys.modules["pynvml"] = nvml_fake.FakeNVML(gpus=2, log_path=sys.argv[1])
    from emo.policy import FrequencyPolicy, Step
    from emo.device.nvml_control import nvml_applier
    clocks = [1410, 1395, 1380, 900, 705]
    steps = [Step(t, clocks[t % len(clocks)]) for t in range(0, 10)]  # a change every 1 ms
    ap = nvml_applier(FrequencyPolicy(gpu="a100", steps={{0: steps, 1: steps[::-1]}}, period_ms=10), lead_ms=0)
    ap.step()
    deadline = time.monotonic() + 20
    while not ap.log and time.monotonic() < deadline:  # a first clock landed (through the clock owner)
        time.sleep(0.001)
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        ap.step()
        time.sleep(0.01)
    raise SystemExit(3)  # the main thread ends without close(): atexit must still stop the threads
""")


def _run_once(tmp: Path, pattern: str, delay_s: float) -> tuple[list[tuple], int]:
    log = tmp / f"calls-{pattern}-{delay_s:.4f}.jsonl"
    life = delay_s if pattern == "exit" else 30
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(here=str(HERE)), str(log), str(life)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **nvml_fake.owner_env(log, gpus=2)},
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(delay_s)
        if pattern in ("INT", "TERM", "HUP"):
            p.send_signal(getattr(signal, "SIG" + pattern))
        elif pattern == "TERM+KILL":  # SLURM / Kubernetes: SIGTERM, then SIGKILL after a grace period
            p.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            if p.poll() is None:
                p.kill()
        p.wait(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    _wait_for_resets(log)  # a violent end is reset by the clock owner, moments after the death
    return nvml_fake.read_log(log), p.returncode


def _wait_for_resets(log: Path, bound_s: float = 1.0) -> None:
    end = time.monotonic() + bound_s
    while time.monotonic() < end and set(_last_call_is_reset(nvml_fake.read_log(log)).values()) - {"reset"}:
        time.sleep(0.01)


def _last_call_is_reset(calls: list[tuple]) -> dict[int, str]:
    """{GPU: its last clock call} for every GPU that was locked."""
    last = {}
    for c in calls:
        if c[0] in ("lock", "reset"):
            last[c[1]] = c[0]
    return last


PATTERNS = ("INT", "TERM", "HUP", "TERM+KILL", "exit")


def _stress(tmp_path, runs: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(runs):
        pattern = PATTERNS[i % len(PATTERNS)]
        calls, rc = _run_once(tmp_path, pattern, rng.uniform(0.0, 0.06))
        last = _last_call_is_reset(calls)
        assert last, f"{pattern}: the applier never locked a clock"
        assert set(last.values()) == {"reset"}, f"run {i} ({pattern}): last calls {last}"
        if pattern != "exit":
            assert rc != 0


def test_every_signal_and_exit_leaves_every_gpu_reset(tmp_path):
    """Two runs of each pattern at random kill points (the quick version of the stress test)."""
    _stress(tmp_path, 2 * len(PATTERNS), seed=1)


@pytest.mark.slow
def test_stress_many_runs_at_1ms_steps_random_kill_points(tmp_path):
    _stress(tmp_path, 24 * len(PATTERNS), seed=2)


# --------------------------------------------------------------------------- in-process
class SlowSetter:
    """A set-clock call that takes `delay_s` (an NVML or zeusd call stuck behind the driver)."""

    def __init__(self, delay_s: float):
        self.delay_s, self.calls, self.lock = delay_s, [], threading.Lock()

    def set_clock(self, device, mhz):
        time.sleep(self.delay_s)
        with self.lock:
            self.calls.append(("set", device, mhz))

    def reset_clock(self, device):
        with self.lock:
            self.calls.append(("reset", device))


def test_close_with_a_slow_set_clock_call_still_ends_with_a_reset(monkeypatch):
    monkeypatch.setattr(PolicyApplier, "JOIN_S", 0.2)  # close() gives up waiting long before the call returns
    setter = SlowSetter(1.0)
    ap = PolicyApplier(FrequencyPolicy(gpu="a100", steps={0: [Step(0, 900)]}, period_ms=10), setter, lead_ms=0)
    ap.step()
    time.sleep(0.1)  # the first set-clock call is in flight
    t0 = time.monotonic()
    ap.close()
    assert time.monotonic() - t0 < 0.8  # close() does not hang on the driver
    assert setter.calls == [("reset", 0)]  # reset at once ...
    time.sleep(1.2)
    assert setter.calls == [("reset", 0), ("set", 0, 900), ("reset", 0)]  # ... and again after the late call


def test_no_request_starts_once_close_began():
    setter = SlowSetter(0.0)
    steps = [Step(t, 900 if t % 2 else 1410) for t in range(10)]
    ap = PolicyApplier(FrequencyPolicy(gpu="a100", steps={0: steps, 1: steps}, period_ms=10), setter, lead_ms=0)
    for _ in range(20):
        ap.step()
        time.sleep(0.002)
    ap.close()
    n = len(setter.calls)
    time.sleep(0.05)
    assert len(setter.calls) == n
    assert {d: c[0] for c in setter.calls for d in [c[1]]} == {0: "reset", 1: "reset"}


def test_restore_guard_stops_the_appliers_before_resetting(monkeypatch, tmp_path):
    from emo.device import clock_owner
    from emo.device import nvml as nv

    monkeypatch.setattr(clock_owner, "_OWNER", None)  # this test's own owner, with this test's fake
    log = tmp_path / "calls.jsonl"
    nvml_fake.install(monkeypatch)
    for k, v in nvml_fake.owner_env(log).items():  # the clock owner makes the calls, into this log
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    guard = nv._RestoreGuard()
    monkeypatch.setattr(nv, "_GUARD", guard)
    monkeypatch.setattr(guard, "_install", lambda: setattr(guard, "_installed", True))  # no handlers in pytest
    steps = [Step(t, 900 if t % 2 else 1410) for t in range(10)]
    from emo.device.nvml_control import nvml_applier

    ap = nvml_applier(FrequencyPolicy(gpu="a100", steps={0: steps, 1: steps}, period_ms=10), lead_ms=0)
    for _ in range(10):
        ap.step()
        time.sleep(0.003)
    assert guard.restore_all() == []
    n = len(nvml_fake.read_log(log))
    time.sleep(0.05)
    calls = nvml_fake.read_log(log)
    assert len(calls) == n  # nothing after the restore
    assert _last_call_is_reset(calls) == {0: "reset", 1: "reset"}
    assert guard.pending() == {}
    clock_owner._OWNER.close()
    assert clock_owner._OWNER.proc.returncode == 0


def test_sighup_is_handled():
    from emo.device import nvml as nv

    assert signal.SIGHUP in nv._RestoreGuard.SIGNALS


def test_no_import_circle_between_capture_the_nvml_backend_and_the_runtime():
    """The applier lives in the NVML backend, the runner in emo.device.launcher: the backend imports no
    CLI module, and the runtime's threads know nothing of NVML (issue 10, item 3)."""
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("emo")
    mods = ("emo.capture", "emo.device.nvml", "emo.runtime", "emo.device.launcher")
    for a in mods:
        for b in mods:
            if a != b and g.chain_exists(importer=a, imported=b):
                assert not g.chain_exists(importer=b, imported=a), f"{a} <-> {b}"
    assert not g.chain_exists(importer="emo.device.nvml", imported="emo.capture")
    assert not g.chain_exists(importer="emo.runtime", imported="emo.device.nvml")
