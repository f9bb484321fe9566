"""The calibration table (`bench.parquet`) as arrays, and the power terms it yields.

`bench` has one row per microbenchmark x SM clock (repeats allowed: they are averaged by median):
`bench, sm_mhz, time_s, energy_j` plus the counter vector of one launch (`emo.device.COUNTERS`),
read at the default clock (other rows may repeat it or leave it empty).

Power terms, per clock f:
  P_idle(f)  board power of the `idle` microbenchmark (a context held, nothing to do): E / T;
  P_run(f)   board power of a GPU that is running a kernel but doing no work on any unit: the
             constant that every running kernel pays per second on top of the work it does. The
             suite runs the same work at two occupancies (e.g. fp32_fma_high / _low): same work,
             same work energy, different time, so E_low - E_high = P_run * (T_low - T_high). P_run
             is the least-squares slope over all such pairs (found from equal work counters, so no
             registry is needed), never below P_idle; P_idle when the suite has no pairs.
  W_j(f)     the work energy of benchmark j: E_j(f) - P_run(f) * T_j(f), what its operations and
             bytes cost (for CMOS, per operation ~ C V(f)^2; DRAM bytes ~ constant).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from emo.device import COUNTERS
from emo.device.features import FEATURES, FeatureSet, resolve_columns

# Counters that measure time or occupancy rather than work: they do not add up when the units of a
# kernel work in parallel, and two runs of the same work at different occupancy differ in them.
TIME_COUNTERS = ("sm_active_cycles", "active_warps")
WORK_COUNTERS = tuple(c for c in COUNTERS if c not in TIME_COUNTERS)
BENCH_COLUMNS = ("bench", "sm_mhz", "time_s", "energy_j")
OTHER_COLUMNS = ("repeat",)


def counter_features(columns) -> FeatureSet:
    """The counter columns of a table: EMO's own vector when every one of them is there, else every
    column a known source names (DCGM fields, ncu metrics: emo.device.features)."""
    cols = [c for c in columns if c not in BENCH_COLUMNS and c not in OTHER_COLUMNS and c != "signature"]
    if all(c in cols for c in COUNTERS):
        return COUNTERS
    fs, _ = resolve_columns(cols)
    return FeatureSet({c: col for c, col in fs.columns.items() if col.feature in FEATURES})


IDLE_BENCH = "idle"


@dataclass(frozen=True)
class BenchTables:
    """The calibration as arrays: J benchmarks x C clocks."""

    names: tuple[str, ...]
    clocks: np.ndarray  # [C] MHz, ascending
    default_index: int  # index of the default clock in `clocks`
    time_s: np.ndarray  # [J, C] one launch
    energy_j: np.ndarray  # [J, C] one launch
    counters: np.ndarray  # [J, K] one launch at the default clock, columns of `features`
    features: FeatureSet = COUNTERS  # which counter columns, as their source names them

    @property
    def default_mhz(self) -> int:
        return int(self.clocks[self.default_index])

    def index(self, name: str) -> int:
        return self.names.index(name)


def interp_curves(clocks: np.ndarray, values: np.ndarray, at: np.ndarray, inverse: bool) -> np.ndarray:
    """[N, len(at)] each row of values [N, C] at the clocks `at` (PCHIP: monotone where the data is,
    no overshoot; in 1/f for time, where a compute-bound part is linear). Exact at measured clocks."""
    from scipy.interpolate import PchipInterpolator

    clocks, at = np.asarray(clocks, dtype=np.float64), np.asarray(at, dtype=np.float64)
    if len(clocks) == 1:
        return np.repeat(values, len(at), axis=1)
    x = 1.0 / clocks[::-1] if inverse else clocks
    v = values[:, ::-1] if inverse else values
    return PchipInterpolator(x, v, axis=1)(1.0 / at if inverse else at)


SMOOTH_MIN_CLOCKS = 5  # a cubic smoothing spline needs at least 5 points


def smooth_curves(clocks: np.ndarray, values: np.ndarray, inverse: bool) -> np.ndarray:
    """[N, C] each row of values [N, C] as a cubic smoothing spline over the clocks (in 1/f for
    time), its smoothing chosen by generalised cross-validation. A benchmark's time and power are
    smooth in the clock, its measurements are not: left raw, every noisy clock is a cheap or a dear
    one to the optimizer, which picks the cheap ones (it spends exactly the errors in its favour)."""
    from scipy.interpolate import make_smoothing_spline

    if len(clocks) < SMOOTH_MIN_CLOCKS:
        return values
    f = np.asarray(clocks, dtype=np.float64) / float(np.max(clocks))  # O(1): the GCV search is scale-sensitive
    x = 1.0 / f[::-1] if inverse else f
    out = np.empty_like(values)
    for i, row in enumerate(values):
        y = row[::-1] if inverse else row
        scale = float(np.median(y))
        fitted = make_smoothing_spline(x, y / scale)(x) * scale
        out[i] = fitted[::-1] if inverse else fitted
    return out


def repeats_differ(df: pd.DataFrame) -> bool:
    """Whether any benchmark's repeats at one clock measured different time or energy."""
    g = df.groupby(["bench", "sm_mhz"], sort=False)[["time_s", "energy_j"]]
    return bool((g.max() > g.min()).to_numpy().any())


