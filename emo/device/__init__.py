"""The device protocol: everything the models learn about a GPU goes through it (or through traces).

Two parts, as in Zeus:
- control (emo.device.control.GpuControl): clocks, power limit and the energy counter of GPUs by
  index, vendor-neutral; NVML behind it on NVIDIA GPUs (emo.device.nvml_control), the virtual GPU's
  own (SimDevice.control). Code that only changes or reads a GPU's state uses it and nothing else.
- execution (`Execution` below): running a workload or a microbenchmark and profiling it, which
  the stages need; `Device` is an execution backend together with the per-run control the stages
  use (a frequency policy or a power limit for the next run, the energy counter, restore on close()).
Backends by name: emo.device.backends (devices), emo.device.control.CONTROLS (control).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from emo.device.features import EMO, FeatureSet
from emo.policy import FrequencyPolicy

# Table II counters, in this order, everywhere a counter vector is stored: a named feature set
# (emo.device.features says what each one measures and how it maps from ncu and DCGM names).
COUNTERS = FeatureSet(EMO)
# What records a traced run (`trace.capture`): "full" is torch.profiler's CPU and CUDA activities
# (every CPU op, annotation and runtime call); "light" only the runtime calls, GPU activity and the
# iteration markers (CUPTI activity records). Each record costs the host time; untraced runs pay none.
CAPTURES = ("full", "light")


@dataclass
class Measurement:
    """Time and energy of one measured window."""

    time_s: float
    energy_j: float
    sm_mhz: int | None = None  # the locked clock, when one was


class ProfilingUnavailable(ValueError):
    """The device cannot read counters here (no profiler installed, or no permission): the profile
    stage then goes on without counters and says what that costs."""


@dataclass
class ProfileResult:
    counters: dict[str, float]  # COUNTERS -> value for one execution of the range
    passes: int  # replay passes the range profiler needed
    cost_s: float  # wall time the profiling took (replays included)


@dataclass(frozen=True)
class KernelRange:
    """A range of kernels named as a profiler sees them: the rank, and the ordinals of its kernel
    launches within one iteration (host launch order, i.e. correlation order; every kernel counts,
    NCCL ones included, copies and memsets do not)."""

    rank: int
    ordinals: tuple[int, ...]
    nccl: tuple[int, ...] = ()  # ordinals of the rank's NCCL kernels in that iteration: never replayed


@dataclass
class RunResult:
    """A workload run for N iterations under a policy."""

    iterations: int
    time_s: float  # wall time of the measured iterations (all devices)
    energy_j: float  # energy-counter delta over those iterations, summed over devices
    iteration_times_s: list[float] = field(default_factory=list)
    energy_per_device_j: dict[int, float] = field(default_factory=dict)
    trace_files: list[Path] = field(default_factory=list)  # Kineto JSON, one per rank, when traced


@runtime_checkable
class Execution(Protocol):
    """Running workloads and profiling them on a GPU (or the virtual one)."""

    def time_s(self) -> float:
        """The device's notion of now, in seconds."""

    def run_microbenchmark(self, name: str, sm_mhz: int, min_seconds: float = 1.0) -> Measurement:
        """Run a named microbenchmark (microbench/registry) at a locked clock, long enough for the
        energy counter to resolve it; time and energy are per single launch of the benchmark."""

    def profile_range(self, kernels: list[Any]) -> ProfileResult:
        """Counters of one execution of a range of kernels (CUPTI range profiling on hardware)."""

    def profile_ranges(self, workload: Any, ranges: list[KernelRange]) -> list[ProfileResult]:
        """Counters of one execution of each range of `workload` (a workload config), as CUPTI range
        profiling of a run of it would give them; each result's cost_s includes its replay passes."""

    def utilization(self, device: int = 0) -> dict[str, float]:
        """Utilisation over the last run, fractions 0..1 (NVML's utilisation rates): `gpu`, the share
        of time a kernel ran; `memory`, how busy device memory was (what online governors read)."""

    def utilization_samples(self, device: int = 0) -> dict[str, list[tuple[float, float]]]:
        """NVML's utilisation samples taken during the last run (nvmlDeviceGetSamples), per kind
        (`gpu`: share of the sample period a kernel ran; `memory`: share of it device memory was
        read or written) a list of (t_s, fraction 0..1), oldest first, one per NVML sample period."""

    def run(
        self,
        workload: Any,
        iterations: int,
        *,
        warmup: int = 1,
        trace_dir: Path | None = None,
        capture: str = "full",
    ) -> RunResult:
        """Run `workload` (a workload config) for warmup + iterations under the current policy;
        measure the last `iterations`, and write one Kineto trace per rank into trace_dir if given,
        recorded by `capture` (CAPTURES). Without trace_dir the run is not traced at all: every
        measurement but the trace stage's own is made so."""


