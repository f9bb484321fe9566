"""The clock owner does not hold the trainer's stderr (issue 48, item 8): a parent that reads a
training job's output to its end (`subprocess.run(capture_output=True)`, a CI runner, a pipe into
`tee`) gets the end when the trainer exits, not when its clock owner does, also when the owner
is stuck; and what the owner says still reaches the trainer's stderr while the trainer lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import nvml_fake  # noqa: E402

TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    from emo.device import clock_owner
    o = clock_owner.owner()
    print(o.proc.pid, flush=True)
    print("trainer: done", file=sys.stderr, flush=True)
    os.kill(o.proc.pid, signal.SIGSTOP)  # a stuck owner (stopped, or in a call that never returns)
    """
)


def test_the_trainers_output_ends_with_the_trainer_not_its_clock_owner(tmp_path):
    env = {**os.environ, **nvml_fake.owner_env(tmp_path / "nvml.jsonl", gpus=1)}
    p = subprocess.Popen(
        [sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    owner = int(p.stdout.readline())
    try:
        out, err = p.communicate(timeout=20)  # was: no end while the stopped owner held the trainer's stderr
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("the trainer's stderr stayed open after it exited: held by its clock owner") from None
    finally:
        os.kill(owner, signal.SIGKILL)  # the owner this test stopped
    assert p.returncode == 0 and "trainer: done" in err


def test_what_the_owner_says_reaches_the_trainers_stderr(capsys):
    from emo.device.clock_owner import relay_stderr

    w = relay_stderr()
    os.write(w, b"emo clock owner: GPU 0 was left locked by pid 1, now dead\n")
    os.close(w)
    for _ in range(200):  # the relay is a thread: give it a moment
        if "GPU 0 was left locked" in capsys.readouterr().err:
            return
        time.sleep(0.01)
    raise AssertionError("the owner's line never reached this process's stderr")
