"""In-program hooks: record a window of a real program's iterations with torch.profiler, apply a
policy, for `emo trace` (emo.cli.trace), `emo apply` (emo.cli.apply) and the NVML backend.

The command runs as the user gives it (`python train.py`, `torchrun ...`, `deepspeed ...`,
`accelerate launch ...`, a shell script): emo.device.launcher injects emo/_site/sitecustomize.py
into every Python process it starts, which calls `install_from_env()` here. Nothing is armed until
the first iteration marker: every first optimizer's `step()` (a global post-hook, registered when
the program imports torch.optim), or `emo.capture.step()` / `clocks.step()` if the program calls them
(then the optimizer hook stands down). A launcher's own process (torchrun's agent) never steps an
optimizer, so only ranks arm. At the first marker the windows the EMO_* variables ask for open:
  EMO_CAPTURE_DIR   Kineto with CPU and CUDA activities and `cuda_sync` events, schedule(wait, warmup,
                    active); each rank writes `rank<r>.pt.trace.json.gz` and
                    `emo-capture/rank<r>.window.json` (wall time and NVML energy of the active iterations);
  EMO_PROFILE_ITERATION  cudaProfilerStart/Stop around that iteration, for Nsight Compute's
                    --profile-from-start off: a process-wide window, so kernels launched by autograd's
                    backward thread are inside it too (an NVTX push/pop range is per thread);
  EMO_POLICY        the runtime applier (emo.loop.apply) following the same markers;
  EMO_SEGMENTS      several measured runs, each under its own clocks, in this one launch (emo.segments).
With EMO_STOP=1 the program is ended (exit status 0) once EMO_ITERATIONS markers have passed.
The parent side (command line, environment, collecting what the ranks wrote) is emo.device.launcher.

A program that prefers to say where iterations are can use `profile_steps()` directly.
torch is imported only inside the launched process.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# the names of the runner's variables and files (the parent side, emo.device.launcher: command
# line, environment, collecting the ranks' files)
from emo.device.launcher import (
    ENV_ACTIVE,
    ENV_CAPTURE,
    ENV_DIR,
    ENV_ITERATIONS,
    ENV_LAUNCH,
    ENV_POLICY,
    ENV_PROFILE_ITER,
    ENV_REPORT,
    ENV_SEGMENTS,
    ENV_STOP,
    ENV_WAIT,
    ENV_WARMUP,
    trace_name,
    window_name,
)
from emo.errors import exit_code
from emo.runtime import ClockRequestFailed

ENV_SHAPES = "EMO_RECORD_SHAPES"  # 1: record each op's input shapes and types (emo.device.sim.command)


# --------------------------------------------------------------------------- inside the program
def _rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


class ProfilerWindow:
    """torch.profiler over schedule(wait, warmup, active), stepped by iteration markers, with the
    wall time and energy of the active iterations. Writes into out_dir when the window closes."""

    def __init__(self, out_dir: str | Path, *, wait: int, warmup: int, active: int, capture: str = "full"):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        if capture not in ("full", "light"):
            raise ValueError(f"{ENV_CAPTURE}={capture!r}: want full or light")
        self.torch = torch
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.wait, self.warmup, self.active = wait, warmup, active
        self.rank, self.local_rank = _rank()
        self.cuda = torch.cuda.is_available()
        self.trace_file = self.out_dir / trace_name(self.rank)
        self.prof: Any = None
        self.tracer: Any = None
        if capture == "light":  # CUPTI activity records of the active iterations only: no CPU ops
            from emo.trace.cupti import CuptiTracer

            self.tracer = CuptiTracer(self.trace_file)
        else:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.prof = profile(
                activities=activities,
                schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                # the virtual GPU's stand-in for a CPU program sizes its kernels from the ops' shapes
                record_shapes=os.environ.get(ENV_SHAPES) == "1",
                on_trace_ready=self._export,
                experimental_config=torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True),
            )
        from emo.device.control import RankEnergy

        self.energy = RankEnergy(self.local_rank)
        self.steps = 0
        self.done = False
        self._marks: list[float] = []
        self._e0: float | None = None
        self._t0: float | None = None
        self.window_file = self.out_dir / window_name(self.rank)
        self.window_file.parent.mkdir(parents=True, exist_ok=True)
        if self.prof is not None:
            self.prof.start()

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def step(self) -> None:
        """An iteration ended (and the next begins)."""
        if self.done:
            return
        self.steps += 1
        start = self.wait + self.warmup
        if self.steps == start:  # the active window starts with the next iteration
            self._sync()
            self._e0, self._t0 = self.energy.read_j(), time.perf_counter()
            self._marks = [self._t0]
            if self.tracer is not None:
                self.tracer.__enter__()
        elif start < self.steps <= start + self.active:
            if self.steps == start + self.active:
                self._sync()
            self._marks.append(time.perf_counter())
            if self.tracer is not None:
                self.tracer.step()
            if self.steps == start + self.active:
                self._e1 = self.energy.read_j()
                if self.tracer is not None:
                    self.tracer.__exit__(None, None, None)  # writes the trace
                    self._window()
        if self.prof is not None:
            self.prof.step()  # at start + active this exports the trace (on_trace_ready)

    def _export(self, prof) -> None:
        prof.export_chrome_trace(str(self.trace_file))
        self._window()

    def _window(self) -> None:
        """The window's record beside the trace: its iterations' times and energy."""
        times = [b - a for a, b in zip(self._marks, self._marks[1:])]
        e1 = getattr(self, "_e1", None)
        e = None if self._e0 is None or e1 is None else e1 - self._e0
        record = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "nvml_index": self.energy.index,
            "world_size": int(os.environ.get("WORLD_SIZE", 1)),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            "launch": os.environ.get(ENV_LAUNCH),
            "trace": self.trace_file.name,
            "iterations": len(times),
            "time_s": sum(times),
            "energy_j": e,
            "iteration_times_s": times,
            "wait": self.wait,
            "warmup": self.warmup,
            "active": self.active,
        }
        tmp = self.window_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, self.window_file)
        self.done = True

    def close(self) -> None:
        if not self.done:
            print(
                f"emo.capture: rank {self.rank} ended after {self.steps} iteration markers; the window "
                f"needs {self.wait + self.warmup + self.active} (no trace written)",
                file=sys.stderr,
            )
        try:
            if self.prof is not None:
                self.prof.stop()
            elif self.tracer is not None and not self.done and self._t0 is not None:
                self.tracer.__exit__(RuntimeError, None, None)  # stop recording, write nothing
        except Exception:
            pass

    def __enter__(self) -> ProfilerWindow:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ProfileWindow:
    """cudaProfilerStart/Stop around one iteration (markers `iteration` to `iteration + 1`), for
    Nsight Compute's `--profile-from-start off`. The window is the process's (the CUDA context's),
    not a thread's: kernels that autograd's backward thread launches fall inside it, which an NVTX
    push/pop range (per thread) would miss. The GPU is synchronised at both edges so the window holds
    exactly this iteration's work. `profiler` (start/stop) and `sync` default to torch.cuda's."""

    def __init__(self, iteration: int, profiler=None, sync=None):
        if profiler is None or sync is None:
            import torch

            profiler = profiler or torch.cuda.profiler
            sync = sync or torch.cuda.synchronize
        self.profiler, self.sync = profiler, sync
        self.iteration, self.steps, self.open = iteration, 0, False
        self.done = iteration < 0
        self._check()

    def _check(self) -> None:
        if self.open:
            self.sync()
            self.profiler.stop()
            self.open, self.done = False, True
        elif not self.done and self.steps == self.iteration:
            self.sync()
            self.profiler.start()
            self.open = True

    def step(self) -> None:
        self.steps += 1
        self._check()

    def close(self) -> None:
        if self.open:
            self.profiler.stop()
            self.open = False


def profile_steps(out_dir: str | Path, *, wait: int = 5, warmup: int = 2, active: int = 3) -> ProfilerWindow:
    """For programs that mark iterations themselves: `with profile_steps(dir) as w: ... w.step()`."""
    return ProfilerWindow(out_dir, wait=wait, warmup=warmup, active=active)


# --------------------------------------------------------------------------- the iteration marker
_HOOKS: list = []  # what follows the markers in this process: windows, the applier
_ARMED = False
_MANUAL = False
_MARKERS = 0


def step() -> None:
    """Mark the end of an iteration (and the start of the next), for programs that say where their
    iterations are (inference loops, several optimizers): the optimizer hook then stands down."""
    global _MANUAL
    _MANUAL = True
    _marker()


def _marker() -> None:
    global _MARKERS
    fresh = not _ARMED
    if fresh:
        _arm()
    _MARKERS += 1
    try:
        for h in list(_HOOKS):
            if not fresh or getattr(h, "starts_at_marker", False):  # windows count from the marker that opened them
                h.step()
    except (ValueError, OSError, ClockRequestFailed) as e:  # EMO's failure, not the program's: one line
        print(f"emo: error: {e}", file=sys.stderr)
        raise SystemExit(exit_code(e)) from None  # by its type: 3 the GPU, 2 what EMO was given
    _maybe_stop()


def _arm() -> None:
    """Open what EMO_* asks for, at the first marker (this process is a rank: it steps)."""
    global _ARMED
    _ARMED = True
    env = os.environ
    if ENV_DIR in env:
        _HOOKS.append(
            ProfilerWindow(
                env[ENV_DIR],
                wait=int(env.get(ENV_WAIT, 5)),
                warmup=int(env.get(ENV_WARMUP, 2)),
                active=int(env.get(ENV_ACTIVE, 3)),
                capture=env.get(ENV_CAPTURE, "full"),
            )
        )
    if ENV_PROFILE_ITER in env:
        _HOOKS.append(ProfileWindow(int(env[ENV_PROFILE_ITER])))
    if ENV_SEGMENTS in env:  # several measured runs, each under its own clocks (emo.segments)
        from emo.segments import SegmentWindow

        try:
            _HOOKS.append(SegmentWindow(env[ENV_SEGMENTS]))
        except (ValueError, OSError) as e:
            print(f"emo: error: {e}", file=sys.stderr)
            raise SystemExit(exit_code(e)) from None
    if env.get(ENV_POLICY):
        from emo import loop

        if loop.active() is None:  # the program's own emo.apply(...) wins
            try:
                # strict: a failed clock request stops the run rather than let it measure default clocks
                clocks = loop.apply(env[ENV_POLICY], report_dir=env.get(ENV_REPORT), strict=True)
            except (ValueError, OSError) as e:  # a rank the policy does not cover (2), no GPU (3): one line
                print(f"emo: error: {e}", file=sys.stderr)
                raise SystemExit(exit_code(e)) from None
            clocks.injected = True  # it follows these markers; its step() must not call back here
            _HOOKS.append(clocks)
    for h in _HOOKS:
        atexit.register(h.close)


def _maybe_stop() -> None:
    """EMO_STOP=1: end the program once EMO_ITERATIONS markers passed and every window is done."""
    env = os.environ
    if env.get(ENV_STOP) != "1" or ENV_ITERATIONS not in env or _MARKERS < int(env[ENV_ITERATIONS]):
        return
    if any(not getattr(h, "done", True) for h in _HOOKS):
        return
    for h in _HOOKS:
        h.close()
    print(
        f"emo: {_MARKERS} iterations done ({ENV_ITERATIONS}={env[ENV_ITERATIONS]}): ending the program", file=sys.stderr
    )
    raise SystemExit(0)


def _on_optimizer_step_factory():
    first: list[int] = []

    def on_optimizer_step(opt, args, kwargs) -> None:
        if _MANUAL:
            return
        if not first:
            first.append(id(opt))
        if id(opt) == first[0]:  # several optimizers per iteration: count the first one only
            _marker()

    return on_optimizer_step


def _register_optimizer_hook(module) -> None:
    module.register_optimizer_step_post_hook(_on_optimizer_step_factory())


def install_from_env() -> None:
    """Follow iteration markers in this process (the injected sitecustomize calls this): the
    optimizer hook is registered once torch.optim is imported, without importing torch here."""
    from emo.postimport import when_imported

    when_imported("torch.optim.optimizer", _register_optimizer_hook)
