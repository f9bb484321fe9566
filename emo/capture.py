"""`emo trace -- python train.py ...`: record a window of a real program's iterations with torch.profiler.

The user's command is re-launched as `python -m emo.capture train.py ...` (under torchrun when
nproc > 1). Before the script runs, a profiler window is armed: Kineto with CPU and CUDA activities and
`cuda_sync` events, schedule(wait, warmup, active). Its clock is the iteration marker: every first
optimizer's `step()` (a global post-hook), or `emo.capture.step()` if the program calls it (then the
hook stands down). Each rank writes `rank<r>.pt.trace.json.gz` and `emo-capture/rank<r>.window.json` (wall time
and NVML energy of the active iterations, read after a device synchronise at the window's edges).
With `EMO_POLICY` set, the runtime applier (emo.runtime) follows the same marker.

A program that prefers to say where iterations are can use `profile_steps()` directly.
torch is imported only inside the launched process.
"""
from __future__ import annotations

import argparse
import atexit
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
# Profiling on hardware (emo.device.nvml.profile_ranges): open an NVTX range around iteration N only.
ENV_NVTX_ITER, NVTX_RANGE = "EMO_NVTX_ITERATION", "emo_profile"
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


# --------------------------------------------------------------------------- inside the program
def _rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


class _Energy:
    """The NVML energy counter of this rank's GPU, or nothing on a machine without one."""

    def __init__(self, local_rank: int):
        self.handle = None
        self.index = None
        try:
            from emo.device.nvml import import_pynvml, visible_nvml_indices

            nvml = import_pynvml()
            nvml.nvmlInit()
            self.index = visible_nvml_indices(nvml)[local_rank]
            self.handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
            self.nvml = nvml
        except Exception:
            self.handle = None

    def read_j(self) -> float | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0


class ProfilerWindow:
    """torch.profiler over schedule(wait, warmup, active), stepped by iteration markers, with the
    wall time and energy of the active iterations. Writes into out_dir when the window closes."""

    def __init__(self, out_dir: str | Path, *, wait: int, warmup: int, active: int, policy: str | None = None):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.torch = torch
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.wait, self.warmup, self.active = wait, warmup, active
        self.rank, self.local_rank = _rank()
        self.cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._export,
            experimental_config=torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True),
        )
        self.energy = _Energy(self.local_rank)
        self.applier = None
        if policy:
            from emo.policy import FrequencyPolicy
            from emo.runtime import nvml_applier

            self.applier = nvml_applier(FrequencyPolicy.load(policy))
        self.steps = 0
        self.done = False
        self._marks: list[float] = []
        self._e0 = self._t0 = None
        self.trace_file = self.out_dir / trace_name(self.rank)
        self.window_file = self.out_dir / window_name(self.rank)
        self.window_file.parent.mkdir(parents=True, exist_ok=True)
        self.prof.start()
        if self.applier is not None:
            self.applier.step()

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def step(self) -> None:
        """An iteration ended (and the next begins)."""
        if self.done:
            if self.applier is not None:
                self.applier.step()
            return
        self.steps += 1
        start = self.wait + self.warmup
        if self.steps == start:  # the active window starts with the next iteration
            self._sync()
            self._e0, self._t0 = self.energy.read_j(), time.perf_counter()
            self._marks = [self._t0]
        elif start < self.steps <= start + self.active:
            if self.steps == start + self.active:
                self._sync()
            self._marks.append(time.perf_counter())
            if self.steps == start + self.active:
                self._e1 = self.energy.read_j()
        self.prof.step()  # at start + active this exports the trace (on_trace_ready)
        if self.applier is not None:
            self.applier.step()

    def _export(self, prof) -> None:
        prof.export_chrome_trace(str(self.trace_file))
        times = [b - a for a, b in zip(self._marks, self._marks[1:])]
        e = None if self._e0 is None or getattr(self, "_e1", None) is None else self._e1 - self._e0
        record = {"rank": self.rank, "local_rank": self.local_rank, "nvml_index": self.energy.index,
                  "iterations": len(times), "time_s": sum(times), "energy_j": e,
                  "iteration_times_s": times, "wait": self.wait, "warmup": self.warmup, "active": self.active}
        tmp = self.window_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, self.window_file)
        self.done = True

    def close(self) -> None:
        if not self.done:
            print(f"emo.capture: rank {self.rank} ended after {self.steps} iteration markers; the window "
                  f"needs {self.wait + self.warmup + self.active} (no trace written)", file=sys.stderr)
        try:
            self.prof.stop()
        except Exception:
            pass
        if self.applier is not None:
            self.applier.close()
            self.applier = None

    def __enter__(self) -> "ProfilerWindow":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NvtxWindow:
    """An NVTX range named NVTX_RANGE around one iteration (markers `iteration` to `iteration + 1`),
    for Nsight Compute's --nvtx-include; nothing else."""

    def __init__(self, iteration: int):
        import torch

        self.nvtx = torch.cuda.nvtx
        self.iteration, self.steps, self.open = iteration, 0, False
        self.done = iteration < 0
        self._check()

    def _check(self) -> None:
        if self.open:
            self.nvtx.range_pop()
            self.open, self.done = False, True
        elif not self.done and self.steps == self.iteration:
            self.nvtx.range_push(NVTX_RANGE)
            self.open = True

    def step(self) -> None:
        self.steps += 1
        self._check()

    def close(self) -> None:
        if self.open:
            self.nvtx.range_pop()
            self.open = False


