"""Fit: per pack signature, time and energy at every SM clock from the microbenchmark calibration.

See `emo.model` for the equations. Inputs are plain tables: the calibration (`bench`, see
`emo.model.calibration`), each signature's counter vector (range profiler, one execution, default
clock) and its measured time at the default clock. Output: one row per signature x clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from emo.device import COUNTERS
from emo.model.calibration import IDLE_BENCH, TIME_COUNTERS, BenchTables, bench_tables, idle_power_w, running_power_w
from emo.model.nnls import peak_rates, solve_nnls
from emo.model.overlap import P_MAX, STRESS_RESOURCE, calibrate_p, time_curves

INTENSIVE = ("active_warps",)  # averages over the range (achieved occupancy), not totals
TIME_COUNTER_WEIGHT = 0.1  # weight of the average-matching equations of the time-like counters
OVERLAP_MODES = ("roofline", "sum")
MODEL_COLUMNS = (
    "signature",
    "sm_mhz",
    "time_s",
    "energy_j",
    "idle_energy_j",
    "dynamic_energy_j",
    "idle_power_w",
    "time_default_s",
    "default_mhz",
    "overlap_p",
    "fit_residual",
    "energy_level",
)
WEIGHT_PREFIX = "w_"


def bench_resources(names: Sequence[str], resources: Mapping[str, str] | None = None) -> list[str]:
    """The resource each benchmark occupies: from `resources` if given, else from the registry's
    first `stresses` entry (microbench/registry.yaml) through STRESS_RESOURCE."""
    if resources is None:
        from emo.microbench import load_registry  # reads files only; no device code

        reg = load_registry()
        unknown = [n for n in names if n not in reg]
        if unknown:
            raise ValueError(f"bench: {', '.join(unknown)} not in microbench/registry.yaml; pass resources= for them")
        resources = {n: STRESS_RESOURCE.get(reg[n]["stresses"][0], reg[n]["stresses"][0]) for n in names}
    missing = [n for n in names if n not in resources]
    if missing:
        raise ValueError(f"resources: no resource for {', '.join(missing)}")
    return [resources[n] for n in names]


def _signature_inputs(
    counters: pd.DataFrame, time_default, features=COUNTERS
) -> tuple[list[str], np.ndarray, np.ndarray]:
    df = counters.set_index("signature") if "signature" in counters.columns else counters
    missing = [c for c in features if c not in df.columns]
    if missing:
        raise ValueError(f"counters: missing columns {', '.join(missing)}")
    if df.index.has_duplicates:
        raise ValueError(f"counters: signature {df.index[df.index.duplicated()][0]!r} appears twice")
    t0 = (
        pd.Series(time_default, dtype=np.float64)
        if not isinstance(time_default, pd.Series)
        else time_default.astype(np.float64)
    )
    sigs = [str(s) for s in df.index]
    t0.index = t0.index.map(str)
    absent = [s for s in sigs if s not in t0.index]
    if absent:
        raise ValueError(f"time_default: no time for signature {absent[0]!r}")
    t = t0.reindex(sigs).to_numpy()
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(
            f"time_default: signature {sigs[int(np.argmin(np.where(np.isfinite(t), t, -1)))]!r} has a non-positive time"
        )
    c = df[list(features)].to_numpy(np.float64)
    partial = np.isnan(c).any(axis=1) & ~np.isnan(c).all(axis=1)  # all NaN: profiled without counters
    if partial.any() or np.isinf(c).any() or (c < 0).any():
        raise ValueError("counters: values must be finite and >= 0")
    return sigs, c, t


def _averages(cb: np.ndarray, tb0: np.ndarray, intensive: Sequence[str]) -> np.ndarray:
    """[J, len(TIME_COUNTERS)] the time-like counters as averages over each benchmark's run."""
    return np.stack(
        [cb[:, COUNTERS.index(n)] if n in intensive else cb[:, COUNTERS.index(n)] / tb0 for n in TIME_COUNTERS], axis=1
    )


