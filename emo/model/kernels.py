"""The open calibration interface: fit on any benchmark table, predict any kernel's time and energy.

Inputs are long tables, one row per (name, clock): `name`, `sm_mhz`, `time_s` (optional),
`energy_j` or `power_w`, and counter columns named as their source names them (DCGM field names,
ncu metric names, EMO's own; see emo.device.features). Each target's row at the reference clock
(default: the highest clock of the benchmarks) is its anchor: its time, energy and counters are
known; the model says how they change at every other clock.

The model (see docs/model.md):
  mix     x_s = argmin_{x>=0} |sum_j x_j w_j - w_s| over the work features (busy seconds at peak
          rate), with the presence features (SM active, occupancy) as time-weighted averages that
          the mix must match: sum_j x_j T_j(ref) (a_j - a_s) = 0;
  time    busy time per resource b_r(f) = sum_{j on r} x_j T_j(f) (a benchmark is on the resource of
          its largest work feature); T_s(f) = T_s(ref) N_p(b(f)) / N_p(b(ref)), p chosen so that
          N_p(b(ref)) = T_s(ref) where possible (emo.model.overlap);
  energy  E_s(f) = k_s [P_run(f) T_s(f) + sum_j x_j W_j(f)]: the power every running kernel pays over
          the predicted time plus the work energy of the mix, W_j = E_j - P_run T_j, one factor k_s
          per target set by the anchor (scaling the whole curve is less sensitive to noise in the
          idle power than scaling the dynamic part alone);
  power   (data without time) P_s(f) = P_idle(f) + k_s sum_j x_j (P_j(f) - P_idle(f)).
P_idle is the idle row's power where the table has one, else estimated (the intercept of benchmark
power against activity at each clock) and said so. P_run comes from explicit same-work pairs; with
none it is P_idle. Benchmark curves are interpolated between measured clocks (PCHIP; time in 1/f),
so a calibration at a clock subset predicts every clock in its range.

Two references are computed from the same inputs and scored alike: the mean curve (the benchmarks'
average normalised curve, the target ignored) and a plain anchored NNLS (the same features as plain
columns, each benchmark's curve mixed by its weight).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from emo.device.features import FeatureSet, resolve_columns
from emo.model.calibration import interp_curves
from emo.model.features import UNATTRIBUTED, mix, model_inputs, spread_duplicates
from emo.model.nnls import solve_nnls
from emo.model.overlap import P_MAX, calibrate_p, time_curves

KEY_COLUMNS = ("name", "sm_mhz")
VALUE_COLUMNS = ("time_s", "energy_j", "power_w")
RESERVED = {*KEY_COLUMNS, *VALUE_COLUMNS, "mem_mhz", "repeat", "bench", "signature"}
PRESENCE_WEIGHT = 0.1  # weight of the average-matching rows (as in emo.model.fit)
QUANTITIES = ("time_s", "energy_j", "power_w")


@dataclass(frozen=True)
class Curves:
    """A long table pivoted: N names x C clocks (NaN where a name was not measured)."""

    names: list[str]
    clocks: np.ndarray  # [C] ascending
    time_s: np.ndarray | None  # [N, C]
    energy_j: np.ndarray | None
    power_w: np.ndarray  # [N, C]
    counters: np.ndarray  # [N, C, K] per clock, columns of `features` (read at the reference clock)
    features: FeatureSet


def curves_from_table(df: pd.DataFrame, where: str, *, features: FeatureSet | None = None,
                      counters: str | None = None) -> tuple[Curves, list[str]]:
    """Validate a long table and pivot it (median over repeated rows). Counters are read later, at
    the reference clock. Returns the curves and notes on the counter columns."""
    if "name" not in df.columns and "bench" in df.columns:
        df = df.rename(columns={"bench": "name"})
    missing = [c for c in KEY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: missing column {missing[0]} (want name, sm_mhz, time_s, energy_j or power_w, counters)")
    if "energy_j" not in df.columns and "power_w" not in df.columns:
        raise ValueError(f"{where}: needs an energy_j or a power_w column")
    if "energy_j" in df.columns and "time_s" not in df.columns and "power_w" not in df.columns:
        raise ValueError(f"{where}: energy_j without time_s says nothing about power; add time_s or power_w")
    if df.empty:
        raise ValueError(f"{where}: no rows")
    notes: list[str] = []
    if features is None:
        cand = [c for c in df.columns if c not in RESERVED and pd.api.types.is_numeric_dtype(df[c])]
        features, notes = resolve_columns(cand, counters)
    absent = [c for c in features if c not in df.columns]
    if absent:
        raise ValueError(f"{where}: missing counter column {absent[0]} (the benchmarks have it)")
    df = df.assign(name=df["name"].astype(str), sm_mhz=pd.to_numeric(df["sm_mhz"], errors="coerce"))
    if df["sm_mhz"].isna().any() or (df["sm_mhz"] <= 0).any():
        raise ValueError(f"{where}: sm_mhz must be a positive number on every row")
    df["sm_mhz"] = df["sm_mhz"].round().astype(np.int64)
    vals = [c for c in VALUE_COLUMNS if c in df.columns]
    for c in vals:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = df[~(v > 0)]
        if len(bad):
            r = bad.iloc[0]
            raise ValueError(f"{where}: {r['name']} at {r['sm_mhz']} MHz has {c}={r[c]} (must be > 0)")
    neg = [c for c in features if (pd.to_numeric(df[c], errors="coerce") < 0).any()]
    if neg:
        raise ValueError(f"{where}: counter column {neg[0]} has negative values")
    med = df.groupby(["name", "sm_mhz"], sort=False)[vals + list(features)].median()
    names = list(dict.fromkeys(df["name"]))
    clocks = np.sort(df["sm_mhz"].unique())
    full = med.reindex(pd.MultiIndex.from_product([names, clocks]))
    grid = lambda c: full[c].to_numpy(np.float64).reshape(len(names), len(clocks))  # noqa: E731
    t = grid("time_s") if "time_s" in vals else None
    e = grid("energy_j") if "energy_j" in vals else None
    p = grid("power_w") if "power_w" in vals else e / t
    if e is None and t is not None:
        e = p * t
    c = np.stack([grid(k) for k in features], axis=2) if len(features) else np.zeros((len(names), len(clocks), 0))
    return Curves(names, clocks, t, e, p, c, features), notes  # counters [N, C, K] until anchored


@dataclass
class Result:
    """Predictions of one fit: a long table per method, scores, and what the fit assumed."""

    predictions: pd.DataFrame  # name, sm_mhz, anchor, measured_*, and <method>_<quantity> columns
    scores: dict[str, dict[str, float | None]]  # method -> mape_<quantity>_pct
    reference_mhz: int
    features: list[str]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        emo = self.scores["emo"]
        out = {"reference_mhz": self.reference_mhz, "features": self.features, "notes": self.notes,
               **emo, "mean_curve": self.scores["mean_curve"], "nnls": self.scores["nnls"]}
        recs = self.predictions.replace({np.nan: None}).to_dict(orient="records")
        out["predictions"] = recs
        return out


def _idle(bench: Curves, idle: str | None) -> tuple[np.ndarray, int | None]:
    """[C] idle power and the idle row's index; without one, the benchmarks' lowest power per clock."""
    names_l = [n.lower() for n in bench.names]
    if idle is not None and idle not in bench.names:
        raise ValueError(f"bench: idle benchmark {idle!r} is not in the table")
    j = bench.names.index(idle) if idle is not None else (names_l.index("idle") if "idle" in names_l else None)
    if j is not None:
        return bench.power_w[j].copy(), j
    # No idle row: the lower envelope of the benchmarks' power (scaled by _idle_scale).
    return np.nanmin(bench.power_w, axis=0), None


def _running_power(bench: Curves, pairs, p_idle: np.ndarray) -> np.ndarray:
    """[C] P_run: least-squares slope of dE against dT over the same-work pairs (emo.model.calibration)."""
    if not pairs or bench.time_s is None:
        return p_idle.copy()
    de, dt = [], []
    for a, b in pairs:
        for n in (a, b):
            if n not in bench.names:
                raise ValueError(f"pairs: {n!r} is not a benchmark")
        i, j = bench.names.index(a), bench.names.index(b)
        de.append(bench.energy_j[i] - bench.energy_j[j])
        dt.append(bench.time_s[i] - bench.time_s[j])
    de, dt = np.asarray(de), np.asarray(dt)
    return np.maximum((de * dt).sum(axis=0) / np.maximum((dt * dt).sum(axis=0), 1e-300), p_idle)


def denoise(clocks: np.ndarray, values: np.ndarray, inverse: bool, degree: int = 3) -> np.ndarray:
    """[N, C] each benchmark's curve, replaced by its least-squares cubic (in 1/f for time) where that
    predicts its interior clocks, each left out in turn, better than interpolating its neighbours:
    i.e. where the curve's measurement noise, not its shape, decides. Noise-free curves stay as
    measured."""
    x = 1.0 / clocks if inverse else clocks.astype(float)
    x = (x - x.min()) / (x.max() - x.min())
    n = len(x)
    if n < degree + 3:
        return values
    from scipy.interpolate import PchipInterpolator

    order = np.argsort(x)
    x, values = x[order], values[:, order]
    out = values.copy()
    for j, v in enumerate(values):
        e_int = e_poly = 0.0
        for i in range(1, n - 1):
            keep = np.arange(n) != i
            e_int += abs(PchipInterpolator(x[keep], v[keep])(x[i]) - v[i]) / v[i]
            c = np.polyfit(x[keep], v[keep], degree)
            e_poly += abs(np.polyval(c, x[i]) - v[i]) / v[i]
        if e_poly < e_int:  # measurement noise, not shape, dominates this curve
            out[j] = np.polyval(np.polyfit(x, v, degree), x)
    back = np.empty_like(out)
    back[:, order] = out
    return back


def _resource(fs: FeatureSet, column: str) -> str:
    return "sm" if column == UNATTRIBUTED else fs.feature(column).resource


def _mape(pred: np.ndarray, true: np.ndarray, mask: np.ndarray) -> float | None:
    m = mask & np.isfinite(true) & np.isfinite(pred)
    return float(100.0 * np.mean(np.abs(pred[m] - true[m]) / true[m])) if m.any() else None


def _times(x, tb, res: list[str], ts_ref, r: int, overlap: str, p_max: float) -> np.ndarray:
    """[S, C] anchored time: the p-norm of per-resource busy times (emo.model.overlap)."""
    kinds = sorted(set(res))
    onehot = np.array([[q == k for q in res] for k in kinds], dtype=np.float64)
    busy = np.einsum("sj,rj,jc->src", x, onehot, tb)
    p = calibrate_p(busy[:, :, r], ts_ref, p_max) if overlap == "roofline" else np.ones(len(ts_ref))
    return time_curves(busy, ts_ref, r, p)


def _energies(x, t_s, tb, eb, p_idle, p_run, es_ref, r: int) -> np.ndarray:
    """[S, C] anchored energy: the model's energy, idle power over the predicted time plus the
    dynamic energy of the mix, E(f) = P_idle T_s + (P_run - P_idle) T_s + sum_j x_j W_j, scaled to
    the anchor (one factor per target: the level is measured, the model says how it changes)."""
    work_e = np.maximum(eb - p_run[None, :] * tb, 0.0)
    m = p_run[None, :] * t_s + x @ work_e
    ok = m[:, r] > 0
    return np.where(ok[:, None], es_ref[:, None] * m / np.where(ok, m[:, r], 1.0)[:, None],
                    es_ref[:, None] * t_s / t_s[:, r:r + 1])


def _powers(x, pb, p_idle, ps_ref, r: int) -> np.ndarray:
    """[S, C] anchored power (data without time): idle plus k_s x the mix's power above idle."""
    dyn = x @ (pb - p_idle[None, :])
    ok = dyn[:, r] > 0
    k = np.where(ok, (ps_ref - p_idle[r]) / np.where(ok, dyn[:, r], 1.0), 0.0)
    p = p_idle[None, :] + np.maximum(k, 0.0)[:, None] * dyn
    flat = ~ok | (k <= 0)
    p[flat] = ps_ref[flat, None] * (p_idle / p_idle[r] if p_idle[r] > 0 else np.ones_like(p_idle))[None, :]
    return p