def profile_steps(out_dir: str | Path, *, wait: int = 5, warmup: int = 2, active: int = 3,
                  policy: str | None = None) -> ProfilerWindow:
    """For programs that mark iterations themselves: `with profile_steps(dir) as w: ... w.step()`."""
    return ProfilerWindow(out_dir, wait=wait, warmup=warmup, active=active, policy=policy)


_WINDOW: "ProfilerWindow | NvtxWindow | None" = None
_MANUAL = False


def step() -> None:
    """Mark the end of an iteration, for programs without an optimizer (inference loops)."""
    global _MANUAL
    _MANUAL = True
    if _WINDOW is not None:
        _WINDOW.step()


def install_from_env() -> "ProfilerWindow | NvtxWindow | None":
    """Arm the window described by EMO_CAPTURE_* (or EMO_NVTX_ITERATION) in this process (the
    launcher does this)."""
    global _WINDOW
    if ENV_DIR in os.environ:
        _WINDOW = ProfilerWindow(os.environ[ENV_DIR], wait=int(os.environ.get(ENV_WAIT, 5)),
                                 warmup=int(os.environ.get(ENV_WARMUP, 2)),
                                 active=int(os.environ.get(ENV_ACTIVE, 3)), policy=os.environ.get(ENV_POLICY))
    elif ENV_NVTX_ITER in os.environ:
        _WINDOW = NvtxWindow(int(os.environ[ENV_NVTX_ITER]))
    else:
        return None
    from torch.optim.optimizer import register_optimizer_step_post_hook

    first: list[int] = []

    def on_optimizer_step(opt, args, kwargs) -> None:
        if _MANUAL:
            return
        if not first:
            first.append(id(opt))
        if id(opt) == first[0]:  # several optimizers per iteration: count the first one only
            _WINDOW.step()

    register_optimizer_step_post_hook(on_optimizer_step)
    atexit.register(_WINDOW.close)
    return _WINDOW


def launch(argv: list[str]) -> None:
    """`python -m emo.capture script.py args...` or `python -m emo.capture -m module args...`."""
    import runpy

    if not argv:
        raise SystemExit("usage: python -m emo.capture script.py [args...] | -m module [args...]")
    install_from_env()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


# --------------------------------------------------------------------------- the sub-command
def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="record a window of a real PyTorch program's iterations",
                              description="Record iterations of `python train.py ...` with torch.profiler "
                                          "(Kineto, CUDA activities, cuda_sync events), one trace per rank.")
    p.add_argument("-o", "--out", default="results/capture", help="output folder (default: %(default)s)")
    p.add_argument("--nproc", type=int, default=1, help="ranks; > 1 launches torchrun --standalone")
    p.add_argument("--wait", type=int, default=5, help="iterations skipped before warmup")
    p.add_argument("--warmup", type=int, default=2, help="profiled but discarded iterations")
    p.add_argument("--active", type=int, default=3, help="recorded iterations")
    p.add_argument("--policy", help="a frequency policy JSON to apply while the program runs")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py [args...]")
    p.set_defaults(func=_cmd_trace)


def _cmd_trace(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    spec = CaptureSpec(command=command, nproc=args.nproc, wait=args.wait, warmup=args.warmup, active=args.active)
    if args.policy and not Path(args.policy).is_file():
        raise FileNotFoundError(f"{args.policy}: no such policy file")
    res = run_capture(spec, Path(args.out), policy=Path(args.policy) if args.policy else None)
    rr = run_result(res, Path(args.out))
    for f in res.trace_files:
        print(f)
    e = "n/a (no NVML)" if rr.energy_j != rr.energy_j else f"{rr.energy_j:.3f} J"
    print(f"{rr.iterations} iterations: {rr.time_s:.4f} s, {e}")
    return 0


if __name__ == "__main__":
    # Run through the imported module, so that `emo.capture.step()` in the program sees the window.
    from emo import capture as _self

    _self.launch(sys.argv[1:])