def distinguishable(cb: np.ndarray, tb0: np.ndarray, intensive: Sequence[str], rtol: float = 1e-3) -> np.ndarray:
    """[J] bool: False for a benchmark the profiler cannot tell from an earlier one (work counters in
    the same proportions, same averages). E.g. Table II has one tensor-instruction counter, so int8
    (IMMA) and fp16 (HMMA) look alike: left both in, NNLS would pick between their different time and
    energy curves at random. The first in registry order (HMMA, what training runs) stands for both."""
    work = cb[:, [COUNTERS.index(c) for c in COUNTERS if c not in TIME_COUNTERS]]
    norm = np.linalg.norm(work, axis=1, keepdims=True)
    direction = np.where(norm > 0, work / np.where(norm > 0, norm, 1.0), 0.0)
    avg = _averages(cb, tb0, intensive)
    keep = np.ones(len(cb), dtype=bool)
    for j in range(len(cb)):
        for i in range(j):
            if (
                keep[i]
                and np.allclose(direction[j], direction[i], atol=rtol)
                and np.allclose(avg[j], avg[i], rtol=rtol, atol=1e-12)
            ):
                keep[j] = False
                break
    return keep


def _average_rows(
    cb: np.ndarray, tb0: np.ndarray, cs: np.ndarray, t0: np.ndarray, intensive: Sequence[str], weight: float
) -> np.ndarray:
    """[S, M, J] equations that make the mix's time-weighted average of each time-like counter
    (occupancy, fraction of SM cycles active) equal the signature's:
        sum_j x_j T_j(f0) (a_j - a_s) = 0,
    scaled to seconds by the suite's largest a. Totals would not do: busy times add up in the mix
    but overlap in the pack, so the pack shows fewer cycles than its work would take serially."""
    rows = []
    for name in TIME_COUNTERS:
        k = COUNTERS.index(name)
        a_b = cb[:, k] if name in intensive else cb[:, k] / tb0
        a_s = cs[:, k] if name in intensive else cs[:, k] / t0
        top = float(a_b.max())
        if top <= 0:
            continue
        rows.append(weight * tb0[None, :] * (a_b[None, :] - a_s[:, None]) / top)
    if not rows:
        return np.zeros((len(cs), 0, len(cb)))
    return np.stack(rows, axis=1)


@dataclass(frozen=True)
class Fit:
    """Everything `fit_signatures` computed, as arrays (S signatures, J basis benchmarks, C clocks)."""

    signatures: list[str]
    basis: list[str]
    clocks: np.ndarray
    default_index: int
    weights: np.ndarray  # [S, J]
    residual: np.ndarray  # [S]
    overlap_p: np.ndarray  # [S]
    time_s: np.ndarray  # [S, C]
    idle_energy_j: np.ndarray  # [S, C]
    dynamic_energy_j: np.ndarray  # [S, C]
    idle_power_w: np.ndarray  # [C]
    time_default_s: np.ndarray  # [S]


def fit_arrays(
    tables: BenchTables,
    sigs: list[str],
    counters: np.ndarray,
    t0: np.ndarray,
    *,
    overlap: str = "roofline",
    resources: Mapping[str, str] | None = None,
    intensive: Sequence[str] = INTENSIVE,
    time_counter_weight: float = TIME_COUNTER_WEIGHT,
    p_max: float = P_MAX,
    idle_bench: str = IDLE_BENCH,
) -> Fit:
    if overlap not in OVERLAP_MODES:
        raise ValueError(f"overlap: {overlap!r} is not one of {OVERLAP_MODES}")
    f0 = tables.default_index
    p_idle = idle_power_w(tables, idle_bench)
    p_run = running_power_w(tables, p_idle)
    basis = [j for j, n in enumerate(tables.names) if n != idle_bench]
    names = [tables.names[j] for j in basis]
    tb, eb = tables.time_s[basis], tables.energy_j[basis]
    x = np.zeros((len(sigs), len(basis)))
    resid = np.zeros(len(sigs))
    # A range profiled without counters (no profiler, no permission): every benchmark holds the same
    # share of its time, i.e. the suite's mean curve, the best the model can say knowing only its duration.
    unknown = np.isnan(counters).all(axis=1) if counters.shape[1] else np.ones(len(sigs), dtype=bool)
    if np.isnan(tables.counters).any():  # calibrated without counters: nothing to mix on
        unknown[:] = True
    x[unknown] = t0[unknown, None] / (len(basis) * tb[None, :, f0])
    resid[unknown] = np.nan
    known = ~unknown
    cb, cs, tk = tables.counters[basis], counters[known], t0[known]
    if known.any() and tuple(tables.features) == tuple(COUNTERS):  # EMO's own counter vector
        work_k = [i for i, c in enumerate(COUNTERS) if c not in TIME_COUNTERS]
        keep = distinguishable(cb, tb[:, f0], intensive)
        xk = np.zeros((known.sum(), len(basis)))
        xk[:, keep], resid[known] = solve_nnls(
            cb[keep][:, work_k],
            cs[:, work_k],
            peak_rates(cb[keep][:, work_k], tb[keep, f0]),
            zero_rows=_average_rows(cb[keep], tb[keep, f0], cs, tk, intensive, time_counter_weight),
        )
        x[known] = xk
    elif known.any():  # any other source's columns (DCGM ratios, ncu metrics): the model's feature inputs
        from emo.model.features import distinguishable as distinct
        from emo.model.features import mix, model_inputs

        wi_b, wi_s = model_inputs(cb, tb[:, f0], cs, tk, tables.features)
        keep = distinct(wi_b)
        xk = np.zeros((known.sum(), len(basis)))
        xk[:, keep] = mix(wi_b, wi_s, list(np.nonzero(keep)[0]), tb[:, f0], time_counter_weight)
        fitted = xk @ wi_b.work
        norm = np.linalg.norm(wi_s.work, axis=1)
        resid[known] = np.where(
            norm > 0, np.linalg.norm(fitted - wi_s.work, axis=1) / np.where(norm > 0, norm, 1.0), 0.0
        )
        x[known] = xk

    res = bench_resources(names, resources)
    kinds = sorted(set(res))
    onehot = np.array([[r == k for r in res] for k in kinds], dtype=np.float64)  # [R, J]
    busy = np.einsum("sj,rj,jc->src", x, onehot, tb)  # [S, R, C] resource busy time
    p = calibrate_p(busy[:, :, f0], t0, p_max) if overlap == "roofline" else np.ones(len(sigs))
    time = time_curves(busy, t0, f0, p)

    work = x @ np.maximum(eb - p_run * tb, 0.0)  # [S, C] energy of the operations and bytes
    dynamic = (p_run - p_idle) * time + work
    return Fit(sigs, names, tables.clocks, f0, x, resid, p, time, p_idle * time, dynamic, p_idle, t0)


