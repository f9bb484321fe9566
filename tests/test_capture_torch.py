"""emo.capture: command lines and environment, and (when torch is installed) a real CPU-only
torch.profiler capture of a tiny training loop, single rank and under torchrun."""

from __future__ import annotations

import gzip
import json
import sys
import textwrap
from pathlib import Path

import pytest

from emo.cli import trace
from emo.device import launcher
from emo.workloads.command import CommandWorkload

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install torch)")


def test_a_command_runs_as_given_and_only_nproc_adds_torchrun():
    spec = launcher.CaptureSpec(["python3", "-u", "train.py", "--lr", "0.1"])
    assert launcher.build_command(spec) == ["python3", "-u", "train.py", "--lr", "0.1"]  # argv is never rewritten
    assert launcher.build_command(launcher.CaptureSpec(["train.py"])) == [sys.executable, "train.py"]
    for cmd in (
        ["torchrun", "--nproc_per_node", "2", "t.py"],
        ["deepspeed", "t.py"],
        ["bash", "run.sh"],
        ["accelerate", "launch", "t.py"],
    ):
        assert launcher.build_command(launcher.CaptureSpec(cmd)) == cmd
    cmd = launcher.build_command(launcher.CaptureSpec(["python", "train.py"], nproc=4))
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "train.py"]


def test_launchers_are_recognised():
    assert launcher.starts_ranks(["/usr/bin/torchrun", "t.py"]) and launcher.starts_ranks(["deepspeed", "t.py"])
    assert launcher.starts_ranks(["python", "-m", "torch.distributed.run", "t.py"])
    assert launcher.starts_ranks(["accelerate", "launch", "t.py"])
    assert not launcher.starts_ranks(["python", "-m", "pkg.train"]) and not launcher.starts_ranks(["python", "-m"])


@pytest.mark.parametrize(
    "command, nproc, message",
    [
        ([], 1, "no command given"),
        (["bash", "run.sh"], 2, "starts its own processes"),
        (["torchrun", "train.py"], 2, "leave nproc at 1"),
        (["python"], 2, "no script after the interpreter"),
        (["python", "-u", "train.py"], 2, "interpreter option '-u' with nproc > 1"),
    ],
)
def test_bad_commands_are_one_line_errors(command, nproc, message):
    with pytest.raises(ValueError, match=message):
        launcher.build_command(launcher.CaptureSpec(command, nproc=nproc))


