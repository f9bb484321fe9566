"""profile: the Table II counter vector of the first occurrence of every distinct pack signature,
through the device's range profiler (ranges named by rank and launch ordinal, as on hardware), with
the profiling cost; plus the baseline iteration measured over a window long enough for the energy
counter (BASELINE_SECONDS: a counter that updates every ~100 ms then errs by < 2 %, typically < 1 %),
which the fit's energy-level calibration uses."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from emo.device import COUNTERS
from emo.device.backends import open_device
from emo.graph import Graph
from emo.io import write_json, write_parquet
from emo.pack.ranges import kernel_ordinals, pack_ranges


def profile_first_occurrences(device, workload, packs: pd.DataFrame, events: pd.DataFrame,
                              nodes: pd.DataFrame) -> pd.DataFrame:
    """One row per signature: signature, rank, kernels, COUNTERS, passes, cost_s."""
    first = packs[packs["first_occurrence"]].reset_index(drop=True)
    ranges = pack_ranges(first, nodes["event"].to_numpy(np.int64), kernel_ordinals(events))
    results = device.profile_ranges(workload, ranges)
    rows = [{"signature": s, "rank": r.rank, "kernels": len(r.ordinals), **{c: res.counters[c] for c in COUNTERS},
             "passes": res.passes, "cost_s": res.cost_s}
            for s, r, res in zip(first["signature"], ranges, results)]
    return pd.DataFrame(rows, columns=["signature", "rank", "kernels", *COUNTERS, "passes", "cost_s"])


BASELINE_SECONDS = 5.0
LOW_CLOCK_FRACTION = 0.7  # the second calibration point of the energy levels (emo.stages.fit)


def measure_iteration(device, workload, iteration_s: float, min_seconds: float, warmup: int = 1,
                      sm_mhz: int | None = None, gpus: list[int] = (0,)) -> dict:
    """Time and energy of one iteration at a static clock (None: default clocks), measured over
    >= BASELINE_SECONDS (and >= min_seconds) of iterations."""
    n = max(3, math.ceil(max(BASELINE_SECONDS, min_seconds) / max(iteration_s, 1e-6)))
    if sm_mhz is None:
        device.set_policy(None)
    else:
        from emo.policy import FrequencyPolicy

        device.set_policy(FrequencyPolicy.static(device.name, list(gpus), sm_mhz))
    res = device.run(workload, n, warmup=warmup)
    device.set_policy(None)
    return {"sm_mhz": int(sm_mhz or device.default_clock()), "iterations": n, "time_s": res.time_s,
            "energy_j": res.energy_j, "iteration_time_s": res.time_s / n, "iteration_energy_j": res.energy_j / n,
            "energy_per_device_j": {str(k): v for k, v in res.energy_per_device_j.items()}}


def measure_baselines(device, workload, iteration_s: float, min_seconds: float, warmup: int = 1,
                      gpus: list[int] = (0,)) -> dict:
    """The default-clock iteration (top-level keys) and one at ~LOW_CLOCK_FRACTION of the max clock
    (key `low`): two points for the fit's energy levels."""
    base = measure_iteration(device, workload, iteration_s, min_seconds, warmup)
    clocks = device.supported_clocks()
    low = min(clocks, key=lambda c: abs(c - LOW_CLOCK_FRACTION * max(clocks)))
    base["low"] = measure_iteration(device, workload, iteration_s / LOW_CLOCK_FRACTION, min_seconds, warmup, low, gpus)
    return base


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    if cfg["workload"]["kind"] == "recorded":
        raise ValueError("profile: a recorded trace cannot be re-run for profiling; use workload=tp|pp|offload "
                         "or workload=command on a GPU box")
    packs = pd.read_parquet(inputs["packs"])
    events = pd.read_parquet(inputs["events"])
    nodes = Graph.load(inputs["graph_nodes"].parent).nodes
    measured = json.loads(Path(inputs["measured"]).read_text())
    device = open_device(cfg["gpu"])
    try:
        metrics = profile_first_occurrences(device, cfg["workload"], packs, events, nodes)
        it_s = float(measured["time_s"]) / int(measured["iterations"])
        gpus = sorted(nodes.loc[nodes["device"] >= 0, "rank"].unique().tolist())  # one GPU per rank
        baseline = measure_baselines(device, cfg["workload"], it_s, float(cfg["model"]["min_seconds"]),
                                     int(cfg["trace"]["warmup"]), gpus)
    finally:
        device.close()
    write_parquet(out / "metrics.parquet", metrics)
    write_json(out / "baseline.json", baseline)
    return {"signatures": len(metrics), "profiled_kernels": int(metrics["kernels"].sum()),
            "profiling_cost_s": round(float(metrics["cost_s"].sum()), 3),
            "baseline_iteration_s": baseline["iteration_time_s"], "baseline_energy_j": baseline["iteration_energy_j"]}