def fit_table(fit: Fit, energy_level: np.ndarray | float = 1.0) -> pd.DataFrame:
    """The long table: one row per signature x clock (MODEL_COLUMNS + one w_<bench> per benchmark)."""
    s, c = len(fit.signatures), len(fit.clocks)
    level = np.broadcast_to(np.asarray(energy_level, dtype=np.float64), (s,))
    dyn = fit.dynamic_energy_j * level[:, None]
    out = pd.DataFrame(
        {
            "signature": np.repeat(np.asarray(fit.signatures, dtype=object), c),
            "sm_mhz": np.tile(fit.clocks.astype(np.int64), s),
            "time_s": fit.time_s.ravel(),
            "energy_j": (fit.idle_energy_j + dyn).ravel(),
            "idle_energy_j": fit.idle_energy_j.ravel(),
            "dynamic_energy_j": dyn.ravel(),
            "idle_power_w": np.tile(fit.idle_power_w, s),
            "time_default_s": np.repeat(fit.time_default_s, c),
            "default_mhz": np.int64(fit.clocks[fit.default_index]),
            "overlap_p": np.repeat(fit.overlap_p, c),
            "fit_residual": np.repeat(fit.residual, c),
            "energy_level": np.repeat(level, c),
        }
    )
    weights = pd.DataFrame(np.repeat(fit.weights, c, axis=0), columns=[WEIGHT_PREFIX + n for n in fit.basis])
    return pd.concat([out, weights], axis=1)


def fit_signatures(
    bench: pd.DataFrame,
    counters: pd.DataFrame,
    time_default,
    *,
    default_mhz: int | None = None,
    overlap: str = "roofline",
    resources: Mapping[str, str] | None = None,
    intensive: Sequence[str] = INTENSIVE,
    time_counter_weight: float = TIME_COUNTER_WEIGHT,
    p_max: float = P_MAX,
    idle_bench: str = IDLE_BENCH,
    clocks: Sequence[int] | None = None,
    smooth: bool = True,
) -> pd.DataFrame:
    """Predicted time and energy of every signature at every calibrated clock (and, with `clocks`,
    at every one of those between the lowest and highest calibrated clock, interpolated).

    bench: the calibration table; counters: one row per signature (index or `signature` column)
    with the COUNTERS columns; time_default: signature -> measured seconds at the default clock
    (Series or mapping). Energy is at level 1 until `calibrate_energy_level` sets it. `smooth`:
    the calibration's curves smoothed over the clocks (emo.model.calibration.smooth_curves; off
    only for noise-free tables, where the raw curves are the truth).
    """
    tables = bench_tables(bench, default_mhz, clocks=clocks, smooth=smooth)
    sigs, c, t0 = _signature_inputs(counters, time_default, tables.features)
    fit = fit_arrays(
        tables,
        sigs,
        c,
        t0,
        overlap=overlap,
        resources=resources,
        intensive=intensive,
        time_counter_weight=time_counter_weight,
        p_max=p_max,
        idle_bench=idle_bench,
    )
    return fit_table(fit)


