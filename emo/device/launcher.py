"""The capture runner: run a `command` workload as the user gave it (a plain `python train.py`, a
launcher such as torchrun, deepspeed or `accelerate launch`, or a shell script) with EMO injected
through the environment, and collect what its ranks wrote (a Kineto trace and a window record each).

Injection: emo/_site goes first on PYTHONPATH, and nothing else, so every Python process the
command starts imports its sitecustomize, which arms emo.capture's in-program hooks from the EMO_*
variables (the job's own packages stay first for every name, and argv is never rewritten). Ranks read RANK / LOCAL_RANK / WORLD_SIZE, as
every launcher sets them. The parent side of emo.capture, used by the NVML backend, `emo trace` and
`emo apply`; it imports nothing of the in-program hooks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emo.errors import ConfigError
from emo.launchers import is_python, ranks_asked, starts_ranks  # what a command line says

ENV_DIR, ENV_WAIT, ENV_WARMUP, ENV_ACTIVE, ENV_POLICY = (
    "EMO_CAPTURE_DIR",
    "EMO_CAPTURE_WAIT",
    "EMO_CAPTURE_WARMUP",
    "EMO_CAPTURE_ACTIVE",
    "EMO_POLICY",
)
# What records the window (emo.device.CAPTURES): torch.profiler (full) or CUPTI activity records (light).
ENV_CAPTURE = "EMO_CAPTURE_MODE"
# Profiling on hardware (emo.device.nvml.profile_ranges): cudaProfilerStart/Stop around iteration N,
# a process-wide window (kernels launched by autograd's own thread are inside it too).
ENV_PROFILE_ITER = "EMO_PROFILE_ITERATION"
# How many iteration markers the stage needs; with ENV_STOP=1 the hooks end the program after them.
ENV_ITERATIONS, ENV_STOP = "EMO_ITERATIONS", "EMO_STOP"
# Which launch a window record belongs to (several nodes may write into one shared folder).
ENV_LAUNCH = "EMO_LAUNCH_ID"
# Several measured runs in one launch (emo.segments): the plan file's path.
ENV_SEGMENTS = "EMO_SEGMENTS"
# `emo apply`: each rank writes how many clock requests landed into this folder at exit.
ENV_REPORT = "EMO_APPLY_REPORT"
SITE_DIR = Path(__file__).resolve().parent.parent / "_site"  # holds the injected sitecustomize.py
_NOT_INJECTED = (
    "No rank at all? A Python started with -E, -I or -S, or a launcher that clears the "
    "environment, never imports EMO's sitecustomize (PYTHONPATH)."
)
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
    capture: str = "full"

    def __post_init__(self):
        if not self.command:
            raise ConfigError("emo trace: no command given (usage: emo trace -- python train.py ...)")
        for k in ("wait", "warmup"):
            if getattr(self, k) < 0:
                raise ConfigError(f"emo trace: {k} must be >= 0, got {getattr(self, k)}")
        if self.active < 1 or self.nproc < 1:
            raise ConfigError(f"emo trace: active and nproc must be >= 1, got {self.active}, {self.nproc}")

    @classmethod
    def from_workload(
        cls, wl: Any, *, iterations: int | None = None, warmup: int | None = None, capture: str = "full"
    ) -> CaptureSpec:
        get = (lambda k: wl[k]) if isinstance(wl, dict) else (lambda k: getattr(wl, k))
        return cls(
            command=[str(c) for c in get("command")],
            nproc=int(get("nproc")),
            wait=int(get("wait")),
            warmup=max(int(get("warmup")), warmup or 0),
            active=int(iterations) if iterations else int(get("active")),
            capture=capture,
        )


def script_argv(command: list[str]) -> list[str]:
    """A plain Python command without its interpreter: ['train.py', ...] or ['-m', 'pkg.mod', ...]
    (what torchrun is given when workload.nproc > 1 asks EMO to start the ranks)."""
    rest = command[1:] if not command[0].endswith(".py") else command
    if not rest:
        raise ConfigError("emo trace: no script after the interpreter")
    if rest[0] == "-m" and len(rest) < 2:
        raise ConfigError("emo trace: -m needs a module name")
    if rest[0].startswith("-") and rest[0] != "-m":
        raise ConfigError(
            f"emo trace: interpreter option {rest[0]!r} with nproc > 1: give the launcher "
            "yourself (`torchrun --nproc-per-node N ...`) and leave nproc at 1"
        )
    return rest


def build_command(spec: CaptureSpec) -> list[str]:
    """The user's command as given (a bare script.py runs under this interpreter); only a plain
    Python command with nproc > 1 is started under torchrun --standalone."""
    cmd = list(spec.command)
    if spec.nproc == 1:
        return [sys.executable, *cmd] if cmd[0].endswith(".py") else cmd
    if starts_ranks(cmd) or not is_python(cmd):
        raise ConfigError(
            f"workload.nproc={spec.nproc}: {cmd[0]!r} starts its own processes; set the rank "
            "count in its own options (e.g. --nproc-per-node) and leave nproc at 1"
        )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={spec.nproc}",
        *script_argv(cmd),
    ]


def inject_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with emo/_site first on PYTHONPATH (every Python process of the command
    imports its sitecustomize, which makes this emo importable by the ranks) and nothing else added:
    the folder that holds emo (all of site-packages for a regular install) would replace the job's
    own packages. The user's entries stay in their order; another spelling of emo/_site (a link) is
    dropped."""
    env = dict(os.environ if base is None else base)
    site = os.path.realpath(SITE_DIR)
    mine = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.realpath(p) != site]
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *mine])
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA device i == NVML index i
    return env