IDLE_SCALES = np.linspace(0.0, 1.0, 11)


def _idle_scale(wi_b, tb, eb, pb, envelope, res, r, overlap, p_max, notes) -> float:
    """Without an idle row: the share s of the benchmarks' lower power envelope that is idle power,
    chosen so that each benchmark, predicted from the others, is predicted best (energy or power)."""
    n = len(wi_b.work)
    errs = np.zeros(len(IDLE_SCALES))
    for j in range(n):
        basis = [i for i in range(n) if i != j]
        one = lambda a: type(wi_b)(a.work[[j]], a.presence[[j]], a.work_columns, a.presence_columns)  # noqa: E731
        x = spread_duplicates(mix(wi_b, one(wi_b), basis, tb[:, r] if tb is not None else None, PRESENCE_WEIGHT),
                              wi_b, basis)
        if not x.any():
            continue
        if tb is not None:
            t = _times(x, tb[basis], [res[i] for i in basis], tb[[j], r], r, overlap, p_max)
        for k, sc in enumerate(IDLE_SCALES):
            if tb is not None:
                e = _energies(x, t, tb[basis], eb[basis], sc * envelope, sc * envelope, eb[[j], r], r)
                errs[k] += np.mean(np.abs(e[0] - eb[j]) / eb[j])
            else:
                p = _powers(x, pb[basis], sc * envelope, pb[[j], r], r)
                errs[k] += np.mean(np.abs(p[0] - pb[j]) / pb[j])
    best = float(IDLE_SCALES[int(np.argmin(errs))])
    notes.append(f"no idle row: idle power taken as {best:.1f} x the benchmarks' lowest power at each clock "
                 f"({best * envelope[r]:.1f} W at the reference clock), the share that predicts each benchmark "
                 "from the others best")
    return best


