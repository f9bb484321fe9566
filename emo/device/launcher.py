"""The capture runner: launch a `command` workload as `python -m emo.capture ...` (under torchrun when
nproc > 1) and collect what its ranks wrote (a Kineto trace and a window record each).

The parent side of emo.capture, used by the NVML backend and by `emo trace`; it imports nothing of
the capture CLI or the in-program hooks (emo.capture), so the backend does not depend on a CLI module.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR, ENV_WAIT, ENV_WARMUP, ENV_ACTIVE, ENV_POLICY = (
    "EMO_CAPTURE_DIR", "EMO_CAPTURE_WAIT", "EMO_CAPTURE_WARMUP", "EMO_CAPTURE_ACTIVE", "EMO_POLICY")
# Profiling on hardware (emo.device.nvml.profile_ranges): a cudaProfilerStart/Stop window around
# iteration N only (process-wide, so the backward pass's autograd thread is inside it).
ENV_PROFILE_ITER = "EMO_PROFILE_ITERATION"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Per-rank window records and the policy live in a subfolder: trace readers take every *.json of the
# trace folder as a rank's trace. Rank numbers are zero-padded so that name order is rank order.
SIDECAR = "emo-capture"


def trace_name(rank: int) -> str:
    return f"rank{rank:03d}.pt.trace.json.gz"


def window_name(rank: int) -> str:
    return f"{SIDECAR}/rank{rank:03d}.window.json"


@dataclass
class CaptureSpec:
    command: list[str]
    nproc: int = 1
    wait: int = 5
    warmup: int = 2
    active: int = 3

    def __post_init__(self):
        if not self.command:
            raise ValueError("emo trace: no command given (usage: emo trace -- python train.py ...)")
        for k in ("wait", "warmup"):
            if getattr(self, k) < 0:
                raise ValueError(f"emo trace: {k} must be >= 0, got {getattr(self, k)}")
        if self.active < 1 or self.nproc < 1:
            raise ValueError(f"emo trace: active and nproc must be >= 1, got {self.active}, {self.nproc}")

    @classmethod
    def from_workload(cls, wl: Any, *, iterations: int | None = None, warmup: int | None = None) -> "CaptureSpec":
        get = (lambda k: wl[k]) if isinstance(wl, dict) else (lambda k: getattr(wl, k))
        return cls(command=[str(c) for c in get("command")], nproc=int(get("nproc")), wait=int(get("wait")),
                   warmup=max(int(get("warmup")), warmup or 0),
                   active=int(iterations) if iterations else int(get("active")))


def script_argv(command: list[str]) -> list[str]:
    """The user's command without its interpreter: ['train.py', ...] or ['-m', 'pkg.mod', ...]."""
    head = Path(command[0]).name
    if _PYTHON.match(head) or command[0] == sys.executable:
        rest = command[1:]
    elif command[0].endswith(".py"):
        rest = command
    elif head in ("torchrun", "torch.distributed.run"):
        raise ValueError("emo trace: give the plain `python train.py ...` command and --nproc N; "
                         "emo launches torchrun itself")
    else:
        raise ValueError(f"emo trace: {command[0]!r} is not a Python program (give `python script.py ...`)")
    if not rest:
        raise ValueError("emo trace: no script after the interpreter")
    if rest[0] == "-m" and len(rest) < 2:
        raise ValueError("emo trace: -m needs a module name")
    if rest[0].startswith("-") and rest[0] != "-m":
        raise ValueError(f"emo trace: interpreter option {rest[0]!r} is not supported; put it in PYTHONOPTIMIZE etc.")
    return rest


def build_command(spec: CaptureSpec) -> list[str]:
    """The command that runs the user's program under the capture launcher (and torchrun)."""
    rest = script_argv(spec.command)
    if spec.nproc == 1:
        return [sys.executable, "-m", "emo.capture", *rest]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}",
            "-m", "emo.capture", *rest]


def build_env(spec: CaptureSpec, out_dir: Path, policy: Path | None = None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA device i == NVML index i
    env.update({ENV_DIR: str(Path(out_dir).resolve()), ENV_WAIT: str(spec.wait),
                ENV_WARMUP: str(spec.warmup), ENV_ACTIVE: str(spec.active)})
    if policy is not None:
        env[ENV_POLICY] = str(Path(policy).resolve())
    else:
        env.pop(ENV_POLICY, None)
    return env


@dataclass
class CaptureResult:
    returncode: int
    trace_files: list[Path]
    window_files: list[Path]
    wall_s: float


def run_capture(spec: CaptureSpec, out_dir: Path, *, policy: Path | None = None,
                timeout_s: float | None = None) -> CaptureResult:
    """Run the program under the profiler window; one trace and one window record per rank."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*out_dir.glob("rank*.pt.trace.json.gz"), *out_dir.glob(f"{SIDECAR}/rank*.window.json")]:
        stale.unlink()
    t0 = time.perf_counter()
    p = subprocess.run(build_command(spec), env=build_env(spec, out_dir, policy), timeout=timeout_s)
    wall = time.perf_counter() - t0
    traces = sorted(out_dir.glob("rank*.pt.trace.json.gz"))
    windows = sorted(out_dir.glob(f"{SIDECAR}/rank*.window.json"))
    if p.returncode != 0:
        raise ValueError(f"{' '.join(spec.command)}: exited with status {p.returncode}")
    if len(traces) != spec.nproc:
        need = spec.wait + spec.warmup + spec.active
        raise ValueError(f"{out_dir}: {len(traces)} of {spec.nproc} rank traces written; the program must "
                         f"run at least wait+warmup+active = {need} iterations (optimizer steps or "
                         "emo.capture.step() calls)")
    return CaptureResult(p.returncode, traces, windows, wall)


def run_result(result: CaptureResult, out_dir: Path):
    """The device protocol's RunResult from the ranks' window records."""
    from emo.device import RunResult

    wins = [json.loads(p.read_text()) for p in result.window_files]
    if not wins:
        raise ValueError(f"{out_dir / SIDECAR}: no rank*.window.json written")
    energy = {int(w["rank"]): float(w["energy_j"]) for w in wins if w.get("energy_j") is not None}
    return RunResult(
        iterations=int(wins[0]["iterations"]),
        time_s=max(float(w["time_s"]) for w in wins),
        energy_j=sum(energy.values()) if energy else float("nan"),
        iteration_times_s=list(wins[0]["iteration_times_s"]),
        energy_per_device_j=energy,
        trace_files=list(result.trace_files),
    )
