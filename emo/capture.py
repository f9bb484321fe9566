"""`emo trace -- python train.py ...`: record a window of a real program's iterations with torch.profiler.

The user's command is re-launched as `python -m emo.capture train.py ...` (under torchrun when
nproc > 1). Before the script runs, a profiler window is armed: Kineto with CPU and CUDA activities and
`cuda_sync` events, schedule(wait, warmup, active). Its clock is the iteration marker: every first
optimizer's `step()` (a global post-hook), or `emo.capture.step()` if the program calls it (then the
hook stands down). Each rank writes `rank<r>.pt.trace.json.gz` and `emo-capture/rank<r>.window.json` (wall time
and NVML energy of the active iterations, read after a device synchronise at the window's edges).
With `EMO_POLICY` set, the runtime applier (emo.device.nvml.nvml_applier, strict) follows the same marker.
The parent side (command line, environment, collecting what the ranks wrote) is emo.device.launcher.

A program that prefers to say where iterations are can use `profile_steps()` directly.
torch is imported only inside the launched process.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time
from pathlib import Path

# the runner (the parent side: command line, environment, collecting the ranks' files)
from emo.device.launcher import (ENV_ACTIVE, ENV_DIR, ENV_PROFILE_ITER, ENV_POLICY, ENV_WAIT, ENV_WARMUP,
                                 CaptureSpec, run_capture, run_result, trace_name, window_name)


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
            from emo.device.nvml import nvml_applier

            # strict: a policy run whose clock requests fail stops with an error rather than
            # measuring default clocks and reporting them as the policy's savings
            self.applier = nvml_applier(FrequencyPolicy.load(policy), strict=True)
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
        if self.applier is not None:  # what the policy's clock requests did up to the window's end
            record["clock_requests"] = self.applier.summary()
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


class ProfileWindow:
    """cudaProfilerStart/Stop around one iteration (markers `iteration` to `iteration + 1`), for Nsight
    Compute's --profile-from-start off; nothing else. The window is process-wide, unlike an NVTX
    push/pop range, which belongs to the thread that opened it: PyTorch launches the backward pass's
    kernels from autograd's own thread, and they must be inside the window too."""

    def __init__(self, iteration: int):
        import torch

        self.profiler = torch.cuda.profiler
        self.iteration, self.steps, self.open = iteration, 0, False
        self.done = iteration < 0
        self._check()

    def _check(self) -> None:
        if self.open:
            self.profiler.stop()
            self.open, self.done = False, True
        elif not self.done and self.steps == self.iteration:
            self.profiler.start()
            self.open = True

    def step(self) -> None:
        self.steps += 1
        self._check()

    def close(self) -> None:
        if self.open:
            self.profiler.stop()
            self.open = False


def profile_steps(out_dir: str | Path, *, wait: int = 5, warmup: int = 2, active: int = 3,
                  policy: str | None = None) -> ProfilerWindow:
    """For programs that mark iterations themselves: `with profile_steps(dir) as w: ... w.step()`."""
    return ProfilerWindow(out_dir, wait=wait, warmup=warmup, active=active, policy=policy)


_WINDOW: "ProfilerWindow | ProfileWindow | None" = None
_MANUAL = False


def step() -> None:
    """Mark the end of an iteration, for programs without an optimizer (inference loops)."""
    global _MANUAL
    _MANUAL = True
    if _WINDOW is not None:
        _WINDOW.step()


def install_from_env() -> "ProfilerWindow | ProfileWindow | None":
    """Arm the window described by EMO_CAPTURE_* (or EMO_PROFILE_ITERATION) in this process (the
    launcher does this)."""
    global _WINDOW
    if ENV_DIR in os.environ:
        _WINDOW = ProfilerWindow(os.environ[ENV_DIR], wait=int(os.environ.get(ENV_WAIT, 5)),
                                 warmup=int(os.environ.get(ENV_WARMUP, 2)),
                                 active=int(os.environ.get(ENV_ACTIVE, 3)), policy=os.environ.get(ENV_POLICY))
    elif ENV_PROFILE_ITER in os.environ:
        _WINDOW = ProfileWindow(int(os.environ[ENV_PROFILE_ITER]))
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
