"""`emo run workload=command` on a machine without a GPU (issue 47, item 3): the user's real program,
launcher and ranks (torchrun, 2 CPU ranks over gloo) run at every launch a GPU box would make, and
the virtual A100 stands in for the kernels, the clocks and the energy counter
(emo.device.sim.command); the run prints one line per finished stage and ends with the result line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # about 2 minutes on 2 cores: 5 launches of a 2-rank job, calibrate
ROOT = Path(__file__).resolve().parents[1]

PROGRAM = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist

    if os.environ.get("RANK") == "0":
        with open(os.environ["LAUNCH_LOG"], "a") as f:
            f.write(os.environ["EMO_ITERATIONS"] + "\\n")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 512)
    for step in range(1000):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    dist.destroy_process_group()
""")
STAGES = ("calibrate", "trace", "graph", "pack", "profile", "fit", "optimize", "validate")


def test_emo_run_of_a_command_on_the_virtual_gpu(tmp_path):
    (tmp_path / "train.py").write_text(PROGRAM)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "emo.cli",
            "run",
            f"results={tmp_path / 'results'}",
            "gpu=a100",
            "workload=command",
            f"workload.command=[{torchrun},--nproc-per-node,2,train.py]",
            "model.clocks_stride=8",
            "model.repeats=1",
            "model.min_seconds=0.2",
            "validate.min_seconds=0.5",
            "gpu.settle_s=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LAUNCH_LOG": str(tmp_path / "launches")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # every launch a GPU box makes (docs/gpu.md): trace, its untraced run, profile's counters and
    # baselines, validate; each told to run the iterations its recording needs, then ended by EMO
    launches = (tmp_path / "launches").read_text().split()
    assert launches == ["13"] * 5, launches
    assert r.stderr.count("13 iterations done (EMO_ITERATIONS=13): ending the program") == 10  # 2 ranks each
    lines = r.stderr.splitlines()
    done = [m.group(1) for ln in lines if (m := re.match(r"emo: (\w+) done in [\d.]+ s: ", ln))]
    assert done == list(STAGES), done
    last = (r.stdout.strip().splitlines() or [""])[-1]  # the result line, on stdout
    m = re.search(r": emo on a100, budget 2 %: ES (-?[\d.]+) %, PL (-?[\d.]+) %(.*); policy (\S+)", last)
    assert m and Path(m.group(4)).is_file(), last
    # the trace is the virtual GPU's: the program's ops became kernels, its DDP allreduce a collective
    traces = list((tmp_path / "results" / "trace").glob("*/kineto/rank*.json*"))
    assert len(traces) == 2, traces
