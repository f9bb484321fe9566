"""EMO's own stages take the node's GPU lock records too (issue 48 item 1): calibrate's and validate's
in-process clocks (emo.device.nvml: NvmlDevice, ClockController) are recorded through
emo.device.gpu_locks exactly as a clock owner's, against the NVML fake.

A stage's lock writes a record naming its process; its reset removes it; a second stage on a GPU a
live one holds is refused in one line and changes nothing; a SIGKILLed stage's record is found by
`emo reset-clocks` and by the next stage's first lock, which reset the GPU and say so; a stage whose
GPU was taken over by someone else does not reset it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emo.device import gpu_locks
from emo.device import nvml as nv
from emo.device.gpu_locks import HELD, LOST
from emo.policy import FrequencyPolicy

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import nvml_fake  # noqa: E402

# A stage holding a clock, as calibrate does (NvmlDevice.lock_clock before each microbenchmark), in a
# process of its own: argv LOG GPU SECONDS. It prints `ready` once the clock is locked; a refusal is
# one line on stderr and exit status 3, as `emo` ends on a GpuAccessError (a DeviceError).
STAGE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    import nvml_fake
    sys.modules["pynvml"] = nvml_fake.FakeNVML(gpus=2, log_path=sys.argv[1])
    from emo.device.nvml import NvmlDevice, GpuAccessError
    dev = NvmlDevice({{"name": "a100", "backend": "nvml"}})
    try:
        dev.lock_clock(int(sys.argv[2]), 900)
    except GpuAccessError as e:
        print(f"emo: error: {{e}}", file=sys.stderr)
        sys.exit(e.exit_code)
    print("ready", flush=True)
    time.sleep(float(sys.argv[3]))
    dev.close()
""")


class _QuietGuard(nv._RestoreGuard):
    def _install(self):  # no atexit/signal handlers inside pytest
        self._installed = True


