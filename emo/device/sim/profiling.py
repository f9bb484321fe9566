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

from emo.device import KernelRange, ProfileResult
from emo.device.sim.program import KernelSpec, Op, Program, Work


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
            raise ValueError(f"profile range: rank {r.rank} launches {len(launches)} kernels per iteration; "
                             f"ordinals {list(r.ordinals)[:5]} are out of range")
        kids = [launches[o] for o in r.ordinals]
        if min(kids) < 0:
            raise ValueError(f"profile range: rank {r.rank} ordinal {r.ordinals[kids.index(-1)]} is a NCCL kernel; "
                             "collectives are not profiled")
        results.append(device.profile_range([program.kernels[k] for k in kids]))
    return results
