"""What the model learns of a workload (stage profile): the Table II counter vector of the first occurrence of every distinct pack signature,
through the device's range profiler (ranges named by rank and launch ordinal, as on hardware), with
the profiling cost; plus the baseline iteration measured over a window long enough for the energy
counter (BASELINE_SECONDS: a counter that updates every ~100 ms then errs by < 2 %, typically < 1 %)
at the default clock and at a few static clocks below it (`model.level_fractions`), which the fit's
time and energy levels match.

Where the counters come from (column `source` of metrics.parquet):
  device  the device's range profiler (Nsight Compute on hardware; every rank of a torchrun job
          in one run, NCCL kernels not replayed), its cost stated in the log before it starts;
  trace   per-kernel counters recorded by torch.profiler (a `counters/` folder of Kineto files
          beside a recorded trace, emo.pack.counters): no re-run;
  file    a metrics.parquet beside a recorded trace, from a profile run on a box of that GPU model;
  none    no profiler or no permission to use it (or a recorded trace without counters): the fit
          gives those packs the microbenchmarks' mean mix (docs/gpu.md says what that costs).
A recorded trace cannot be re-run, so its baseline is what its window records (emo-capture/) say,
or, without them, its iteration time alone (the energy level then stays the model's own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from emo.device import COUNTERS, ProfilingUnavailable
from emo.pack.ranges import kernel_ordinals, pack_ranges
from emo.trace import load_kineto_document, trace_files

if TYPE_CHECKING:
    from emo.sections import Config

log = logging.getLogger("emo")


def sidecar_paths(src: Path) -> dict[str, Path]:
    """What recorded trace `src` (a file or a folder) brings beside it (the module docstring): its
    per-kernel counters, a metrics.parquet, its window records; those that exist."""
    folder = src if src.is_dir() else src.parent
    found = {"counters": folder / "counters", "metrics": folder / "metrics.parquet", "windows": folder / "emo-capture"}
    return {k: p for k, p in found.items() if p.exists()}


def first_ranges(packs: pd.DataFrame, events: pd.DataFrame, nodes: pd.DataFrame):
    """(first occurrences, their kernel ranges with each rank's NCCL ordinals, kernel names per rank
    in one iteration's launch order, kernel seconds per rank in that iteration)."""
    first = packs[packs["first_occurrence"]].reset_index(drop=True)
    ords = kernel_ordinals(events)
    ranges = pack_ranges(first, nodes["event"].to_numpy(np.int64), ords)
    ev = events.reset_index(drop=True).loc[ords.index].assign(**{c: ords[c] for c in ords.columns})
    one = ev[ev["iteration"] == ev.groupby("rank")["iteration"].transform("min")].sort_values(["rank", "ordinal"])
    names = {int(r): g["name"].astype(str).tolist() for r, g in one.groupby("rank")}
    is_nccl = one["name"].astype(str).str.lower().str.contains("nccl")
    nccl = {int(r): tuple(int(o) for o in g.loc[is_nccl.loc[g.index], "ordinal"]) for r, g in one.groupby("rank")}
    secs = {int(r): (g.loc[~is_nccl.loc[g.index], "dur_ns"] * 1e-9).tolist() for r, g in one.groupby("rank")}
    ranges = [dataclasses.replace(r, nccl=nccl.get(r.rank, ())) for r in ranges]
    return first, ranges, names, [secs[r] for r in sorted(secs)]


def metrics_table(first: pd.DataFrame, ranges, counters: list[dict], passes, cost_s, source: str) -> pd.DataFrame:
    """One row per signature; the counter columns are what the profiler names (EMO's vector on ncu,
    DCGM field names on a virtual GPU answering in DCGM form)."""
    names = list(counters[0]) if counters else list(COUNTERS)
    rows = [
        {
            "signature": s,
            "rank": r.rank,
            "kernels": len(r.ordinals),
            **{c: v[c] for c in names},
            "passes": p,
            "cost_s": cs,
            "source": source,
        }
        for s, r, v, p, cs in zip(first["signature"], ranges, counters, passes, cost_s)
    ]
    return pd.DataFrame(rows, columns=["signature", "rank", "kernels", *names, "passes", "cost_s", "source"])


def no_counters(first: pd.DataFrame, ranges, why: str) -> pd.DataFrame:
    """The metrics table without counters (NaN): the fit gives these packs the mean mix."""
    log.warning(
        "profile: %s: going on without pack counters; each pack gets the microbenchmarks' mean mix "
        "(docs/gpu.md, 'Without profiling permission', says what that costs)",
        why,
    )
    nan = {c: float("nan") for c in COUNTERS}
    return metrics_table(first, ranges, [nan] * len(ranges), [0] * len(ranges), [0.0] * len(ranges), "none")


def profile_first_occurrences(
    device, workload, packs: pd.DataFrame, events: pd.DataFrame, nodes: pd.DataFrame, run_s: float = 0.0
) -> pd.DataFrame:
    """One row per signature: signature, rank, kernels, COUNTERS, passes, cost_s, source."""
    first, ranges, _, secs = first_ranges(packs, events, nodes)
    estimate = getattr(device, "profile_cost_s", None)
    if estimate is not None:
        log.info(
            "profile: Nsight Compute will replay %d kernels of one iteration on %d rank(s) (NCCL kernels are not "
            "replayed), several passes each: about %.1f minutes including one run of the command (an estimate)",
            max((len(k) for k in secs), default=0),
            len(secs),
            estimate(secs, run_s) / 60,
        )
    try:
        results = device.profile_ranges(workload, ranges)
    except ProfilingUnavailable as e:
        return no_counters(first, ranges, str(e))
    return metrics_table(
        first, ranges, [r.counters for r in results], [r.passes for r in results], [r.cost_s for r in results], "device"
    )


BASELINE_SECONDS = 5.0


def level_clocks(clocks: list[int], fractions) -> list[int]:
    """The supported clocks nearest each fraction of the max clock, highest first, without
    duplicates or the max clock itself (the default-clock measurement is that point)."""
    top = max(clocks)
    picked = [min(clocks, key=lambda c: abs(c - f * top)) for f in fractions]
    return sorted({c for c in picked if c != top}, reverse=True)


def baseline_iterations(iteration_s: float, min_seconds: float) -> int:
    """Iterations that span >= BASELINE_SECONDS (and >= min_seconds) at `iteration_s` each."""
    return max(3, math.ceil(max(BASELINE_SECONDS, min_seconds) / max(iteration_s, 1e-6)))


def _point(device, res, n: int, sm_mhz: int | None) -> dict:
    times = np.asarray(res.iteration_times_s, dtype=np.float64)
    return {
        "sm_mhz": int(sm_mhz or device.default_clock()),
        "iterations": n,
        "time_s": res.time_s,
        "energy_j": res.energy_j,
        "iteration_time_s": res.time_s / n,
        "iteration_energy_j": res.energy_j / n,
        # the iterations' spread (None where the device reports no per-iteration times)
        "iteration_time_sd_s": float(times.std(ddof=1)) if len(times) >= 2 else None,
        "energy_per_device_j": {str(k): v for k, v in res.energy_per_device_j.items()},
    }


def measure_baselines(
    device,
    workload,
    iteration_s: float,
    min_seconds: float,
    warmup: int = 1,
    gpus: Sequence[int] = (0,),
    fractions=(0.7,),
    settle_s: float = 0.0,
) -> dict:
    """The default-clock iteration (top-level keys) and one at the clock nearest each fraction of the
    max clock (key `levels`, highest clock first): the points the fit's time and energy levels match,
    each measured over >= BASELINE_SECONDS (and >= min_seconds), all in one launch of the program
    (emo.device.run_segments), after `settle_s` seconds at the default clock, unmeasured."""
    from emo.device import pooled, run_segments, settle_iterations
    from emo.policy import FrequencyPolicy

    top = max(device.supported_clocks())
    # the levels up and back down between two default-clock runs, pooled per clock: the die warms
    # over the launch and a drift cancels to first order (as validate measures)
    levels = level_clocks(device.supported_clocks(), fractions)
    clocks = [None, *levels, *levels[-2::-1], None]
    runs = [
        (
            None if mhz is None else FrequencyPolicy.static(device.name, list(gpus), mhz),
            baseline_iterations(iteration_s * top / (mhz or top), min_seconds),
        )
        for mhz in clocks
    ]
    total = sum(n + warmup for _, n in runs)
    est_s = sum((n + warmup) * iteration_s * top / (mhz or top) for (_, n), mhz in zip(runs, clocks))
    log.info(
        "profile: the baselines: %d clock(s) (%s MHz), %d iterations in all, in one launch of the program "
        "(where the device runs one: the nvml backend): about %.1f minutes plus the program's start-up",
        len(clocks),
        ", ".join(str(m or top) for m in clocks),
        total,
        est_s / 60,
    )
    settle = settle_iterations(settle_s, iteration_s)  # the die at its working temperature first
    results = run_segments(device, workload, runs, warmup=warmup, settle=settle)
    by_clock: dict[int | None, list] = {}
    for mhz, res in zip(clocks, results):
        by_clock.setdefault(mhz, []).append(res)
    points = [_point(device, pooled(*rs), sum(r.iterations for r in rs), mhz) for mhz, rs in by_clock.items()]
    return {**points[0], "levels": points[1:]}


def trace_counters(folder: Path) -> dict[int, list]:
    """Per-kernel counters per rank from the Kineto files in `folder` (emo.pack.counters); ranks
    from distributedInfo, else file order. Empty when the folder holds none."""
    from emo.pack.counters import profiler_range_kernels

    out: dict[int, list] = {}
    files = trace_files(folder) if folder.is_dir() else []
    for i, f in enumerate(files):
        doc = load_kineto_document(f)  # the trace reader's own parsing (emo.trace)
        kern = profiler_range_kernels(doc.get("traceEvents", []))
        if kern:
            rank = (doc.get("distributedInfo") or {}).get("rank", i)
            out[int(rank)] = kern
    return out


def recorded_metrics(src: Path, packs, events, nodes) -> pd.DataFrame:
    """Counters of recorded trace `src`'s packs from its sidecars (sidecar_paths): per-kernel
    counters in its counters/ folder, a metrics.parquet from a profile run on that GPU model, or none."""
    from emo.pack.counters import range_counters

    side, folder = sidecar_paths(src), src if src.is_dir() else src.parent
    first, ranges, names, _ = first_ranges(packs, events, nodes)
    per_kernel = trace_counters(side["counters"]) if "counters" in side else {}
    if per_kernel:
        vecs = range_counters(per_kernel, ranges, names)
        return metrics_table(first, ranges, vecs, [0] * len(ranges), [0.0] * len(ranges), "trace")
    given = side.get("metrics")
    if given is not None and given.is_file():
        m = pd.read_parquet(given).drop_duplicates("signature").set_index("signature")
        missing = [s for s in first["signature"] if s not in m.index]
        if missing:
            raise ValueError(
                f"{given}: no counters for {len(missing)} of the trace's {len(first)} pack signatures "
                f"(e.g. {missing[0]}): it comes from another job or packing"
            )
        vecs = [m.loc[s, list(COUNTERS)].to_dict() for s in first["signature"]]
        return metrics_table(first, ranges, vecs, [0] * len(ranges), [0.0] * len(ranges), "file")
    return no_counters(first, ranges, f"{folder} has no counters/ folder of per-kernel counters and no metrics.parquet")


def recorded_baseline(src: Path, events: pd.DataFrame) -> dict:
    """The baseline iteration of recorded trace `src`: its window records (sidecar "windows": emo
    trace writes them: wall time and NVML energy of the active iterations), else its iteration time
    from ProfilerStep marks."""
    windows = sidecar_paths(src).get("windows")
    wins = [json.loads(p.read_text()) for p in sorted(windows.glob("rank*.window.json"))] if windows else []
    if wins:
        n = int(wins[0]["iterations"])
        t = max(float(w["time_s"]) for w in wins)
        e = [float(w["energy_j"]) for w in wins if w.get("energy_j") is not None]
        return {
            "sm_mhz": None,
            "iterations": n,
            "iteration_time_s": t / n,
            "iteration_energy_j": sum(e) / n if len(e) == len(wins) else None,
            "source": "window",
        }
    steps = events[(events["kind"] == "annotation") & events["name"].astype(str).str.startswith("ProfilerStep#")]
    if steps.empty:
        raise ValueError(
            f"{src}: a recorded trace needs ProfilerStep# annotations or emo-capture window records "
            "to know its iteration time"
        )
    t = float(steps.groupby("rank")["dur_ns"].median().max()) * 1e-9
    return {
        "sm_mhz": None,
        "iterations": int(steps.groupby("rank").size().min()),
        "iteration_time_s": t,
        "iteration_energy_j": None,
        "source": "trace",
    }


def only_ranks(baseline: dict, ranks: list[int]) -> dict:
    """A baseline measured on the whole job, its energies those of `ranks` (a sampled graph's
    ranks): what the model of their graph is fitted to."""

    def point(p: dict) -> dict:
        per = {k: v for k, v in p["energy_per_device_j"].items() if int(k) in set(ranks)}
        e = float(sum(per.values()))
        return {**p, "energy_j": e, "iteration_energy_j": e / p["iterations"], "energy_per_device_j": per}

    return {**point(baseline), "levels": [point(p) for p in baseline.get("levels", [])]}


def profile_workload(
    cfg: Config,
    packs: pd.DataFrame,
    events: pd.DataFrame,
    nodes: pd.DataFrame,
    measured: dict,
    open_dev: Callable[[], Any],
    *,
    recorded: bool,
) -> tuple[pd.DataFrame, dict, dict]:
    """(metrics.parquet, baseline.json, the profile stage's metrics) of `cfg`'s workload (sections
    gpu, workload, trace, model), from its trace's events and measured run and its packs, on the
    device `open_dev()` opens; `recorded`: a trace recorded elsewhere (its kind's flag, which the
    stage reads: the models know no workload kinds), from its sidecars, no device."""
    if recorded:  # no re-run: counters and baseline from what was recorded
        src = Path(cast(dict, cfg.workload)["path"])  # the workload stays its dict (emo.config.typed)
        metrics = recorded_metrics(src, packs, events, nodes)
        baseline = recorded_baseline(src, events)
    else:
        device = open_dev()
        try:
            plain = measured.get("untraced", {}).get("iteration_times_s")  # absent in traces older than it
            it_s = float(np.mean(plain)) if plain else float(measured["time_s"]) / int(measured["iterations"])
            metrics = profile_first_occurrences(
                device, cfg.workload, packs, events, nodes, run_s=float(measured["time_s"])
            )
            gpus = sorted(nodes.loc[nodes["device"] >= 0, "rank"].unique().tolist())  # one GPU per rank
            sample = measured.get("sample")  # a sampled trace (emo.sampling): the graph holds one rank per class
            baseline = measure_baselines(
                device,
                cfg.workload,
                it_s,
                float(cfg.model.min_seconds),
                int(cfg.trace.warmup),
                list(range(int(sample["world"]))) if sample else gpus,  # every GPU of the job at each clock
                cfg.model.level_fractions,
                float(cfg.gpu.settle_s),
            )
            if sample:
                baseline = only_ranks(baseline, gpus)
        finally:
            device.close()
    summary = {
        "signatures": len(metrics),
        "profiled_kernels": int(metrics["kernels"].sum()),
        "profiling_cost_s": round(float(metrics["cost_s"].sum()), 3),
        "counters": str(metrics["source"].iloc[0]),
        "baseline_iteration_s": baseline["iteration_time_s"],
        "baseline_energy_j": baseline["iteration_energy_j"],
    }
    return metrics, baseline, summary
