"""The calibration protocol: every microbenchmark at every calibrated SM clock (once per GPU model),
and the clock-request latency, measured through the device protocol (stage calibrate writes them).

Each benchmark runs at each clock of `gpu.clocks_mhz[::-model.clocks_stride]` (counted down from the
default clock, which is always included), each measurement spanning at least `model.min_seconds`
so that the energy counter resolves it, `model.repeats` times; its counter vector is read once at
the default clock through the device's range profiler.

Before it starts, the stage logs what it will cost (measurements x their minimum window, in
minutes); while it runs, a progress bar with an ETA (emo.progress). `calibration.json` beside
bench.parquet says which GPU model and driver measured it (what `emo calibration export` packs).
A clock subset (`model.clocks_stride` > 1) is interpolated to every supported clock by the fit.

It also measures how long a clock request takes to land (Device.clock_step_latencies_ms) over
`model.clock_latency_steps` steps up and down of several sizes (clock_steps), reading the clock every
`model.clock_poll_ms`, and stores the distribution in calibration.json (`clock_latency_ms`:
emo.model.calibration.latency_summary); the optimizer plans with it. A device that cannot measure it
stores null and says so; optimize then asks for optimizer.transition_ms.
"""

from __future__ import annotations

import logging

import pandas as pd

from emo.device import COUNTERS, ProfileResult, ProfilingUnavailable
from emo.model.calibration import latency_line, latency_summary
from emo.progress import Progress

log = logging.getLogger("emo")

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
    rows, prof_s, dev_s, clocks, ident = [], 0.0, 0.0, [], {}
    missing: list[str] = []
    bar = None
    try:
        for name in names:
            device = open_dev()
            try:
                t0 = device.time_s()
                clocks = calibrated_clocks(device.supported_clocks(), device.default_clock(), stride)
                if bar is None:
                    ident = device_identity(device)
                    n = len(names) * len(clocks) * repeats
                    log.info(
                        "calibrate: %d benchmarks x %d clocks x %d repeats = %d measurements of >= %g s: "
                        "at least %.1f minutes of GPU time, plus one profiling range per benchmark",
                        len(names),
                        len(clocks),
                        repeats,
                        n,
                        min_seconds,
                        n * min_seconds / 60,
                    )
                    bar = Progress(n, "calibrate")
                try:
                    prof = device.profile_range([name])
                except ProfilingUnavailable as e:  # the curves still calibrate; the fit then uses the mean mix
                    if not missing:
                        log.warning(
                            "calibrate: no benchmark counters (%s): the fit will give every pack the "
                            "microbenchmarks' mean mix",
                            e,
                        )
                    missing.append(name)
                    prof = ProfileResult({c: float("nan") for c in COUNTERS}, passes=0, cost_s=0.0)
                prof_s += prof.cost_s
                for mhz in clocks:
                    for r in range(repeats):
                        m = device.run_microbenchmark(name, mhz, min_seconds)
                        rows.append(
                            {
                                "bench": name,
                                "sm_mhz": int(mhz),
                                "repeat": r,
                                "time_s": m.time_s,
                                "energy_j": m.energy_j,
                                **prof.counters,
                            }
                        )
                        bar.update()
                dev_s += device.time_s() - t0
            finally:
                device.close()
    finally:
        if bar is not None:
            bar.close()
    # the counter columns are what the device's profiler names (EMO's vector, or DCGM fields)
    bench = pd.DataFrame(rows, columns=None if rows else list(BENCH_COLUMNS))
    return bench, {
        "benchmarks": len(names),
        "clocks": len(clocks),
        "measurements": len(rows),
        "profile_cost_s": round(prof_s, 3),
        "device_time_s": round(dev_s, 3),
        "counters": "none" if missing else "device",
        **ident,
    }


def clock_steps(clocks: list[int], default_mhz: int, n: int) -> list[tuple[int, int]]:
    """`n` (from, to) clock steps over the clocks up to the default: alternately up and down, of sizes
    1, 2, 4, ... clock steps and the whole range, each size at positions spread evenly over the range
    (a round covers every size both ways; rounds shift the positions)."""
    cs = sorted(c for c in clocks if c <= default_mhz)
    if len(cs) < 2:
        raise ValueError(f"clock latency: want >= 2 supported clocks up to {default_mhz} MHz, got {cs}")
    top = len(cs) - 1
    sizes = sorted({min(1 << k, top) for k in range(top.bit_length() + 1)})
    per_round = 2 * len(sizes)
    rounds = -(-n // per_round)
    out = []
    for i in range(n):
        r, k = divmod(i, per_round)
        size = sizes[k // 2]
        lo = round((top - size) * (r + 0.5) / rounds)
        a, b = cs[lo], cs[lo + size]
        out.append((a, b) if k % 2 == 0 else (b, a))
    return out


def measure_clock_latency(open_dev, steps: int, poll_ms: float) -> dict | None:
    """The clock-request latency distribution (latency_summary) on a freshly opened device; None,
    said in one line, when the device cannot measure it."""
    device = open_dev()
    try:
        measure = getattr(device, "clock_step_latencies_ms", None)
        if measure is None:
            log.warning(
                "calibrate: %s cannot time clock requests (no clock_step_latencies_ms): no latency "
                "measurement; optimize will need optimizer.transition_ms",
                type(device).__name__,
            )
            return None
        pairs = clock_steps(device.supported_clocks(), device.default_clock(), steps)
        lat = latency_summary(measure(pairs, poll_ms), pairs, poll_ms)
    finally:
        device.close()
    log.info("calibrate: %s", latency_line(lat))
    return lat


def device_identity(device) -> dict:
    """Which GPU model and driver a calibration comes from (NVML's names; the virtual GPU says so)."""
    model = getattr(device, "model", None) or getattr(getattr(device, "phys", None), "device_name", device.name)
    driver = getattr(device, "driver", None) or ("virtual" if hasattr(device, "phys") else "unknown")
    return {"gpu": device.name, "gpu_model": str(model), "driver": str(driver)}
