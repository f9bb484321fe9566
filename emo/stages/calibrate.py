"""calibrate: every microbenchmark at every calibrated SM clock (once per GPU model).

Each benchmark runs at each clock of `gpu.clocks_mhz[::-model.clocks_stride]` (counted down from the
default clock, which is always included), each measurement spanning at least `model.min_seconds`
so that the energy counter resolves it, `model.repeats` times; its counter vector is read once at
the default clock through the device's range profiler. The folder's hash covers the GPU
configuration and the model section only: no workload ever re-runs it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from emo.device import COUNTERS
from emo.device.backends import open_device
from emo.io import write_parquet
from emo.microbench import benchmark_names

BENCH_COLUMNS = ("bench", "sm_mhz", "repeat", "time_s", "energy_j", *COUNTERS)


def calibrated_clocks(clocks: list[int], default_mhz: int, stride: int) -> list[int]:
    """Every `stride`-th supported clock counted down from the default (ascending)."""
    if stride < 1:
        raise ValueError(f"model.clocks_stride: want >= 1, got {stride}")
    below = [c for c in sorted(clocks) if c <= default_mhz]
    return sorted(below[::-1][::stride])


def calibrate(open_dev, names: list[str], min_seconds: float, repeats: int, stride: int) -> tuple[pd.DataFrame, dict]:
    """The calibration table (BENCH_COLUMNS) and what it cost. `open_dev()` opens the device; each
    benchmark gets a freshly opened one (a long-lived session's measurement history only grows)."""
    if repeats < 1:
        raise ValueError(f"model.repeats: want >= 1, got {repeats}")
    rows, prof_s, dev_s, clocks = [], 0.0, 0.0, []
    for name in names:
        device = open_dev()
        try:
            t0 = device.time_s()
            clocks = calibrated_clocks(device.supported_clocks(), device.default_clock(), stride)
            prof = device.profile_range([name])
            prof_s += prof.cost_s
            for mhz in clocks:
                for r in range(repeats):
                    m = device.run_microbenchmark(name, mhz, min_seconds)
                    rows.append((name, int(mhz), r, m.time_s, m.energy_j, *(prof.counters[c] for c in COUNTERS)))
            dev_s += device.time_s() - t0
        finally:
            device.close()
    bench = pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
    return bench, {"benchmarks": len(names), "clocks": len(clocks), "measurements": len(rows),
                   "profile_cost_s": round(prof_s, 3), "device_time_s": round(dev_s, 3)}


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    m = cfg["model"]
    bench, metrics = calibrate(lambda: open_device(cfg["gpu"]), benchmark_names(), float(m["min_seconds"]),
                               int(m["repeats"]), int(m["clocks_stride"]))
    write_parquet(out / "bench.parquet", bench)
    return metrics