def fit_predict(bench: pd.DataFrame, targets: pd.DataFrame, *, counters: str | None = None,
                ref_mhz: int | None = None, idle: str | None = None,
                pairs: Sequence[tuple[str, str]] | None = None, overlap: str = "roofline",
                p_max: float = P_MAX, scale_idle: bool = True) -> Result:
    """Fit on `bench`, predict every target at its measured clocks and the benchmarks' clocks.

    counters: "dcgm", "ncu", "emo", "gpupowermodel" to read only that source's columns (None: every
    known name); ref_mhz: the anchor clock (default the highest benchmark clock); idle: the name of
    the idle row (default a row named "idle", else estimated); pairs: same-work benchmark pairs
    (none: P_run = P_idle); overlap: "roofline" (p-norm, p per target) or "sum".
    """
    if overlap not in ("roofline", "sum"):
        raise ValueError(f"overlap: {overlap!r} is not one of roofline, sum")
    b, notes = curves_from_table(bench, "bench", counters=counters)
    s, _ = curves_from_table(targets, "targets", features=b.features)
    fs = b.features
    if not len(fs):
        notes.append("no counter columns: every target gets the mean curve")
    f_ref = int(b.clocks[-1]) if ref_mhz is None else int(ref_mhz)
    if f_ref not in b.clocks:
        raise ValueError(f"ref-mhz: {f_ref} MHz is not a benchmark clock ({b.clocks[0]}-{b.clocks[-1]})")
    gaps = np.isnan(b.power_w).any(axis=1)
    if gaps.any():
        j = int(np.argmax(gaps))
        f = b.clocks[np.isnan(b.power_w[j])][0]
        raise ValueError(f"bench: no measurement of {b.names[j]} at {f} MHz (every benchmark needs every benchmark clock)")
    if (b.time_s is None) != (s.time_s is None):
        raise ValueError("bench and targets: one has time_s and the other not")
    ib, is_ = int(np.searchsorted(b.clocks, f_ref)), np.searchsorted(s.clocks, f_ref)
    if is_ >= len(s.clocks) or s.clocks[is_] != f_ref or np.isnan(s.power_w[:, is_]).any():
        miss = s.names[0] if is_ >= len(s.clocks) or s.clocks[is_] != f_ref else s.names[int(np.argmax(np.isnan(s.power_w[:, is_])))]
        raise ValueError(f"targets: {miss} has no row at the reference clock {f_ref} MHz (its anchor)")
    out_of = (s.clocks < b.clocks[0]) | (s.clocks > b.clocks[-1])
    if out_of.any():  # the benchmarks' curves are interpolated, never extrapolated
        notes.append(f"target rows at {', '.join(map(str, s.clocks[out_of]))} MHz lie outside the benchmarks' clocks "
                     f"{b.clocks[0]}-{b.clocks[-1]} MHz: not predicted")
        keep = ~out_of
        s = Curves(s.names, s.clocks[keep], None if s.time_s is None else s.time_s[:, keep],
                   None if s.energy_j is None else s.energy_j[:, keep], s.power_w[:, keep], s.counters[:, keep], s.features)
        is_ = int(np.searchsorted(s.clocks, f_ref))
    cb, cs = b.counters[:, ib, :], s.counters[:, is_, :]
    if np.isnan(cb).any():
        raise ValueError(f"bench: {b.names[int(np.argmax(np.isnan(cb).any(axis=1)))]} has no counters at {f_ref} MHz")
    if np.isnan(cs).any():
        raise ValueError(f"targets: {s.names[int(np.argmax(np.isnan(cs).any(axis=1)))]} has no counters at {f_ref} MHz")

    clocks = np.union1d(b.clocks, s.clocks)  # where every curve is evaluated
    r = int(np.searchsorted(clocks, f_ref))
    has_t = b.time_s is not None
    # every method sees the same benchmark curves, denoised where the data say so
    bt = denoise(b.clocks, b.time_s, True) if has_t else None
    bp = denoise(b.clocks, b.power_w, False)
    tb = interp_curves(b.clocks, bt, clocks, True) if has_t else None
    pb = interp_curves(b.clocks, bp, clocks, False)
    eb = pb * tb if has_t else None
    tb_ref = tb[:, r] if has_t else None
    ts_ref = s.time_s[:, is_] if has_t else None
    ps_ref = s.power_w[:, is_]
    wi_b, wi_s = model_inputs(cb, tb_ref, cs, ts_ref, fs)
    p_idle_b, j_idle = _idle(b, idle)
    p_idle = interp_curves(b.clocks, p_idle_b[None, :], clocks, False)[0]

    res = [_resource(fs, wi_b.work_columns[int(np.argmax(wi_b.work[j]))]) if wi_b.work.shape[1] else "sm"
           for j in range(len(b.names))]
    if j_idle is None and scale_idle:  # no idle row: how much of the envelope is idle, by leave-one-out
        p_idle = p_idle * _idle_scale(wi_b, tb, eb, pb, p_idle, res, r, overlap, p_max, notes)
    basis = [j for j in range(len(b.names)) if j != j_idle]
    p_run = _running_power(b, pairs, p_idle_b if j_idle is not None else p_idle[np.searchsorted(clocks, b.clocks)])
    p_run = np.maximum(interp_curves(b.clocks, p_run[None, :], clocks, False)[0], p_idle)

    x = spread_duplicates(mix(wi_b, wi_s, basis, tb_ref, PRESENCE_WEIGHT), wi_b, basis)
    mixed = x.sum(axis=1) > 0
    if (~mixed).any():
        notes.append(f"{int((~mixed).sum())} target(s) have no work any benchmark does: mean curve for them")

    n_s, n_c = len(s.names), len(clocks)
    mean_t = (tb[basis] / tb[basis, r:r + 1]).mean(axis=0) if has_t else None
    mean_p = (pb[basis] / pb[basis, r:r + 1]).mean(axis=0)
    pred: dict[str, dict[str, np.ndarray]] = {"emo": {}, "mean_curve": {}, "nnls": {}}
    if has_t:
        t_emo = _times(x, tb[basis], [res[j] for j in basis], ts_ref, r, overlap, p_max)
        t_emo[~mixed] = ts_ref[~mixed, None] * mean_t[None, :]
        es_ref = s.energy_j[:, is_]
        e_emo = _energies(x, t_emo, tb[basis], eb[basis], p_idle, p_run, es_ref, r)
        mean_e = (eb[basis] / eb[basis, r:r + 1]).mean(axis=0)
        e_emo[~mixed] = es_ref[~mixed, None] * mean_e[None, :]
        pred["emo"] = {"time_s": t_emo, "energy_j": e_emo, "power_w": e_emo / t_emo}
        pred["mean_curve"]["time_s"] = ts_ref[:, None] * mean_t[None, :]
        pred["mean_curve"]["energy_j"] = es_ref[:, None] * mean_e[None, :]
        pred["mean_curve"]["power_w"] = pred["mean_curve"]["energy_j"] / pred["mean_curve"]["time_s"]
    else:
        p_emo = _powers(x, pb[basis], p_idle, ps_ref, r)
        p_emo[~mixed] = ps_ref[~mixed, None] * mean_p[None, :]
        pred["emo"]["power_w"] = p_emo
        pred["mean_curve"]["power_w"] = ps_ref[:, None] * mean_p[None, :]

    # Plain anchored NNLS: every column as it comes, scaled by its largest benchmark value.
    raw_b, raw_s = cb[basis], cs
    top = raw_b.max(axis=0) if raw_b.size else np.zeros(0)
    if raw_b.shape[1] and (top > 0).any():
        xn, _ = solve_nnls(raw_b, raw_s, np.where(top > 0, top, 0.0))
    else:
        xn = np.zeros((n_s, len(basis)))
    plain = xn.sum(axis=1) > 0

    def mixed_shape(curves: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        m = xn @ curves
        return np.where(plain[:, None], m / np.where(plain, m[:, r], 1.0)[:, None], fallback[None, :])

    if has_t:
        pred["nnls"]["time_s"] = ts_ref[:, None] * mixed_shape(tb[basis], mean_t)
        pred["nnls"]["energy_j"] = s.energy_j[:, is_][:, None] * mixed_shape(eb[basis], (mean_t * mean_p) / (mean_t * mean_p)[r])
        pred["nnls"]["power_w"] = pred["nnls"]["energy_j"] / pred["nnls"]["time_s"]
    else:
        pred["nnls"]["power_w"] = ps_ref[:, None] * mixed_shape(pb[basis], mean_p)

    # Measured values on the same grid, and the scores (every measured row but the anchor).
    idx = np.searchsorted(clocks, s.clocks)
    measured = {}
    for q in QUANTITIES:
        src = {"time_s": s.time_s, "energy_j": s.energy_j, "power_w": s.power_w}[q]
        grid = np.full((n_s, n_c), np.nan)
        if src is not None:
            grid[:, idx] = src
        measured[q] = grid
    score_mask = np.ones((n_s, n_c), dtype=bool)
    score_mask[:, r] = False
    scores = {m: {f"mape_{q.split('_')[0]}_pct": (_mape(v[q], measured[q], score_mask) if q in v else None)
                  for q in QUANTITIES} for m, v in pred.items()}

    table = {"name": np.repeat(np.asarray(s.names, dtype=object), n_c), "sm_mhz": np.tile(clocks, n_s),
             "anchor": np.tile(clocks == f_ref, n_s)}
    for q in QUANTITIES:
        if np.isfinite(measured[q]).any():
            table[f"measured_{q}"] = measured[q].ravel()
    for m, v in pred.items():
        for q, a in v.items():
            table[f"{m}_{q}"] = a.ravel()
    used = [c for c in wi_b.work_columns if c != UNATTRIBUTED] + list(wi_b.presence_columns)
    unused = [c for c in fs if c not in used]
    if unused:
        notes.append(f"counter columns no benchmark exercises (zero everywhere): {', '.join(unused)}")
    if j_idle is not None:
        notes.append(f"idle power from the row {b.names[j_idle]!r}")
    return Result(pd.DataFrame(table), scores, f_ref, used, notes)