def markers_needed(spec: CaptureSpec) -> int:
    """Iteration markers the window needs: the hooks arm at the first one, then wait + warmup + active."""
    return 1 + spec.wait + spec.warmup + spec.active


def build_env(
    spec: CaptureSpec,
    out_dir: Path,
    policy: Path | None = None,
    base: dict[str, str] | None = None,
    *,
    stop: bool = True,
) -> dict[str, str]:
    env = inject_env(base)
    env.update(
        {
            ENV_DIR: str(Path(out_dir).resolve()),
            ENV_WAIT: str(spec.wait),
            ENV_WARMUP: str(spec.warmup),
            ENV_ACTIVE: str(spec.active),
            ENV_CAPTURE: spec.capture,
            ENV_ITERATIONS: str(markers_needed(spec)),
            ENV_STOP: "1" if stop else "0",
            ENV_LAUNCH: uuid.uuid4().hex,
        }
    )
    if policy is not None:
        env[ENV_POLICY] = str(Path(policy).resolve())
    else:
        env.pop(ENV_POLICY, None)
    return env


def profile_env(iteration: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a profiling run: the process-wide cudaProfilerStart/Stop window around
    iteration `iteration` (counted after the marker that arms it, as the trace window counts), then
    EMO ends the program; no trace window, no policy."""
    env = inject_env(base)
    for k in (ENV_DIR, ENV_POLICY, ENV_REPORT):
        env.pop(k, None)
    env.update({ENV_PROFILE_ITER: str(iteration), ENV_ITERATIONS: str(iteration + 2), ENV_STOP: "1"})
    return env


@dataclass
class CaptureResult:
    returncode: int
    trace_files: list[Path]
    window_files: list[Path]
    wall_s: float


def run_capture(
    spec: CaptureSpec, out_dir: Path, *, policy: Path | None = None, timeout_s: float | None = None, stop: bool = True
) -> CaptureResult:
    """Run the program with the profiler window injected; one trace and one window record per rank
    this launch started (on this node: another node's ranks may share the folder)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = build_env(spec, out_dir, policy, stop=stop)
    t0 = time.perf_counter()
    p = subprocess.run(build_command(spec), env=env, timeout=timeout_s)
    wall = time.perf_counter() - t0
    records = launch_records(out_dir, env[ENV_LAUNCH])
    if p.returncode != 0:
        raise ValueError(f"{' '.join(spec.command)}: exited with status {p.returncode}")
    need = markers_needed(spec)
    expected = max((int(r.get("local_world_size") or 1) for r in records.values()), default=spec.nproc)
    expected = max(expected, spec.nproc, ranks_asked(spec.command) or 0)  # no rank wrote: the launcher's count
    if len(records) < expected:
        raise ValueError(
            f"{out_dir}: {len(records)} of {expected} rank traces written; the program must "
            f"run at least {need} iterations (the first marker arms the window, then "
            f"wait+warmup+active; optimizer steps or emo.step() calls). "
            f"It is told so in ${ENV_ITERATIONS}. {_NOT_INJECTED}"
        )
    ranks = sorted(records)
    return CaptureResult(
        p.returncode, [out_dir / trace_name(r) for r in ranks], [out_dir / window_name(r) for r in ranks], wall
    )


def launch_records(out_dir: Path, launch: str) -> dict[int, dict]:
    """The window records written by one launch, by rank."""
    out = {}
    for f in sorted(Path(out_dir).glob(f"{SIDECAR}/rank*.window.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("launch") == launch:
            out[int(rec["rank"])] = rec
    return out


def run_segments(spec: CaptureSpec, out_dir: Path, segments: list[dict], *, timeout_s: float | None = None) -> list:
    """One launch that measures every segment ({"warmup", "iterations", "policy": dict or None,
    "label"}) in turn, each under its own policy, then ends the program: a RunResult per segment
    (time: the slowest rank; energy: summed over ranks)."""
    from emo.device import RunResult

    plan = Path(out_dir) / SIDECAR / "segments.json"
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"segments": segments}))
    need = 1 + sum(int(s["warmup"]) + int(s["iterations"]) for s in segments)
    env = inject_env()
    for k in (ENV_DIR, ENV_POLICY, ENV_REPORT, ENV_PROFILE_ITER):
        env.pop(k, None)
    env.update(
        {ENV_SEGMENTS: str(plan.resolve()), ENV_ITERATIONS: str(need), ENV_STOP: "1", ENV_LAUNCH: uuid.uuid4().hex}
    )
    p = subprocess.run(build_command(spec), env=env, timeout=timeout_s)
    if p.returncode != 0:
        raise ValueError(f"{' '.join(spec.command)}: exited with status {p.returncode}")
    recs = []
    for f in sorted(plan.parent.glob("rank*.segments.json")):
        rec = json.loads(f.read_text())
        if rec.get("launch") == env[ENV_LAUNCH]:
            recs.append(rec)
    expected = max([spec.nproc, ranks_asked(spec.command) or 0] + [int(r.get("local_world_size") or 1) for r in recs])
    if len(recs) < expected:
        raise ValueError(
            f"{' '.join(spec.command)}: {len(recs)} of {expected} ranks measured their runs; the "
            f"program must run at least {need} iterations (it is told so in ${ENV_ITERATIONS}). "
            f"{_NOT_INJECTED}"
        )
    out = []
    for i, _seg in enumerate(segments):
        per = {int(r["rank"]): r["segments"][i] for r in recs}
        energy = {k: float(v["energy_j"]) for k, v in per.items() if v.get("energy_j") is not None}
        first = per[min(per)]
        out.append(
            RunResult(
                iterations=int(first["iterations"]),
                time_s=max(float(v["time_s"]) for v in per.values()),
                energy_j=sum(energy.values()) if len(energy) == len(per) else float("nan"),
                iteration_times_s=list(first["iteration_times_s"]),
                energy_per_device_j=energy,
            )
        )
    return out


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
