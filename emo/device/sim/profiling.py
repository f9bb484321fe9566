"""Range profiling on the virtual GPU, addressed the way a real profiler addresses kernels.

A model never names a simulator kernel: it names a range by what the trace shows, the rank and the
ordinals of the kernel launches within one iteration (host launch order, every kernel counted,
NCCL ones included, copies not: `emo.device.KernelRange`). On hardware the same ordinals drive
CUPTI's range profiler (push a range before the n-th launch, pop after the m-th, replay). Here they
index the program's launches, and each range is profiled by `SimDevice.profile_range`, which
charges the replay passes' time and energy to the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from emo.device import KernelRange, ProfileResult
from emo.workloads.program import KernelSpec, Op, Program, Work


def as_specs(kernels: list[Any]) -> list[KernelSpec]:
    """KernelSpec per entry: a KernelSpec, a Work vector, or a microbenchmark name (the registry's
    work vector, as the NVML backend profiles microbenchmarks by name)."""
    specs = []
    for k in kernels:
        if isinstance(k, KernelSpec):
            specs.append(k)
        elif isinstance(k, Work):
            specs.append(KernelSpec(name="k", work=k))
        elif isinstance(k, str):
            from emo.microbench import load_registry

            reg = load_registry()
            if k not in reg:
                raise ValueError(f"profile_range: {k!r} is not a microbenchmark of the registry")
            specs.append(KernelSpec(name=k, work=Work(**reg[k]["work"])))
        else:
            raise ValueError(f"profile_range: cannot profile a {type(k).__name__}")
    return specs


def launch_table(program: Program) -> list[list[int]]:
    """Per rank, the kernel id of every kernel launch of one iteration in host order (-1: NCCL)."""
    out = []
    for ops in program.ops:
        out.append([op[2] if op[0] == Op.LAUNCH else -1 for op in ops if op[0] in (Op.LAUNCH, Op.COLLECTIVE)])
    return out


def profile_ranges(device, workload: Any, ranges: list[KernelRange]) -> list[ProfileResult]:
    """Counters of one execution of each range of `workload`'s iteration (see module docstring)."""
    program = device._program(workload)
    table = launch_table(program)
    results = []
    for r in ranges:
        if not 0 <= r.rank < len(table):
            raise ValueError(f"profile range: rank {r.rank} not in the workload ({len(table)} ranks)")
        launches = table[r.rank]
        bad = [o for o in r.ordinals if not 0 <= o < len(launches)]
        if bad or not r.ordinals:
            raise ValueError(
                f"profile range: rank {r.rank} launches {len(launches)} kernels per iteration; "
                f"ordinals {list(r.ordinals)[:5]} are out of range"
            )
        kids = [launches[o] for o in r.ordinals]
        if min(kids) < 0:
            raise ValueError(
                f"profile range: rank {r.rank} ordinal {r.ordinals[kids.index(-1)]} is a NCCL kernel; "
                "collectives are not profiled"
            )
        results.append(device.profile_range([program.kernels[k] for k in kids]))
    return results


def dcgm_fields(works: list[Work], dur_ns: np.ndarray, f_hz: float, phys) -> dict[str, float]:
    """What DCGM's profiling fields would report over a window that ran `works` back to back for
    `dur_ns` each at clock f_hz: activity ratios averaged over the window's time (emo.device.features).
    A pipe's ratio is its cycles busy over the SM cycles of the window; DRAM's, its bytes over what
    the bus moves in that time."""
    d = np.asarray(dur_ns, dtype=np.float64)
    span = float(d.sum())
    get = lambda f: np.array([getattr(w, f) for w in works], dtype=np.float64)  # noqa: E731
    aw = get("active_warps")
    sm_cycles = phys.sms * f_hz * span * 1e-9

    def pipe(*pairs) -> float:
        return float(min(1.0, sum(get(w).sum() / getattr(phys, r) for w, r in pairs) / sm_cycles))

    return {
        "DCGM_FI_PROF_SM_ACTIVE": float(np.sum(d * np.minimum(1.0, aw * 8 + 0.05)) / span),
        "DCGM_FI_PROF_SM_OCCUPANCY": float(np.sum(d * aw) / span),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": pipe(
            ("fp16_tensor_flop", "fp16_tensor_flop_per_sm_cycle"), ("int8_tensor_op", "int8_tensor_op_per_sm_cycle")
        ),
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": pipe(("fp64_flop", "fp64_flop_per_sm_cycle")),
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": pipe(("fp32_flop", "fp32_flop_per_sm_cycle")),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0,  # the virtual GPU's work has no non-tensor FP16
        "DCGM_FI_PROF_DRAM_ACTIVE": float(
            min(1.0, (get("dram_read_bytes").sum() + get("dram_write_bytes").sum()) / (phys.dram_gbps * span))
        ),
    }


# ncu's replay passes (Kernel Profiling Guide, "Kernel Replay"): counters from different hardware
# units are collected in different passes of the same range; instruction counts are exact, while what
# a pass measures in cycles or bytes varies with its clock ramp and cache/DRAM state after the restore
REPLAY_PASSES = (
    ("sm_active_cycles", "active_warps"),
    ("dram_read_bytes", "dram_write_bytes"),
    ("l1_bytes", "l2_bytes"),
)


def replay_noise(c: dict[str, float], sigma: float, rng: np.random.Generator) -> dict[str, float]:
    """The counters with one relative error per replay pass (lognormal, `sigma`) on the passes that
    measure cycles or bytes; instruction counters as they are."""
    if sigma <= 0:
        return c
    out = dict(c)
    eps = rng.standard_normal(len(REPLAY_PASSES))
    for names, e in zip(REPLAY_PASSES, eps):
        for n in names:
            out[n] = c[n] * float(np.exp(sigma * e - 0.5 * sigma * sigma))
    return out


def dcgm_noise(c: dict[str, float], sigma: float, rng: np.random.Generator) -> dict[str, float]:
    """DCGM's profiling fields are sampled activity ratios, multiplexed by metric group over time
    windows (dcgmProfGetSupportedMetricGroups: groups that share hardware are not watched together):
    each field sees its own share of the range, so each gets its own relative error, kept in [0, 1]."""
    if sigma <= 0:
        return c
    eps = rng.standard_normal(len(c))
    return {k: float(min(1.0, max(0.0, v * (1.0 + sigma * e)))) for (k, v), e in zip(c.items(), eps)}
