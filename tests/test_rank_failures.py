"""An EMO failure inside a training job is one line on each rank it stops (`emo: error: rank R: ...`),
its traceback in a log the line names, and the exit status of an uncaught exception, which the
launcher reports (issue 47: `emo.apply` without a GPU printed three chained tracebacks per rank, and
a rank the policy missed left the others to fail in gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emo.policy import FrequencyPolicy, Step

ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).resolve().parent / "fake_pynvml"

TRAIN = textwrap.dedent("""
    import os, sys, emo
    if "RANK" in os.environ:
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    if os.environ.get("CATCH"):
        try:
            emo.apply(sys.argv[1])
        except (ValueError, OSError) as e:
            print("caught:", type(e).__name__)
        sys.exit(0)
    with emo.apply(sys.argv[1]) as clocks:
        for i in range(5):
            clocks.step()
            if "RANK" in os.environ:
                m(torch.randn(4, 8)).sum().backward()
""")


@pytest.fixture
def job(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    FrequencyPolicy(gpu="a100", steps={0: [Step(0.0, 1410)]}, period_ms=2.0, meta={}).save(tmp_path / "p.json")
    (tmp_path / "logs").mkdir()
    return tmp_path


def _run(job, *command, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return subprocess.run(
        list(command),
        cwd=job,
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, "PYTHONPATH": str(ROOT), "EMO_LOG_DIR": str(job / "logs"), "OMP_NUM_THREADS": "1", **env},
    )


def _nvml(no_gpu: bool) -> dict:
    """The NVML fake in every process (tests/fake_pynvml), whatever this machine has; `no_gpu`: its
    nvmlInit fails as the real one does without a driver."""
    return {"PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT)])} | (
        {"EMO_FAKE_NVML_INIT_ERROR": "12"} if no_gpu else {}
    )


def test_a_failure_in_a_plain_process_is_one_line_with_its_traceback_in_a_log(job):
    r = _run(job, sys.executable, "train.py", "p.json", **_nvml(no_gpu=True))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("emo: error: cannot initialise NVML"), r.stderr
    log = Path(r.stderr.split("(traceback: ")[1].split(")")[0])
    assert log.parent == job / "logs" and "Traceback" in log.read_text() and "nvml_init" in log.read_text()


def test_a_program_that_catches_emos_error_gets_it_as_raised(job):
    r = _run(job, sys.executable, "train.py", "nope.json", CATCH="1")
    assert r.returncode == 0 and r.stdout == "caught: FileNotFoundError\n" and r.stderr == "", r.stderr


def test_any_other_error_keeps_its_traceback(job):
    (job / "bad.py").write_text("import emo\nemo.measure\nraise KeyError('mine')\n")
    r = _run(job, sys.executable, "bad.py")
    assert r.returncode == 1 and "Traceback" in r.stderr and "KeyError: 'mine'" in r.stderr


@pytest.mark.slow
def test_a_rank_the_policy_misses_stops_every_rank_in_one_line_each(job):
    pytest.importorskip("torch")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    r = _run(job, torchrun, "--nproc-per-node", "2", "train.py", "p.json", **_nvml(no_gpu=False))
    assert r.returncode != 0
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("emo: error: ")]
    assert sorted(ln.split(":")[2] for ln in ours) == [" rank 0", " rank 1"], r.stderr
    assert all("p.json: no schedule for rank 1 (it covers rank(s) 0; WORLD_SIZE=2)" in ln for ln in ours)
    # no rank's traceback on the terminal (torchrun's own report of the failed ranks remains)
    assert "[rank0]" not in r.stderr and "[rank1]" not in r.stderr and "gloo" not in r.stderr.lower(), r.stderr
    assert len(list((job / "logs").glob("emo-rank*.log"))) == 2