def bench_tables(
    bench: pd.DataFrame,
    default_mhz: int | None = None,
    where: str = "bench",
    clocks: Sequence[int] | None = None,
    smooth: bool = True,
) -> BenchTables:
    """Validate `bench` and pivot it to arrays (median over repeats). `default_mhz`: the clock the
    counters were read at and the anchor of every curve (default: the highest clock). `clocks`: the
    GPU's supported clocks; those between the lowest and highest calibrated one are interpolated
    (a calibration at a clock subset then predicts every clock in its range). `smooth`: when
    repeats of a measurement differ, each benchmark's time and power as smoothing splines over the
    clocks (smooth_curves)."""
    features = counter_features(bench.columns)
    missing = [c for c in BENCH_COLUMNS if c not in bench.columns] or ([] if len(features) else list(COUNTERS))
    if missing:
        raise ValueError(f"{where}: missing columns {', '.join(missing)}")
    if bench.empty:
        raise ValueError(f"{where}: no rows")
    df = bench.assign(bench=bench["bench"].astype(str), sm_mhz=bench["sm_mhz"].astype(np.int64))
    bad = df[~((df["time_s"] > 0) & (df["energy_j"] > 0))]
    if len(bad):
        r = bad.iloc[0]
        raise ValueError(
            f"{where}: {r['bench']} at {r['sm_mhz']} MHz has time_s={r['time_s']}, "
            f"energy_j={r['energy_j']} (both must be > 0)"
        )
    med = df.groupby(["bench", "sm_mhz"], sort=False)[["time_s", "energy_j"]].median()
    names = tuple(dict.fromkeys(df["bench"]))
    mhz = np.sort(df["sm_mhz"].unique())
    full = pd.MultiIndex.from_product([names, mhz], names=["bench", "sm_mhz"])
    med = med.reindex(full)
    if med.isna().any().any():
        b, f = med[med.isna().any(axis=1)].index[0]
        raise ValueError(f"{where}: no measurement of {b} at {f} MHz (every benchmark needs every clock)")
    f0 = int(mhz[-1]) if default_mhz is None else int(default_mhz)
    if f0 not in set(mhz.tolist()):
        raise ValueError(f"{where}: default clock {f0} MHz was not calibrated")
    at0 = df[df["sm_mhz"] == f0].groupby("bench", sort=False)[list(features)].median().reindex(list(names))
    if at0.isna().any().any() and not at0.isna().all().all():  # all NaN: calibrated without counters
        b = at0[at0.isna().any(axis=1)].index[0]
        raise ValueError(f"{where}: {b} has no counter vector at the default clock {f0} MHz")
    counters = at0.to_numpy(np.float64)
    if (counters[np.isfinite(counters)] < 0).any():
        raise ValueError(f"{where}: negative counter values")
    shape = (len(names), len(mhz))
    t = med["time_s"].to_numpy(np.float64).reshape(shape)
    e = med["energy_j"].to_numpy(np.float64).reshape(shape)
    if smooth and repeats_differ(df):  # the curves carry noise (a noise-free table is the truth)
        t_s = smooth_curves(mhz, t, True)
        e, t = t_s * smooth_curves(mhz, e / t, False), t_s
    if clocks is not None:
        want = np.asarray(sorted(set(int(c) for c in clocks)), dtype=np.int64)
        want = np.union1d(want[(want >= mhz[0]) & (want <= mhz[-1])], mhz)
        if len(want) > len(mhz):
            t_new = interp_curves(mhz, t, want, True)
            e = t_new * interp_curves(mhz, e / t, want, False)
            t, mhz = t_new, want
    return BenchTables(names, mhz, int(np.searchsorted(mhz, f0)), t, e, counters, features)


def idle_power_w(tables: BenchTables, idle_bench: str = IDLE_BENCH) -> np.ndarray:
    """[C] P_idle(f): the idle microbenchmark's energy over its time."""
    if idle_bench not in tables.names:
        raise ValueError(f"bench: no {idle_bench!r} microbenchmark (needed for idle power)")
    j = tables.index(idle_bench)
    return tables.energy_j[j] / tables.time_s[j]


