"""One owner per GPU on a node (issue 48 item 1), against the NVML fake: jobs (tests/lock_job.py)
whose clock owners log to one file and share one lock folder, as two jobs on one node do.

A second job on a held GPU is refused at its start in one line and never resets the first one's
GPU; a job killed with its owner leaves a record that the next EMO command finds, resets and names;
a stopped owner whose GPU was taken over does not reset it when continued; `emo reset-clocks`
clears the records and says whose they were; an owner killed under its trainer is replaced and
the new one resets what the dead one left locked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emo.device import gpu_locks

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import nvml_fake  # noqa: E402


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node: one NVML fake log (every owner's clock calls, in order) and one lock folder."""
    log = tmp_path / "node.jsonl"
    locks = str(tmp_path / "locks")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **nvml_fake.owner_env(log, gpus=2), gpu_locks.LOCK_DIR_ENV: locks}
    monkeypatch.setenv(gpu_locks.LOCK_DIR_ENV, locks)
    return log, env


def _job(node, gpu: int, seconds: float, stop: Path | None = None) -> subprocess.Popen:
    log, env = node
    return subprocess.Popen(
        [sys.executable, str(HERE / "lock_job.py"), str(log), str(gpu), str(seconds), *([str(stop)] if stop else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _ready(p: subprocess.Popen) -> int:
    line = p.stdout.readline().split()
    assert line[:1] == ["ready"], (line, p.stderr.read() if p.poll() is not None else "")
    return int(line[1])


def _mark(log: Path, what: str) -> None:
    with open(log, "a") as f:
        f.write(json.dumps([what]) + "\n")


def _calls_after(log: Path, marker: str) -> list[tuple]:
    calls = nvml_fake.read_log(log)
    i = max(i for i, c in enumerate(calls) if c[0] == marker)
    return calls[i + 1 :]


def _until_closing(calls: list[tuple], gpu: int) -> list[tuple]:
    out = []
    for c in calls:
        if c[:2] == ("closing", gpu):
            break
        out.append(c)
    return out


def _summary(p: subprocess.Popen) -> tuple[dict, str]:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[-1]), err


def test_a_second_job_on_a_held_gpu_is_refused_and_resets_nothing(node, tmp_path):
    log, _ = node
    first = _job(node, 0, 120.0, stop=tmp_path / "stop")  # until the second job is done, however slow
    try:
        _ready(first)
        _mark(log, "second starts")
        second = _job(node, 0, 0.3)
        out, err = second.communicate(timeout=60)
        lines = [ln for ln in err.splitlines() if ln.startswith("emo")]
        assert second.returncode == 3 and len(lines) == 1, err
        assert f"GPU 0 is held by EMO job {first.pid} of " in lines[0] and "lock_job.py" in lines[0]
        (tmp_path / "stop").touch()
        s, _ = _summary(first)
        assert ("reset", 0) not in [c[:2] for c in _until_closing(_calls_after(log, "second starts"), 0)]
        assert s["landed"] > 0 and s["failed"] == s["lost"] == 0, s
    finally:
        first.kill()


def test_a_job_killed_with_its_owner_is_recorded_and_the_next_job_resets_its_gpu(node):
    log, _ = node
    first = _job(node, 0, 60.0)
    owner = _ready(first)
    os.kill(owner, signal.SIGKILL)
    first.kill()  # both at once: an OOM kill of the job's cgroup
    first.wait()
    time.sleep(0.2)
    rec = gpu_locks.read(0)
    assert rec is not None and rec.holder.trainer == first.pid and not rec.holder.alive()
    _mark(log, "killed")
    assert ("reset", 0) not in [c[:2] for c in _calls_after(log, "killed")]
    second = _job(node, 0, 0.3)
    s, err = _summary(second)
    assert f"GPU 0 was left locked by EMO job {first.pid} of " in err and "now dead" in err, err
    clock_calls = [c[:2] for c in _calls_after(log, "killed") if c[0] in ("lock", "reset")]
    assert clock_calls[0] == ("reset", 0)  # reset before the new job's first clock
    assert s["landed"] > 0 and s["failed"] == 0 and gpu_locks.read(0) is None


def _gone(pid: int) -> bool:
    return gpu_locks.start_time(pid) is None


def test_a_stopped_owner_continued_after_a_take_over_resets_nothing(node):
    log, _ = node
    first = _job(node, 0, 60.0)
    owner = _ready(first)
    os.kill(owner, signal.SIGSTOP)
    try:
        first.kill()
        first.wait()
        second = _job(node, 0, 120.0, stop=log.parent / "stop")
        _ready(second)  # took GPU 0 over from the stopped owner (its trainer is dead)
        os.kill(owner, signal.SIGCONT)
        _mark(log, "continued")
        deadline = time.monotonic() + 30
        while not _gone(owner) and time.monotonic() < deadline:
            time.sleep(0.05)  # the continued owner sees its trainer gone and ends
        (log.parent / "stop").touch()
        s, err = _summary(second)
        assert ("reset", 0) not in [c[:2] for c in _until_closing(_calls_after(log, "continued"), 0)]
        assert "GPU 0 was left locked by" in err and s["lost"] == 0 and s["failed"] == 0, (s, err)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it ended itself once continued
            os.kill(owner, signal.SIGCONT)
            os.kill(owner, signal.SIGKILL)


def test_emo_reset_clocks_clears_the_records_and_says_whose(node, monkeypatch, capsys):
    from emo.cli import reset_clocks

    log, _ = node
    first = _job(node, 1, 60.0)
    owner = _ready(first)
    os.kill(owner, signal.SIGKILL)
    first.kill()
    first.wait()
    nvml_fake.install(monkeypatch, gpus=2)
    monkeypatch.setattr("emo.device.nvml.os.geteuid", lambda: 0)
    args = type("A", (), {"gpus": "1", "power": False})()
    assert reset_clocks._cmd(args) == 0
    err = capsys.readouterr().err
    assert f"GPU 1 was left locked by EMO job {first.pid} of " in err and gpu_locks.read(1) is None, err


def test_an_owner_killed_under_a_live_trainer_is_replaced_and_its_gpu_reset(node, tmp_path):
    """Killing the owner first: the trainer's next request fails (said), a new owner resets the GPU
    the dead one left locked, and the job's later requests land again."""
    log, env = node
    code = f"""
import sys, time, os, signal, json
sys.path.insert(0, {str(HERE)!r})
import nvml_fake
sys.modules["pynvml"] = nvml_fake.FakeNVML(gpus=2)
from emo.device import clock_owner
from emo.device.nvml_control import nvml_applier
from emo.policy import FrequencyPolicy, Step
ap = nvml_applier(FrequencyPolicy(gpu="a100", steps={{0: [Step(0, 1410), Step(5, 900)]}}, period_ms=10),
                  devices={{0: 0}}, lead_ms=0)
for i in range(60):
    ap.step()
    time.sleep(0.01)
    if i == 20:
        os.kill(clock_owner._OWNER.proc.pid, signal.SIGKILL)
ap.close()
print(json.dumps(ap.summary()))
"""
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout.splitlines()[-1])
    assert s["failed"] >= 1 and s["landed"] > 20, s  # the request the death cut off, then landing again
    assert "a new clock owner reset the GPUs it left locked" in p.stderr, p.stderr
    assert "GPU 0 was left locked by" in p.stderr and gpu_locks.read(0) is None, p.stderr
    calls = [c[:2] for c in nvml_fake.read_log(log) if c[0] in ("lock", "reset")]
    assert calls[-1] == ("reset", 0)


def test_emo_apply_resets_what_a_job_killed_with_its_owners_left_locked(tmp_path):
    """Every process of the job SIGKILLed at once: `emo apply` itself finds the record after the job,
    resets the GPU and says so (it printed `0 rank(s)` and nothing else before)."""
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"gpu": "a100", "steps": {"0": [{"t_ms": 0, "sm_mhz": 900}]}, "period_ms": 10}))
    job = tmp_path / "job.py"
    job.write_text(
        "import os, signal, sys, time\nimport emo\nfrom emo.device import clock_owner\n"
        "with emo.apply(sys.argv[1]) as clocks:\n"
        "    for _ in range(5):\n        clocks.step()\n        time.sleep(0.01)\n"
        "    os.kill(clock_owner._OWNER.proc.pid, signal.SIGKILL)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "EMO_FAKE_GPU": "1", gpu_locks.LOCK_DIR_ENV: str(tmp_path / "locks")}
    cli = "import sys; from emo.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", cli, "apply", "--policy", str(policy), "--", sys.executable, str(job), str(policy)]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 137, p.stderr  # the job's SIGKILL, by the shell's convention
    line = [ln for ln in p.stderr.splitlines() if "was left locked" in ln]
    assert (
        len(line) == 1
        and line[0].startswith("emo apply: GPU 0 was left locked by EMO job ")
        and line[0].endswith("now dead: reset it")
    ), p.stderr
    assert not list((tmp_path / "locks").glob("gpu*.json"))


def test_a_lock_folder_no_one_can_write_is_one_line_not_a_crash(node, tmp_path, monkeypatch):
    """The records cannot be written (a folder another user made, a file in its place): the job's
    first request says so in one line and nothing is changed; the owner lives on."""
    log, env = node
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env[gpu_locks.LOCK_DIR_ENV] = str(blocker / "locks")
    p = _job((log, env), 0, 0.3)
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.startswith("emo: GPU 0")]
    assert p.returncode == 0 and len(lines) == 1, err
    assert "cannot record the GPU's lock in" in lines[0] and gpu_locks.LOCK_DIR_ENV in lines[0], err
    assert "Traceback" not in err and not [c for c in nvml_fake.read_log(log) if c[0] == "lock"]
