"""`emo trace` counts the ranks a launcher asks for when none of them wrote a trace (issue 47: a
2-rank torchrun job that wrote nothing was `0 of 1 rank traces written`)."""

from __future__ import annotations

import sys

import pytest

from emo.device import launcher


@pytest.mark.parametrize(
    "command, ranks",
    [
        (["torchrun", "--nproc-per-node", "2", "train.py"], 2),
        (["/usr/bin/torchrun", "--nnodes=2", "--nproc_per_node=8", "train.py", "--nproc-per-node", "3"], 8),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "train.py"], 4),
        (["deepspeed", "--num_gpus", "2", "train.py"], 2),
        (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "train.py"], 2),
        (["torchrun", "--nproc-per-node", "gpu", "train.py"], None),  # as many as GPUs: unknown here
        (["python", "train.py", "--nproc-per-node", "2"], None),  # the program's own option
        (["sh", "run.sh"], None),
    ],
)
def test_the_ranks_a_launcher_asks_for(command, ranks):
    assert launcher.ranks_asked(command) == ranks


def test_a_launch_that_wrote_no_trace_says_how_many_ranks_it_expected(tmp_path):
    # a "torchrun" that starts no rank (a launcher by its name)
    fake = tmp_path / "torchrun"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    spec = launcher.CaptureSpec(command=[str(fake), "--nproc-per-node", "2", "train.py"], wait=0, warmup=0, active=1)
    with pytest.raises(ValueError, match=r": 0 of 2 rank traces written; "):
        launcher.run_capture(spec, tmp_path / "out")