def test_env_injects_the_hooks_and_carries_the_schedule_and_policy(tmp_path):
    spec = launcher.CaptureSpec(["python", "t.py"], wait=1, warmup=2, active=4)
    env = launcher.build_env(
        spec, tmp_path, policy=tmp_path / "p.json", base={"EMO_POLICY": "old", "X": "1", "PYTHONPATH": "/mine"}
    )
    assert env["PYTHONPATH"].split(":")[0] == str(launcher.SITE_DIR) and env["PYTHONPATH"].endswith(":/mine")
    assert (launcher.SITE_DIR / "sitecustomize.py").is_file()
    assert env["EMO_CAPTURE_DIR"] == str(tmp_path.resolve())
    assert (env["EMO_CAPTURE_WAIT"], env["EMO_CAPTURE_WARMUP"], env["EMO_CAPTURE_ACTIVE"]) == ("1", "2", "4")
    assert (env["EMO_ITERATIONS"], env["EMO_STOP"]) == ("8", "1")  # 1 arming marker + 1 + 2 + 4
    assert env["EMO_POLICY"] == str((tmp_path / "p.json").resolve()) and env["X"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "EMO_POLICY" not in launcher.build_env(spec, tmp_path, base={"EMO_POLICY": "old"})
    assert launcher.build_env(spec, tmp_path)["EMO_LAUNCH_ID"] != launcher.build_env(spec, tmp_path)["EMO_LAUNCH_ID"]


def test_spec_from_the_command_workload_config():
    wl = CommandWorkload(command=["python", "train.py"], nproc=2, wait=3, warmup=1, active=5)
    spec = launcher.CaptureSpec.from_workload(wl, iterations=4, warmup=2)
    assert (spec.nproc, spec.wait, spec.warmup, spec.active) == (2, 3, 2, 4)
    assert launcher.CaptureSpec.from_workload(wl).active == 5
    with pytest.raises(ValueError, match="active and nproc must be >= 1"):
        launcher.CaptureSpec(["python", "t.py"], active=0)


def test_trace_subcommand_parses_after_double_dash(monkeypatch, tmp_path):
    import argparse

    seen = {}
    monkeypatch.setattr(
        trace,
        "run_capture",
        lambda spec, out, policy=None, stop=True: (
            seen.update(spec=spec, out=out) or (_ for _ in ()).throw(ValueError("stop"))
        ),
    )
    ap = argparse.ArgumentParser()
    trace.register(ap.add_subparsers())
    args = ap.parse_args(
        ["trace", "-o", str(tmp_path), "--nproc", "2", "--active", "4", "--", "python", "train.py", "--epochs", "1"]
    )
    with pytest.raises(ValueError, match="stop"):
        args.func(args)
    assert seen["spec"].command == ["python", "train.py", "--epochs", "1"]
    assert (seen["spec"].nproc, seen["spec"].active, seen["out"]) == (2, 4, tmp_path)
    args = ap.parse_args(["trace", "--policy", str(tmp_path / "none.json"), "--", "python", "t.py"])
    with pytest.raises(FileNotFoundError, match="no such policy file"):
        args.func(args)


TRAIN = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    for i in range(int(sys.argv[1])):
        loss = ((m(x) - y) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
""")

INFER = textwrap.dedent("""
    import sys, torch, emo.capture
    m = torch.nn.Linear(32, 8)
    with torch.no_grad():
        for i in range(int(sys.argv[1])):
            m(torch.randn(4, 32)); emo.capture.step()
""")


def _ops(trace: Path) -> tuple[list[str], dict]:
    d = json.load(gzip.open(trace))
    steps = [e["name"] for e in d["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    return steps, d


@needs_torch
@pytest.mark.slow
def test_cpu_capture_of_a_training_loop(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    spec = launcher.CaptureSpec(["python", str(script), "8"], wait=2, warmup=1, active=3)
    res = launcher.run_capture(spec, tmp_path / "out")
    assert [p.name for p in res.trace_files] == ["rank000.pt.trace.json.gz"]
    steps, d = _ops(res.trace_files[0])
    assert steps == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]  # the active iterations only
    assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::addmm" for e in d["traceEvents"])
    rr = launcher.run_result(res, tmp_path / "out")
    assert rr.iterations == 3 and len(rr.iteration_times_s) == 3
    assert rr.time_s == pytest.approx(sum(rr.iteration_times_s)) and rr.time_s > 0
    assert rr.energy_j != rr.energy_j  # NaN: no NVML on this machine
    # the trace folder holds only traces: sidecars live in a subfolder readers skip
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_file()) == ["rank000.pt.trace.json.gz"]


@needs_torch
@pytest.mark.slow
def test_explicit_step_marker(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(INFER)
    res = launcher.run_capture(
        launcher.CaptureSpec(["python", str(script), "5"], wait=1, warmup=1, active=2), tmp_path / "a"
    )
    assert _ops(res.trace_files[0])[0] == ["ProfilerStep#2", "ProfilerStep#3"]


def test_a_program_too_short_for_the_window_or_failing_is_a_clear_error(monkeypatch, tmp_path):
    from types import SimpleNamespace

    rc = {"value": 0}
    monkeypatch.setattr(launcher.subprocess, "run", lambda cmd, env, timeout: SimpleNamespace(returncode=rc["value"]))
    spec = launcher.CaptureSpec(["python", "t.py", "3"], wait=5, warmup=2, active=2)
    with pytest.raises(ValueError, match="must run at least 10 iterations"):
        launcher.run_capture(spec, tmp_path / "b")
    rc["value"] = 3
    with pytest.raises(ValueError, match="python t.py 3: exited with status 3"):
        launcher.run_capture(spec, tmp_path / "b")


@needs_torch
@pytest.mark.slow
def test_two_ranks_under_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    res = launcher.run_capture(
        launcher.CaptureSpec(["python", str(script), "5"], nproc=2, wait=1, warmup=1, active=2), tmp_path / "out"
    )
    assert [p.name for p in res.trace_files] == ["rank000.pt.trace.json.gz", "rank001.pt.trace.json.gz"]
    ranks = sorted(json.loads(p.read_text())["rank"] for p in res.window_files)
    assert ranks == [0, 1]
