"""Counter vectors of pack ranges from per-kernel counters recorded in a trace.

torch.profiler can record CUPTI range-profiler metrics per kernel instead of a timeline
(`experimental_config=_ExperimentalConfig(profiler_metrics=[...], profiler_measure_per_kernel=True)`,
CUDA activity only): Kineto then writes one `cuda_profiler_range` event per kernel, named after the
kernel, with each metric as an argument (libkineto CuptiRangeProfiler). Such a trace of one iteration
per rank, beside the timeline trace, gives every pack its counters without a re-run: a range's
kernels are found by launch ordinal and checked by name.
"""

from __future__ import annotations

import bisect

from emo.device import KernelRange
from emo.device.features import emo_counters, sum_counters

PROFILER_RANGE = "cuda_profiler_range"


def profiler_range_kernels(trace_events: list[dict]) -> list[tuple[str, dict[str, float]]]:
    """(kernel name, metric values) of every per-kernel counter event of one rank, in launch order."""
    evs = [e for e in trace_events if e.get("cat") == PROFILER_RANGE and e.get("ph") == "X"]
    evs.sort(key=lambda e: float(e.get("ts", 0)))
    out = []
    for e in evs:
        args = {k: float(v) for k, v in (e.get("args") or {}).items() if isinstance(v, (int, float))}
        out.append((str(e.get("name", "")), args))
    return out


def range_counters(
    kernels_by_rank: dict[int, list[tuple[str, dict[str, float]]]],
    ranges: list[KernelRange],
    names_by_rank: dict[int, list[str]],
) -> list[dict[str, float]]:
    """EMO's counter vector of each range. A rank's counter events cover one iteration's kernels,
    either all of them or all but the NCCL ones (ranges' ordinals are mapped past those); the trace's
    kernel names at the same positions must match."""
    out = []
    for r in ranges:
        kern = kernels_by_rank.get(r.rank)
        if not kern:
            raise ValueError(f"counters: no per-kernel counters for rank {r.rank}")
        names = names_by_rank.get(r.rank, [])
        nccl = sorted(r.nccl)
        if len(kern) == len(names):
            idx = list(r.ordinals)
        elif len(kern) == len(names) - len(nccl):
            idx = [o - bisect.bisect_left(nccl, o) for o in r.ordinals]
        else:
            raise ValueError(
                f"counters: rank {r.rank} has counters for {len(kern)} kernels, but one iteration of the "
                f"trace launches {len(names)} ({len(nccl)} NCCL)"
            )
        for o, i in zip(r.ordinals, idx):
            if kern[i][0] != names[o]:
                raise ValueError(
                    f"counters: rank {r.rank} kernel {o} is {names[o][:60]!r} in the trace but "
                    f"{kern[i][0][:60]!r} in the counters: not the same iteration's kernels"
                )
        out.append(sum_counters([emo_counters(kern[i][1]) for i in idx]))
    return out
