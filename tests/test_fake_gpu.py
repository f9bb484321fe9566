"""Trying the GPU path without a GPU (issue 47 item 3): EMO_FAKE_GPU=N puts N fake GPUs (the NVML
fake, shipped in the package as emo.device.nvml_fake) behind every EMO process of the job, so that
`emo apply`, `emo.apply` and `emo.measure` run on a CPU machine from the installed package alone,
with no test folder on the path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emo.policy import FrequencyPolicy, Step

ROOT = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent("""
    import os, time, emo
    with emo.measure() as w:
        with emo.apply(os.environ["POLICY"]) as clocks:
            for i in range(20):
                clocks.step()
                time.sleep(0.002)
    print(f"landed {clocks.landed} failed {clocks.failed} joules {w.result.energy_j:.3f} gpus {len(w.result.per_gpu_j)}")
""")


@pytest.fixture
def job(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    steps = {d: [Step(0.0, 1410), Step(1.0, 900)] for d in range(2)}
    FrequencyPolicy(gpu="a100", steps=steps, period_ms=2.0, meta={}).save(tmp_path / "p.json")
    return tmp_path


def _run(job, *command, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EMO_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    return subprocess.run(
        list(command),
        cwd=job,
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},  # the package, not tests/
    )


def test_the_fake_ships_in_the_package():
    import emo.device.nvml_fake as fake

    assert Path(fake.__file__).resolve().is_relative_to(ROOT / "emo")


def test_emo_apply_and_measure_run_against_fake_gpus(job):
    log = job / "nvml.log"
    r = _run(job, sys.executable, "train.py", POLICY="p.json", EMO_FAKE_GPU="2", EMO_FAKE_GPU_LOG=str(log))
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert int(words[1]) > 0 and words[3] == "0" and float(words[5]) > 0 and words[7] == "2", r.stdout
    calls = log.read_text()
    assert '"lock", 0' in calls and "1410" in calls and "900" in calls  # both of the schedule's clocks


def test_without_the_variable_nothing_is_faked(job):
    # NVML as this machine has it: here, no driver (one line); on a GPU box the real GPUs
    r = _run(job, sys.executable, "-c", "import emo.device.nvml as n; print(type(n.import_pynvml()).__name__)")
    assert r.returncode == 0 and r.stdout.strip() == "module"


def test_a_bad_count_is_one_line(job):
    r = _run(job, sys.executable, "train.py", POLICY="p.json", EMO_FAKE_GPU="many")
    assert r.returncode == 1 and "EMO_FAKE_GPU=many: the number of fake GPUs, 1 to 64" in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.slow
def test_emo_apply_runs_a_torchrun_job_against_fake_gpus(job):
    pytest.importorskip("torch")
    (job / "ddp.py").write_text(
        textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for i in range(20):
            loss = m(torch.randn(8, 16)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
        """)
    )
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    emo = [sys.executable, "-m", "emo.cli", "apply", "--policy", "p.json", "--"]
    r = _run(job, *emo, torchrun, "--nproc-per-node", "2", "ddp.py", EMO_FAKE_GPU="2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rank 0 (policy device 0):" in r.stderr and "rank 1 (policy device 1):" in r.stderr
    assert "emo apply: 2 rank(s): " in r.stderr and " 0 failed" in r.stderr.split("2 rank(s): ")[1]


def test_the_fake_a100s_take_a_policy_emo_run_planned_for_an_a100(job):
    # `emo run` plans on conf/gpu/a100.yaml's clocks (every 15 MHz); the README's `EMO_FAKE_GPU=2
    # emo apply ...` on its policy was refused at 1215 MHz when the fake answered the tests' few clocks
    steps = {d: [Step(0.0, 1215), Step(1.0, 1410)] for d in range(2)}
    FrequencyPolicy(gpu="a100", steps=steps, period_ms=2.0, meta={}).save(job / "planned.json")
    log = job / "nvml.log"
    r = _run(job, sys.executable, "train.py", POLICY="planned.json", EMO_FAKE_GPU="2", EMO_FAKE_GPU_LOG=str(log))
    assert r.returncode == 0, r.stderr
    assert '"lock", 0, 1215' in log.read_text()

    import yaml

    from emo.device.nvml_fake import A100_GRAPHICS, MEM_CLOCKS

    a100 = yaml.safe_load((ROOT / "conf" / "gpu" / "a100.yaml").read_text())
    assert sorted(A100_GRAPHICS[MEM_CLOCKS[0]]) == a100["clocks_mhz"]