def calibrate_energy_level(
    model: pd.DataFrame,
    occurrences,
    measured_energy_j: float,
    makespan_s: float,
    *,
    devices: int = 1,
    other_energy_j: float = 0.0,
) -> tuple[pd.DataFrame, float]:
    """Scale every signature's dynamic energy by one factor k so that one iteration at the default
    clock costs what was measured:

        E_measured = devices * P_idle(f0) * makespan + other + k * sum_s n_s * D_s(f0)

    occurrences: signature -> n_s, executions per iteration summed over all devices; makespan_s:
    the iteration's measured wall time; other_energy_j: measured or modelled energy of what is not
    packed (collectives, copies), above idle. Returns (the model with energy_level = k applied, k).
    Calling it again re-scales from level 1, so it is idempotent.
    """
    missing = [c for c in MODEL_COLUMNS if c not in model.columns]
    if missing:
        raise ValueError(f"model: missing columns {', '.join(missing)}")
    n = pd.Series(occurrences, dtype=np.float64)
    n.index = n.index.map(str)
    at0 = model[model["sm_mhz"] == model["default_mhz"]].set_index("signature")
    unknown = [s for s in n.index if s not in at0.index]
    if unknown:
        raise ValueError(f"occurrences: signature {unknown[0]!r} is not in the model")
    if (n < 0).any():
        raise ValueError("occurrences: counts must be >= 0")
    unit_dyn = at0["dynamic_energy_j"] / at0["energy_level"]  # back to level 1
    packed = float((unit_dyn.reindex(n.index) * n).sum())
    idle = devices * float(at0["idle_power_w"].iloc[0]) * makespan_s
    above = measured_energy_j - idle - other_energy_j
    if packed <= 0 or above <= 0:
        raise ValueError(
            f"energy calibration: measured {measured_energy_j:.4g} J leaves {above:.4g} J above idle "
            f"({idle:.4g} J) and other ({other_energy_j:.4g} J) for packs whose model says {packed:.4g} J"
        )
    k = above / packed
    out = model.copy()
    unit = out["dynamic_energy_j"] / out["energy_level"]
    out["dynamic_energy_j"] = unit * k
    out["energy_level"] = k
    out["energy_j"] = out["idle_energy_j"] + out["dynamic_energy_j"]
    return out, k


@dataclass(frozen=True)
class ModelArrays:
    """The fitted model as dense arrays for the what-if predictor (S signatures x C clocks)."""

    signatures: list[str]
    clocks: np.ndarray
    default_mhz: int
    time_s: np.ndarray
    dynamic_energy_j: np.ndarray
    idle_power_w: np.ndarray  # [C]

    def row(self, signature: str) -> int:
        return self.signatures.index(signature)

    def clock_index(self, sm_mhz) -> np.ndarray:
        """Index of the nearest calibrated clock at or below each requested clock (the lowest if none)."""
        idx = np.searchsorted(self.clocks, np.asarray(sm_mhz), side="right") - 1
        return np.clip(idx, 0, len(self.clocks) - 1)


def model_arrays(model: pd.DataFrame) -> ModelArrays:
    """Pivot the long model table to arrays (signatures in first-appearance order)."""
    sigs = list(dict.fromkeys(model["signature"].astype(str)))
    clocks = np.sort(model["sm_mhz"].unique()).astype(np.int64)
    t = model.pivot(index="signature", columns="sm_mhz", values="time_s").reindex(index=sigs, columns=clocks)
    d = model.pivot(index="signature", columns="sm_mhz", values="dynamic_energy_j").reindex(index=sigs, columns=clocks)
    if t.isna().any().any():
        raise ValueError("model: not every signature has every clock")
    idle = model.drop_duplicates("sm_mhz").set_index("sm_mhz")["idle_power_w"].reindex(clocks)
    return ModelArrays(sigs, clocks, int(model["default_mhz"].iloc[0]), t.to_numpy(), d.to_numpy(), idle.to_numpy())