def idle_power(bench: pd.DataFrame, idle_bench: str = IDLE_BENCH) -> pd.Series:
    """P_idle per clock as a Series indexed by sm_mhz (W)."""
    t = bench_tables(bench)
    return pd.Series(idle_power_w(t, idle_bench), index=pd.Index(t.clocks, name="sm_mhz"), name="idle_power_w")


def same_work_groups(
    tables: BenchTables, rtol: float = 0.01, exclude: tuple[str, ...] = (IDLE_BENCH,)
) -> list[list[int]]:
    """Benchmarks that do the same work with a different launch (occupancy). When every benchmark is
    in microbench/registry.yaml: the same kernel with the same arguments. Otherwise (a custom suite):
    the same kernel-independent evidence, work counters equal within `rtol`; counters alone cannot
    tell apart units that share a counter (fp16 and int8 tensor instructions), so the registry wins."""
    from emo.microbench import load_registry  # reads files only

    reg = load_registry()
    if all(n in reg for n in tables.names):
        key: dict[tuple[Any, str], list[int]] = {}
        for j, n in enumerate(tables.names):
            if n not in exclude:
                e = reg[n]
                key.setdefault((e["kernel"], repr(e["args"])), []).append(j)
        return [g for g in key.values() if len(g) > 1]
    fs = tables.features
    w = tables.counters[:, [i for i, c in enumerate(fs) if fs.feature(c).role == "work"]]
    groups: list[list[int]] = []
    for j in range(len(tables.names)):
        if tables.names[j] in exclude or not w[j].any():
            continue
        for g in groups:
            ref = w[g[0]]
            if np.all(np.abs(w[j] - ref) <= rtol * np.maximum(np.abs(ref), np.abs(w[j])) + 1e-12):
                g.append(j)
                break
        else:
            groups.append([j])
    return [g for g in groups if len(g) > 1]


def running_power_w(tables: BenchTables, p_idle: np.ndarray, min_time_ratio: float = 1.05) -> np.ndarray:
    """[C] P_run(f): least-squares slope of dE against dT over same-work pairs (module docstring)."""
    d_e, d_t = [], []
    for g in same_work_groups(tables):
        ref = g[int(np.argmin(tables.time_s[g, tables.default_index]))]
        for j in g:
            if tables.time_s[j, tables.default_index] >= min_time_ratio * tables.time_s[ref, tables.default_index]:
                d_e.append(tables.energy_j[j] - tables.energy_j[ref])
                d_t.append(tables.time_s[j] - tables.time_s[ref])
    if not d_t:
        return p_idle.copy()
    de, dt = np.asarray(d_e), np.asarray(d_t)
    slope = (de * dt).sum(axis=0) / (dt * dt).sum(axis=0)
    return np.maximum(slope, p_idle)


# --------------------------------------------------------------------------- clock-request latency
LATENCY_QUANTILES = (10, 50, 90, 99)


def latency_summary(samples_ms: Sequence[float], pairs: Sequence[tuple[int, int]], poll_ms: float) -> dict:
    """The measured clock-request latency distribution as calibration.json stores it: quantiles
    p10/p50/p90/p99 (numpy's linear interpolation), mean, count, and every sample with its
    (from, to) clock pair; each sample is resolved to the clock-read period poll_ms."""
    x = np.asarray(samples_ms, dtype=np.float64)
    if len(x) == 0 or len(x) != len(pairs):
        raise ValueError(f"clock latency: {len(x)} samples for {len(pairs)} clock steps")
    if not np.all(np.isfinite(x) & (x >= 0)):
        raise ValueError("clock latency: samples must be finite and >= 0 ms")
    q = np.percentile(x, LATENCY_QUANTILES)
    return {
        **{f"p{k}": round(float(v), 4) for k, v in zip(LATENCY_QUANTILES, q)},
        "mean": round(float(x.mean()), 4),
        "n": int(len(x)),
        "poll_ms": float(poll_ms),
        "samples": [round(float(v), 4) for v in x],
        "pairs": [[int(a), int(b)] for a, b in pairs],
    }


def latency_line(lat: dict) -> str:
    """The distribution in one line (logs, `emo calibration`)."""
    return (
        f"clock-request latency over {lat['n']} steps (reads every {lat['poll_ms']:g} ms): "
        f"p10 {lat['p10']:.1f}, p50 {lat['p50']:.1f}, p90 {lat['p90']:.1f}, p99 {lat['p99']:.1f}, "
        f"mean {lat['mean']:.1f} ms"
    )