@runtime_checkable
class Device(Execution, Protocol):
    """An execution backend and the control its runs are made under."""

    name: str  # GPU model key, e.g. "a100"

    def supported_clocks(self) -> list[int]:
        """Supported SM clocks in MHz, ascending."""

    def default_clock(self) -> int:
        """The SM clock the GPU runs at when not locked (the max-clock baseline)."""

    def set_policy(self, policy: FrequencyPolicy | None) -> None:
        """Apply a frequency policy from the next iteration on; None restores default clocks."""

    def set_power_limit(self, watts: float | None) -> None:
        """Cap board power (None: back to TDP); the GPU throttles its clock to stay under it."""

    def energy_j(self, device: int = 0) -> float:
        """Cumulative energy counter of one GPU, in joules (updates only as often as the hardware's)."""

    def clock_step_latencies_ms(self, pairs: list[tuple[int, int]], poll_ms: float) -> list[float]:
        """How long clock requests take to land, one number per (from, to) pair of supported SM clocks:
        lock `from` and wait until it has landed, then lock `to`; the milliseconds from that request
        until a clock read, taken every `poll_ms`, first shows `to` (resolved to `poll_ms`). The GPU
        is left locked at the last `to`; close() restores it."""

    def close(self) -> None:
        """Restore default clocks and power limits."""


@runtime_checkable
class RunsSegments(Protocol):
    """Optional capability: several measured runs under different policies in one launch of the
    program (NvmlDevice: the user's program starts once per stage); run_segments uses it when there."""

    def run_segments(
        self, workload: Any, runs: list[tuple[FrequencyPolicy | None, int]], *, warmup: int = 1
    ) -> list[RunResult]: ...


@runtime_checkable
class ReportsPowerLimits(Protocol):
    """Optional capability: the settable board power range (NVML); else the config's says it."""

    def power_limits_w(self, device: int = 0) -> tuple[float, float, float]:
        """(min, max, default) settable board power of one GPU, in W."""


def runs_triggered_policies(device: Device) -> bool:
    """Optional capability: whether the device follows host-triggered policies (emo.policy.Trigger;
    the virtual GPU's `runs_triggered_policies = True`)."""
    return bool(getattr(device, "runs_triggered_policies", False))


def pooled(*runs: RunResult) -> RunResult:
    """Several measured runs of one setting as one: iterations, time and energy added up."""
    per_device: dict[int, float] = {}
    for r in runs:
        for d, e in r.energy_per_device_j.items():
            per_device[d] = per_device.get(d, 0.0) + e
    return RunResult(
        iterations=sum(r.iterations for r in runs),
        time_s=sum(r.time_s for r in runs),
        energy_j=sum(r.energy_j for r in runs),
        iteration_times_s=[t for r in runs for t in r.iteration_times_s],
        energy_per_device_j=per_device,
    )


def run_segments(
    device: Device,
    workload: Any,
    runs: list[tuple[FrequencyPolicy | None, int]],
    *,
    warmup: int = 1,
    settle: int = 0,
) -> list[RunResult]:
    """Measured runs of `workload`, each (policy or None for default clocks, iterations) after
    `warmup` iterations: in one launch of the program on a device that can (NvmlDevice.run_segments:
    the user's program starts once per stage), else one run each. `settle`: iterations at the
    default clock before them, unmeasured, so that the die is at its working temperature."""
    ahead: list[tuple[FrequencyPolicy | None, int]] = [(None, settle)] if settle > 0 else []
    if isinstance(device, RunsSegments):
        return device.run_segments(workload, ahead + runs, warmup=warmup)[len(ahead) :]
    out = []
    for policy, n in ahead + runs:
        device.set_policy(policy)
        out.append(device.run(workload, n, warmup=warmup))
    device.set_policy(None)
    return out[len(ahead) :]


def settle_iterations(settle_s: float, iteration_s: float) -> int:
    """Iterations of `iteration_s` that span `settle_s` (0: none)."""
    return math.ceil(settle_s / max(iteration_s, 1e-9)) if settle_s > 0 else 0
