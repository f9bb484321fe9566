"""Any launcher, any number of nodes: `emo trace` / `emo apply` take the user's command as it is and
instrument its ranks through the environment (the injected sitecustomize), with a CPU torch (gloo)
through the real torchrun. Ranks come from RANK / LOCAL_RANK; a rank the policy does not cover is an
error. Clock control runs against the NVML fake (tests/fake_pynvml) inside every rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emo.device import launcher
from emo.policy import FrequencyPolicy, Step

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
FAKE = Path(__file__).resolve().parent / "fake_pynvml"

# DDP over gloo when a launcher started ranks, a plain loop otherwise; far more iterations than any
# window needs: EMO ends it (EMO_ITERATIONS) unless it runs under `emo apply`.
TRAIN = textwrap.dedent("""
    import os, sys, torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if "RANK" in os.environ:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        m = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    for i in range(int(sys.argv[-1])):  # deepspeed's launcher adds --local_rank=N before it
        loss = ((m(x) - y) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    sys.stdout.write(f"trained {i + 1} iterations on rank {os.environ.get('RANK', '-')}\\n")  # one write: ranks share the pipe
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def job(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "run.sh").write_text(f'#!/bin/sh\ncd "$(dirname "$0")"\nexec "{sys.executable}" train.py "$@"\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def emo(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    base = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1"
    )
    return subprocess.run(
        [sys.executable, "-m", "emo.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=timeout,
    )


def _windows(out: Path) -> dict[int, dict]:
    return {
        json.loads(f.read_text())["rank"]: json.loads(f.read_text())
        for f in sorted((out / launcher.SIDECAR).glob("rank*.window.json"))
    }


PY = sys.executable
TORCHRUN, DEEPSPEED, ACCELERATE = (str(Path(PY).with_name(n)) for n in ("torchrun", "deepspeed", "accelerate"))
FORMS = {  # launcher form -> (command, ranks)
    "python -u": ([PY, "-u", "train.py", "200"], 1),
    "bare script": (["train.py", "200"], 1),
    "shell script": (["sh", "run.sh", "200"], 1),
    "torchrun 1": ([TORCHRUN, "--nproc_per_node", "1", "train.py", "200"], 1),
    "torchrun 2": ([TORCHRUN, "--nproc_per_node", "2", "train.py", "200"], 2),
    "python -m torch.distributed.run 2": (
        [PY, "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py", "200"],
        2,
    ),
    # the test-frameworks extra (.ci/run installs it): CPU ranks over gloo, as on a GPU box over NCCL
    "deepspeed 2": ([DEEPSPEED, "--num_gpus", "2", "train.py", "200"], 2),
    "accelerate launch 2": (
        [
            ACCELERATE,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "train.py",
            "200",
        ],
        2,
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_trace_takes_the_command_as_given(job, form):
    command, ranks = FORMS[form]
    if command[0] == DEEPSPEED and not Path(DEEPSPEED).exists():
        # DeepSpeed builds from source against the installed torch: no extra can bring it (.ci/run does)
        pytest.skip(
            f"{Path(command[0]).name} is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed"
        )
    r = emo("trace", "-o", "out", "--wait", "1", "--warmup", "1", "--active", "2", "--", *command)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in (job / "out").glob("*.json.gz")) == [launcher.trace_name(k) for k in range(ranks)]
    wins = _windows(job / "out")
    assert sorted(wins) == list(range(ranks)) and {w["world_size"] for w in wins.values()} == {ranks}
    assert all(w["iterations"] == 2 for w in wins.values())
    # EMO ended the program after the 1 + 1 + 1 + 2 markers it needs, on every rank
    assert r.stderr.count("5 iterations done (EMO_ITERATIONS=5): ending the program") == ranks
    assert "trained" not in r.stdout


def test_a_two_node_job_writes_one_trace_per_rank_where_the_user_points(job):
    """Two `torchrun --nnodes 2 --node-rank k` on this machine, each under its own `emo trace`,
    both writing into one folder (a shared file system): ranks 0-1 from node 0, 2-3 from node 1."""
    port = str(_port())
    procs = [
        subprocess.Popen(
            [
                PY,
                "-m",
                "emo.cli",
                "trace",
                "-o",
                "shared",
                "--wait",
                "1",
                "--warmup",
                "0",
                "--active",
                "2",
                "--",
                TORCHRUN,
                "--nnodes",
                "2",
                "--node-rank",
                str(k),
                "--nproc-per-node",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "train.py",
                "200",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
        )
        for k in (0, 1)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-1500:] + outs[1][1][-1500:]
    wins = _windows(job / "shared")
    assert sorted(wins) == [0, 1, 2, 3]
    assert {w["world_size"] for w in wins.values()} == {4} and {w["local_world_size"] for w in wins.values()} == {2}
    assert sorted(w["local_rank"] for w in wins.values()) == [0, 0, 1, 1]
    assert len({w["launch"] for w in wins.values()}) == 2  # each node's emo trace counted its own ranks
    assert sorted(p.name for p in (job / "shared").glob("*.json.gz")) == [launcher.trace_name(k) for k in range(4)]


def _policy(path: Path, ranks: list[int]) -> Path:
    FrequencyPolicy(gpu="a100", steps={r: [Step(0.0, 1410), Step(1.0, 900)] for r in ranks}, period_ms=5.0).save(path)
    return path


def _fake_env(tmp: Path, gpus: int = 2) -> dict:
    return {
        "PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT)]),
        "EMO_FAKE_NVML_GPUS": str(gpus),
        "EMO_FAKE_NVML_LOG": str(tmp / "nvml.log"),
    }


def _nvml_calls(tmp: Path) -> list[list]:
    return [json.loads(x) for x in (tmp / "nvml.log").read_text().splitlines()] if (tmp / "nvml.log").exists() else []


def test_emo_apply_runs_the_job_to_its_end_with_every_rank_on_its_own_gpu(job):
    pol = _policy(job / "p.json", [0, 1])
    r = emo(
        "apply", "--policy", str(pol), "--", TORCHRUN, "--nproc_per_node", "2", "train.py", "30", env=_fake_env(job)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("trained 30 iterations") == 2  # no profiler, no early end
    assert "rank 0 (policy device 0):" in r.stderr and "rank 1 (policy device 1):" in r.stderr
    landed = int(r.stderr.split("2 rank(s): ")[1].split()[0])
    locks = [c for c in _nvml_calls(job) if c[0] == "lock"]
    assert landed == len(locks) > 0
    assert {c[1] for c in locks} == {0, 1}  # LOCAL_RANK r drives GPU r
    assert [c[0] for c in _nvml_calls(job) if c[0] in ("lock", "reset")][-1] == "reset"


def test_a_rank_the_policy_does_not_cover_is_an_error(job):
    pol = _policy(job / "p.json", [0])  # a 1-GPU policy on a 2-rank job: rank 1 has no schedule
    r = emo(
        "apply", "--policy", str(pol), "--", TORCHRUN, "--nproc_per_node", "2", "train.py", "30", env=_fake_env(job)
    )
    assert r.returncode != 0
    assert "emo: error: " in r.stderr and "no schedule for rank 1 (it covers rank(s) 0; WORLD_SIZE=2)" in r.stderr


def test_without_a_gpu_apply_and_trace_with_a_policy_end_in_one_line(job):
    pol = _policy(job / "p.json", [0])
    for args in (["apply", "--policy", str(pol)], ["trace", "--policy", str(pol)]):
        r = emo(*args, "--", PY, "train.py", "3", env={**_fake_env(job), "EMO_FAKE_NVML_INIT_ERROR": "9"})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 3 and len(lines) == 1, r.stderr  # a DeviceError: the machine's failure
        assert lines[0].startswith("emo: error: cannot initialise NVML")


def test_trace_with_a_policy_records_and_applies_on_every_rank(job):
    """`emo trace --policy`: the profiler window and the applier follow the same markers in each rank."""
    pol = _policy(job / "p.json", [0, 1])
    r = emo(
        "trace",
        "-o",
        "out",
        "--wait",
        "1",
        "--warmup",
        "0",
        "--active",
        "2",
        "--policy",
        str(pol),
        "--",
        TORCHRUN,
        "--nproc_per_node",
        "2",
        "train.py",
        "200",
        env=_fake_env(job),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(_windows(job / "out")) == [0, 1]
    calls = _nvml_calls(job)
    assert {c[1] for c in calls if c[0] == "lock"} == {0, 1}  # each rank locked its own GPU
    for gpu in (0, 1):  # and reset it last, when EMO ended the program
        assert [c[0] for c in calls if c[0] in ("lock", "reset") and c[1] == gpu][-1] == "reset"