@pytest.fixture
def node(tmp_path, monkeypatch):
    """This process's NVML fake, a fresh restore guard, one lock folder shared with the stages it starts."""
    monkeypatch.setattr(nv, "_GUARD", _QuietGuard())
    monkeypatch.setenv(gpu_locks.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    return nvml_fake.install(monkeypatch, gpus=2)


def _stage(tmp_path: Path, gpu: int, seconds: float) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"stage-{gpu}-{len(list(tmp_path.glob('stage-*')))}.jsonl"
    p = subprocess.Popen(
        [sys.executable, "-c", STAGE.format(here=str(HERE)), str(log), str(gpu), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return p, log


def _ready(p: subprocess.Popen) -> None:
    line = p.stdout.readline().strip()
    assert line == "ready", (line, p.stderr.read() if p.poll() is not None else "")


def _killed(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)


def _clock_calls(calls) -> list[tuple]:
    return [c[:2] for c in calls if c[0] in ("lock", "reset")]


def test_a_calibrate_lock_writes_a_record_and_its_reset_removes_it(node):
    dev = nv.NvmlDevice({"name": "a100", "backend": "nvml"})
    dev.lock_clock(1, 900)  # what calibrate does before each microbenchmark
    rec = gpu_locks.read(1)
    assert rec is not None and rec.holder == gpu_locks.Holder.me(os.getpid()) and rec.holder.alive()
    assert f"EMO job {os.getpid()} of {rec.user} (`" in rec.describe() and "clock owner" not in rec.describe()
    dev.close()  # the restore guard resets it: the record goes with the reset
    assert gpu_locks.read(1) is None and node.locked[1] is None


def test_validate_static_clocks_are_recorded_and_released_by_set_policy(node):
    dev = nv.NvmlDevice({"name": "a100", "backend": "nvml"})
    dev.set_policy(FrequencyPolicy.static("a100", 2, 705))
    assert {r.gpu for r in gpu_locks.records()} == {0, 1}
    dev.set_policy(None)
    assert gpu_locks.records() == [] and _clock_calls(node.calls)[-2:] == [("reset", 0), ("reset", 1)]
    dev.close()


def test_a_second_stage_on_a_held_gpu_is_refused_in_one_line(node, tmp_path):
    first, _ = _stage(tmp_path, 0, 120.0)
    try:
        _ready(first)
        dev = nv.NvmlDevice({"name": "a100", "backend": "nvml"})
        with pytest.raises(nv.GpuAccessError) as e:
            dev.lock_clock(0, 1395)
        text = str(e.value)
        assert e.value.cause == HELD and "\n" not in text, text
        assert text.startswith(f"GPU 0 is held by EMO job {first.pid} of ") and "wait for it to end" in text
        assert _clock_calls(node.calls) == []  # nothing locked, nothing reset
        dev.close()
        assert gpu_locks.read(0).holder.pid == first.pid  # its record stays its own
        # the same in a process of its own: exit 3 (a DeviceError), one line
        second, log = _stage(tmp_path, 0, 0.1)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 3 and out == "", err
        assert err.count("\n") == 1 and err.startswith(f"emo: error: GPU 0 is held by EMO job {first.pid} "), err
        assert _clock_calls(nvml_fake.read_log(log)) == []
    finally:
        _killed(first)


def test_a_sigkilled_stage_is_found_and_reset_by_emo_reset_clocks(node, tmp_path, capsys):
    from emo.cli import reset_clocks

    stage, _ = _stage(tmp_path, 1, 120.0)
    _ready(stage)
    _killed(stage)  # no atexit, no handler: the clock stays locked
    rec = gpu_locks.read(1)
    assert rec is not None and rec.holder.pid == rec.holder.trainer == stage.pid and not rec.holder.alive()
    args = type("A", (), {"gpus": "1", "power": False})()
    assert reset_clocks._cmd(args) == 0
    err = capsys.readouterr().err
    assert f"emo reset-clocks: GPU 1 was left locked by EMO job {stage.pid} of " in err and "now dead: reset" in err
    assert gpu_locks.read(1) is None and ("reset", 1) in _clock_calls(node.calls)


def test_the_next_stage_resets_a_dead_stages_lock_and_says_so(node, tmp_path, capsys):
    stage, _ = _stage(tmp_path, 0, 120.0)
    _ready(stage)
    _killed(stage)
    dev = nv.NvmlDevice({"name": "a100", "backend": "nvml"})
    dev.lock_clock(1, 900)  # another GPU: its first lock resets what dead EMO jobs left on the node
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if "was left locked" in ln]
    assert len(line) == 1 and line[0].startswith(f"emo: GPU 0 was left locked by EMO job {stage.pid} of "), err
    assert line[0].endswith("now dead: reset it"), err
    assert _clock_calls(node.calls) == [("reset", 0), ("lock", 1)]  # reset before its own first clock
    assert gpu_locks.read(0) is None and gpu_locks.read(1).holder.pid == os.getpid()
    dev.close()
    assert gpu_locks.records() == []


def test_a_gpu_taken_over_from_a_stage_is_not_reset_by_it(node, capsys):
    other = subprocess.Popen(["sleep", "120"])  # a live EMO job of the node, as its record names it
    try:
        dev = nv.NvmlDevice({"name": "a100", "backend": "nvml"})
        dev.lock_clock(0, 900)
        gpu_locks.forget(0)  # `emo reset-clocks` ...
        them = gpu_locks.Holder(other.pid, gpu_locks.start_time(other.pid), other.pid, gpu_locks.start_time(other.pid))
        gpu_locks.acquire(0, them)  # ... then another job takes GPU 0
        with pytest.raises(nv.GpuAccessError) as e:
            dev.lock_clock(0, 705)
        assert e.value.cause == LOST and f"now held by EMO job {other.pid} " in str(e.value)
        dev.close()  # its restore resets nothing of the other job's
        assert _clock_calls(node.calls) == [("lock", 0)]
        assert gpu_locks.read(0).holder == them
    finally:
        other.kill()
        other.wait()


def test_a_clock_refused_by_nvml_leaves_no_record(node, monkeypatch):
    dev = nv.NvmlDevice({"name": "a100", "backend": "nvml"})
    monkeypatch.setattr(node, "permission", False)
    with pytest.raises(nv.GpuAccessError, match="permission denied"):
        dev.lock_clock(0, 900)
    assert gpu_locks.records() == [] and nv._GUARD.pending() == {}
    dev.close()
