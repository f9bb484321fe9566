"""The open calibration interface: fit on any benchmark table, predict any kernel's time and energy.

Inputs are long tables, one row per (name, clock): `name`, `sm_mhz`, `time_s` (optional),
`energy_j` or `power_w`, and feature columns: counters named as their source names them (DCGM
field names, ncu metric names, EMO's own; see emo.device.features) or any numeric column the user
names (emo.model.columns: instruction mixes, nvprof metrics, a static analysis's counts). Each
target's row at the reference clock (default: the highest clock of the benchmarks) is its anchor:
its time, energy and features are known; the model says how they change at every other clock.

The model (see docs/model.md and emo.model.shapes for its forms):
  mix     x_s = argmin_{x>=0} |sum_j x_j w_j - w_s| over the work features (busy seconds at peak
          rate), with the presence features (SM active, occupancy) as time-weighted averages that
          the mix must match: sum_j x_j T_j(ref) (a_j - a_s) = 0;
  time    busy time per resource b_r(f) = sum_{j on r} x_j T_j(f) (a benchmark is on the resource of
          its largest work feature); T_s(f) = T_s(ref) N_p(b(f)) / N_p(b(ref)), p chosen so that
          N_p(b(ref)) = T_s(ref) where possible (emo.model.overlap);
  energy  E_s(f) = P_run(f) T_s(f) + k_s sum_j x_j W_j(f): the power every running kernel pays over
          the predicted time, the same board power for every kernel, plus the work energy of the
          mix, W_j = E_j - P_run T_j, whose level k_s the anchor sets (with idle power estimated, not
          measured: k_s on the whole curve, E_s = k_s (P_run T_s + sum_j x_j W_j));
  power   (data without time) P_s(f) = P_idle(f) + k_s sum_j x_j (P_j(f) - P_idle(f)).
P_idle is the idle row's power where the table has one, else a share of the benchmarks' lowest
power at each clock, chosen by leaving each benchmark out in turn, and said so. P_run comes from explicit same-work pairs; with none it is P_idle. Benchmark curves are
interpolated between measured clocks (PCHIP; time in 1/f), so a calibration at a clock subset
predicts every clock in its range. `select=True` chooses the form by cross-validation on the
benchmarks (emo.model.select).

Two references are computed from the same inputs and scored alike: the mean curve (the benchmarks'
average normalised curve, the target ignored) and a plain anchored NNLS (the same features as plain
columns, each benchmark's curve mixed by its weight).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from emo.device.features import FeatureSet
from emo.model.calibration import interp_curves
from emo.model.columns import choose_features, feature_warnings, is_static, normalisation
from emo.model.features import UNATTRIBUTED, Inputs, model_inputs
from emo.model.nnls import solve_nnls
from emo.model.overlap import P_MAX
from emo.model.select import choose_form, choose_idle, forms
from emo.model.shapes import ANCHORS, OVERLAPS, Anchors, Basis, Form, mean_shapes, predict

KEY_COLUMNS = ("name", "sm_mhz")
VALUE_COLUMNS = ("time_s", "energy_j", "power_w")
RESERVED = {*KEY_COLUMNS, *VALUE_COLUMNS, "mem_mhz", "repeat", "bench", "signature"}
QUANTITIES = ("time_s", "energy_j", "power_w")
IDLE_SCALES = np.linspace(0.0, 1.0, 11)  # candidate shares of the lowest benchmark power that are idle


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


def _named(df: pd.DataFrame) -> pd.DataFrame:
    return df.rename(columns={"bench": "name"}) if "name" not in df.columns and "bench" in df.columns else df


def _check_columns(df: pd.DataFrame, where: str, features: FeatureSet) -> None:
    """The columns a table of curves needs, and rows at all."""
    missing = [c for c in KEY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{where}: missing column {missing[0]} (want name, sm_mhz, time_s, energy_j or power_w, counters)"
        )
    if "energy_j" not in df.columns and "power_w" not in df.columns:
        raise ValueError(f"{where}: needs an energy_j or a power_w column")
    if "energy_j" in df.columns and "time_s" not in df.columns and "power_w" not in df.columns:
        raise ValueError(f"{where}: energy_j without time_s says nothing about power; add time_s or power_w")
    if df.empty:
        raise ValueError(f"{where}: no rows")
    absent = [c for c in features if c not in df.columns]
    if absent:
        raise ValueError(f"{where}: missing counter column {absent[0]} (the benchmarks have it)")


def _clean_values(df: pd.DataFrame, where: str, features: FeatureSet) -> tuple[pd.DataFrame, list[str]]:
    """Names as text, clocks as whole MHz, measured values > 0, counters numbers >= 0 (a static
    counter given on some rows fills the others). Returns the table and its value columns."""
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
    for c in features:  # a value that is not a number (NaN stays: not measured)
        v = pd.to_numeric(df[c], errors="coerce")
        bad = v.isna() & df[c].notna()
        if bad.any():
            r = df[bad].iloc[0]
            raise ValueError(f"{where}: {r['name']} at {r['sm_mhz']} MHz has {c}={r[c]!r} (want a number)")
        df[c] = v
    neg = [c for c in features if (df[c] < 0).any()]
    if neg:
        raise ValueError(f"{where}: counter column {neg[0]} has negative values")
    for c in features:
        if df[c].isna().any() and is_static(df, c):
            df[c] = df[c].fillna(df.groupby("name")[c].transform("median"))
    return df, vals


def _pivot(df: pd.DataFrame, vals: list[str], features: FeatureSet) -> Curves:
    """Name x clock grids (median over repeated rows), energy or power derived from the other."""
    med = df.groupby(["name", "sm_mhz"], sort=False)[vals + list(features)].median()
    names = list(dict.fromkeys(df["name"]))
    clocks = np.sort(df["sm_mhz"].unique())
    full = med.reindex(pd.MultiIndex.from_product([names, clocks]))
    grid = lambda c: full[c].to_numpy(np.float64).reshape(len(names), len(clocks))  # noqa: E731
    t = grid("time_s") if "time_s" in vals else None
    e = grid("energy_j") if "energy_j" in vals else None
    if "power_w" in vals:
        p = grid("power_w")
    else:
        assert e is not None and t is not None  # _check_columns: without power_w, both energy_j and time_s
        p = e / t
    if e is None and t is not None:
        e = p * t
    c = np.stack([grid(k) for k in features], axis=2) if len(features) else np.zeros((len(names), len(clocks), 0))
    return Curves(names, clocks, t, e, p, c, features)


def curves_from_table(df: pd.DataFrame, where: str, features: FeatureSet) -> Curves:
    """Validate a long table and pivot it (median over repeated rows). Features are read later, at
    the reference clock; a static feature (one value per name) given on some rows only fills the
    others."""
    df = _named(df)
    _check_columns(df, where, features)
    df, vals = _clean_values(df, where, features)
    return _pivot(df, vals, features)


@dataclass
class Result:
    """Predictions of one fit: a long table per method, scores, and what the fit assumed."""

    predictions: pd.DataFrame  # name, sm_mhz, anchor, measured_*, and <method>_<quantity> columns
    scores: dict[str, dict[str, float | None]]  # method -> mape_<quantity>_pct
    reference_mhz: int
    features: list[str]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what looks wrong in the user's feature columns
    normalisation: dict[str, str] = field(default_factory=dict)  # feature -> how it was read and scaled
    form: dict = field(default_factory=dict)  # the model form used (emo.model.shapes.Form)
    selection: dict[str, float] | None = None  # form -> held-out error % on the benchmarks, when selected

    def to_json(self) -> dict:
        emo = self.scores["emo"]
        out = {
            "reference_mhz": self.reference_mhz,
            "features": self.features,
            "notes": self.notes,
            "warnings": self.warnings,
            "normalisation": self.normalisation,
            "form": self.form,
            "selection": self.selection,
            **emo,
            "mean_curve": self.scores["mean_curve"],
            "nnls": self.scores["nnls"],
        }
        recs = self.predictions.replace({np.nan: None}).to_dict(orient="records")
        out["predictions"] = recs
        return out


def _idle(bench: Curves, idle: str | None) -> tuple[np.ndarray | None, int | None]:
    """[C] the idle row's power and its index; (None, None) without one."""
    names_l = [n.lower() for n in bench.names]
    if idle is not None and idle not in bench.names:
        raise ValueError(f"bench: idle benchmark {idle!r} is not in the table")
    j = bench.names.index(idle) if idle is not None else (names_l.index("idle") if "idle" in names_l else None)
    return (bench.power_w[j].copy(), j) if j is not None else (None, None)


def _running_power(bench: Curves, pairs, p_idle: np.ndarray) -> np.ndarray:
    """[C] P_run: least-squares slope of dE against dT over the same-work pairs (emo.model.calibration)."""
    if not pairs or bench.time_s is None:
        return p_idle.copy()
    assert bench.energy_j is not None  # curves with time have energy (_pivot)
    de, dt = [], []
    for a, b in pairs:
        for n in (a, b):
            if n not in bench.names:
                raise ValueError(f"pairs: {n!r} is not a benchmark")
        i, j = bench.names.index(a), bench.names.index(b)
        de.append(bench.energy_j[i] - bench.energy_j[j])
        dt.append(bench.time_s[i] - bench.time_s[j])
    de_a, dt_a = np.asarray(de), np.asarray(dt)
    return np.maximum((de_a * dt_a).sum(axis=0) / np.maximum((dt_a * dt_a).sum(axis=0), 1e-300), p_idle)


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


def _check_reference(b: Curves, s: Curves, f_ref: int) -> None:
    if f_ref not in b.clocks:
        raise ValueError(f"ref-mhz: {f_ref} MHz is not a benchmark clock ({b.clocks[0]}-{b.clocks[-1]})")
    gaps = np.isnan(b.power_w).any(axis=1)
    if gaps.any():
        j = int(np.argmax(gaps))
        f = b.clocks[np.isnan(b.power_w[j])][0]
        raise ValueError(
            f"bench: no measurement of {b.names[j]} at {f} MHz (every benchmark needs every benchmark clock)"
        )
    if (b.time_s is None) != (s.time_s is None):
        raise ValueError("bench and targets: one has time_s and the other not")
    i = np.searchsorted(s.clocks, f_ref)
    if i >= len(s.clocks) or s.clocks[i] != f_ref or np.isnan(s.power_w[:, i]).any():
        miss = (
            s.names[0]
            if i >= len(s.clocks) or s.clocks[i] != f_ref
            else s.names[int(np.argmax(np.isnan(s.power_w[:, i])))]
        )
        raise ValueError(f"targets: {miss} has no row at the reference clock {f_ref} MHz (its anchor)")


def _within(s: Curves, b: Curves, notes: list[str]) -> Curves:
    """The targets' rows inside the benchmarks' clock range (curves are never extrapolated)."""
    out_of = (s.clocks < b.clocks[0]) | (s.clocks > b.clocks[-1])
    if not out_of.any():
        return s
    notes.append(
        f"target rows at {', '.join(map(str, s.clocks[out_of]))} MHz lie outside the benchmarks' clocks "
        f"{b.clocks[0]}-{b.clocks[-1]} MHz: not predicted"
    )
    k = ~out_of
    cut = lambda a: None if a is None else a[:, k]  # noqa: E731
    return Curves(s.names, s.clocks[k], cut(s.time_s), cut(s.energy_j), s.power_w[:, k], s.counters[:, k], s.features)


def _at_reference(c: Curves, i: int, where: str) -> np.ndarray:
    v = c.counters[:, i, :]
    if np.isnan(v).any():
        raise ValueError(
            f"{where}: {c.names[int(np.argmax(np.isnan(v).any(axis=1)))]} has no counters at {c.clocks[i]} MHz"
        )
    return v


@dataclass(frozen=True)
class _Bench:
    """Everything a Basis is built from, on the benchmarks' own clocks."""

    curves: Curves
    smoothed: dict[bool, tuple[np.ndarray | None, np.ndarray]]  # smooth -> (time_s, power_w) [J, Cb]
    inputs: Inputs
    raw: np.ndarray
    resource: list[str]
    rows: list[int]
    ib: int
    p_max: float


def _basis(bn: _Bench, grid: np.ndarray, smooth: bool, p_idle_b: np.ndarray, p_run_b: np.ndarray) -> Basis:
    """The benchmarks' curves (denoised or not) and the idle and running power on `grid`."""
    clocks = bn.curves.clocks
    t, p = bn.smoothed[smooth]
    on = lambda v, inv: interp_curves(clocks, v, grid, inv)  # noqa: E731
    r = int(np.searchsorted(grid, clocks[bn.ib]))
    p_idle = on(p_idle_b[None, :], False)[0]
    return Basis(
        bn.inputs,
        bn.raw,
        None if t is None else on(t, True),
        on(p, False),
        bn.resource,
        bn.rows,
        p_idle,
        np.maximum(on(p_run_b[None, :], False)[0], p_idle),
        r,
        bn.p_max,
    )


def _truth(c: Curves) -> dict[str, np.ndarray]:
    out = {"power_w": c.power_w}
    if c.time_s is not None:
        assert c.energy_j is not None  # curves with time have energy (_pivot)
        out["time_s"], out["energy_j"] = c.time_s, c.energy_j
    return out


def _plain_reference(basis: Basis, anchors: Anchors, mean: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The plain anchored NNLS: every column as it comes, scaled by its largest benchmark value, each
    benchmark's curve mixed by its weight and scaled to the anchor."""
    rows, r = basis.rows, basis.r
    raw = basis.raw[rows]
    top = raw.max(axis=0) if raw.size else np.zeros(0)
    if raw.shape[1] and (top > 0).any():
        xn, _ = solve_nnls(raw, anchors.raw, np.where(top > 0, top, 0.0))
    else:
        xn = np.zeros((len(anchors.power_w), len(rows)))
    plain = xn.sum(axis=1) > 0

    def shape(curves: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        m = xn @ curves
        return np.where(plain[:, None], m / np.where(plain, m[:, r], 1.0)[:, None], fallback[None, :])

    if basis.time_s is None:
        return {"power_w": anchors.power_w[:, None] * shape(basis.power_w[rows], mean["power_w"])}
    e_b = basis.energy_j
    assert e_b is not None and anchors.time_s is not None and anchors.energy_j is not None  # with time, as the basis
    t = anchors.time_s[:, None] * shape(basis.time_s[rows], mean["time_s"])
    e = anchors.energy_j[:, None] * shape(e_b[rows], mean["energy_j"])
    return {"time_s": t, "energy_j": e, "power_w": e / t}


def _estimate_idle(bn: _Bench, form: Form, pairs, notes: list[str]) -> np.ndarray:
    """[Cb] idle power without an idle row: the share of the benchmarks' lowest power at each clock
    under which each benchmark, predicted from the others, is predicted best."""
    b, rows = bn.curves, bn.rows
    envelope = np.nanmin(b.power_w[rows], axis=0)
    cand = IDLE_SCALES[:, None] * envelope[None, :]
    run = lambda p: _running_power(b, pairs, p)  # noqa: E731
    basis = _basis(bn, b.clocks, form.smooth, envelope, run(envelope))
    k = choose_idle(basis, cand, lambda p: np.maximum(run(p), p), _truth(b), form)
    notes.append(
        f"no idle row: idle power taken as {IDLE_SCALES[k]:.1f} x the benchmarks' lowest power at each clock "
        f"({cand[k][bn.ib]:.1f} W at the reference clock), the share that predicts each benchmark from the "
        "others best"
    )
    return cand[k]


def _table(s: Curves, clocks: np.ndarray, f_ref: int, measured: dict, pred: dict) -> pd.DataFrame:
    n_s, n_c = len(s.names), len(clocks)
    table = {
        "name": np.repeat(np.asarray(s.names, dtype=object), n_c),
        "sm_mhz": np.tile(clocks, n_s),
        "anchor": np.tile(clocks == f_ref, n_s),
    }
    for q in QUANTITIES:
        if np.isfinite(measured[q]).any():
            table[f"measured_{q}"] = measured[q].ravel()
    for m, v in pred.items():
        for q, a in v.items():
            table[f"{m}_{q}"] = a.ravel()
    return pd.DataFrame(table)


def default_form(power_measured: bool, has_time: bool = True, overlap: str = "roofline") -> Form:
    """The physics: the anchor sets the level of the mix's work energy over the board's running power
    when that power is measured (an idle row, or same-work pairs that give P_run); when it is only
    estimated (the benchmarks do not pin idle power down: see docs/model.md), the whole curve is
    scaled, which an error in the estimate moves less."""
    return Form(anchor="dynamic" if power_measured or not has_time else "curve", overlap=overlap)


@dataclass(frozen=True)
class _Data:
    """The benchmarks and the targets as the fit reads them: curves, counters at the reference clock
    and the model's inputs."""

    fs: FeatureSet
    b: Curves
    s: Curves
    f_ref: int
    ib: int  # the reference clock's column in b ...
    is_: int  # ... and in s
    has_t: bool
    ts_ref: np.ndarray | None
    smoothed: dict
    wi_b: Inputs
    wi_s: Inputs
    cb: np.ndarray
    cs: np.ndarray
    warns: list
    norm: dict


def _read_inputs(bench: pd.DataFrame, targets: pd.DataFrame, features, counters, ref_mhz, notes: list[str]) -> _Data:
    """Step 1: the feature set, both tables as curves on their clocks, the reference clock and the
    model's inputs (benchmark times denoised, so that one noisy run moves no peak rate)."""
    bench, targets = _named(bench), _named(targets)
    fs, found = choose_features(bench, targets, features, counters, RESERVED)
    notes.extend(found)
    b = curves_from_table(bench, "bench", fs)
    absent = [c for c in fs if c not in targets.columns]
    if absent:
        raise ValueError(f"targets: missing counter column {absent[0]} (the benchmarks have it)")
    s = curves_from_table(targets, "targets", fs)
    if not len(fs):
        notes.append("no counter columns: every target gets the mean curve")
    f_ref = int(b.clocks[-1]) if ref_mhz is None else int(ref_mhz)
    _check_reference(b, s, f_ref)
    s = _within(s, b, notes)
    ib, is_ = int(np.searchsorted(b.clocks, f_ref)), int(np.searchsorted(s.clocks, f_ref))
    cb, cs = _at_reference(b, ib, "bench"), _at_reference(s, is_, "targets")
    has_t = b.time_s is not None
    tb_ref: np.ndarray | None = None
    ts_ref: np.ndarray | None = None
    if b.time_s is not None:
        assert s.time_s is not None  # _check_reference: both tables have time_s or neither
        tb_ref, ts_ref = b.time_s[:, ib], s.time_s[:, is_]
    warns = feature_warnings(fs, cb, tb_ref, cs, ts_ref)
    norm = normalisation(fs, bench, cb, tb_ref)
    t_smooth = denoise(b.clocks, b.time_s, True) if b.time_s is not None else None
    smoothed = {
        True: (t_smooth, denoise(b.clocks, b.power_w, False)),
        False: (b.time_s, b.power_w),
    }
    wi_b, wi_s = model_inputs(cb, t_smooth[:, ib] if t_smooth is not None else None, cs, ts_ref, fs)
    return _Data(fs, b, s, f_ref, ib, is_, has_t, ts_ref, smoothed, wi_b, wi_s, cb, cs, warns, norm)


def _bench_model(
    d: _Data,
    idle,
    pairs,
    overlap: str,
    p_max: float,
    scale_idle: bool,
    pinned: Form | None,
    select: bool,
    notes: list[str],
):
    """Step 2: the benchmarks' idle and running power, and the model form (pinned, the default, or
    chosen by cross-validation on the benchmarks). Returns (bench, form, p_idle, p_run, selection, idle row)."""
    b = d.b
    p_idle_b, j_idle = _idle(b, idle)
    rows = [j for j in range(len(b.names)) if j != j_idle]
    res = [
        _resource(d.fs, d.wi_b.work_columns[int(np.argmax(d.wi_b.work[j]))]) if d.wi_b.work.shape[1] else "sm"
        for j in range(len(b.names))
    ]
    bn = _Bench(b, d.smoothed, d.wi_b, d.cb, res, rows, d.ib, p_max)
    measured = j_idle is not None or bool(pairs)  # the board's running power, not an estimate
    form = pinned or default_form(measured, d.has_t, overlap)
    if p_idle_b is None:
        p_idle_b = _estimate_idle(bn, form, pairs, notes) if scale_idle else np.nanmin(b.power_w[rows], axis=0)
    p_run_b = _running_power(b, pairs, p_idle_b)
    selection = None
    if select:
        default = form
        cv = {sm: _basis(bn, b.clocks, sm, p_idle_b, p_run_b) for sm in (True, False)}
        # an idle estimate was fitted to these benchmarks, so they cannot also judge how to anchor on it
        cands = forms(d.has_t, ANCHORS if measured else (default.anchor,))
        form, selection = choose_form(cv, _truth(b), [default, *(f for f in cands if f != default)])
        notes.append(
            f"form chosen by cross-validation on the benchmarks: {form} (held-out error "
            f"{selection[str(form)]:.2f} %, the default form's {selection[str(default)]:.2f} %)"
        )
    return bn, form, p_idle_b, p_run_b, selection, j_idle


def _predictions(d: _Data, bn: _Bench, form: Form, p_idle_b, p_run_b, notes: list[str]):
    """Step 3: every target's curves on the union of both tables' clocks, by the model (`emo`) and
    by the two references (`mean_curve`, `nnls`). Returns (clocks, the reference clock's column, pred)."""
    s, is_, ts_ref = d.s, d.is_, d.ts_ref
    clocks = np.union1d(d.b.clocks, s.clocks)  # where every curve is evaluated
    basis = _basis(bn, clocks, form.smooth, p_idle_b, p_run_b)
    ref = basis if form.smooth else _basis(bn, clocks, True, p_idle_b, p_run_b)  # references: denoised curves
    es_ref: np.ndarray | None = None
    if d.has_t:
        assert s.energy_j is not None  # curves with time have energy (_pivot)
        es_ref = s.energy_j[:, is_]
    anchors = Anchors(d.wi_s, d.cs, ts_ref, es_ref, s.power_w[:, is_])
    pred: dict[str, dict[str, np.ndarray]] = {}
    pred["emo"], mixed = predict(form, basis, anchors)
    mean = mean_shapes(ref)
    pred["mean_curve"] = {}
    for q, anchors_q in (("time_s", ts_ref), ("energy_j", es_ref), ("power_w", s.power_w[:, is_])):
        if q in mean:
            assert anchors_q is not None  # mean has time and energy only where both tables have time_s
            pred["mean_curve"][q] = anchors_q[:, None] * mean[q][None, :]
    if d.has_t:
        pred["mean_curve"]["power_w"] = pred["mean_curve"]["energy_j"] / pred["mean_curve"]["time_s"]
    pred["nnls"] = _plain_reference(ref, anchors, mean)
    if (~mixed).any():
        notes.append(f"{int((~mixed).sum())} target(s) have no work any benchmark does: mean curve for them")
    return clocks, basis.r, pred


def _measured_grid(s: Curves, clocks: np.ndarray) -> dict[str, np.ndarray]:
    """The targets' measured values on the prediction grid (NaN where a target was not measured)."""
    idx = np.searchsorted(clocks, s.clocks)
    measured = {}
    for q in QUANTITIES:
        grid = np.full((len(s.names), len(clocks)), np.nan)
        if _truth(s).get(q) is not None:
            grid[:, idx] = _truth(s)[q]
        measured[q] = grid
    return measured


def _scores(pred: dict, measured: dict, r: int) -> dict:
    """MAPE per method and quantity over every measured point but the anchor clock's column `r`."""
    score_mask = np.ones(next(iter(measured.values())).shape, dtype=bool)
    score_mask[:, r] = False
    return {
        m: {
            f"mape_{q.split('_')[0]}_pct": (_mape(v[q], measured[q], score_mask) if q in v else None)
            for q in QUANTITIES
        }
        for m, v in pred.items()
    }


def fit_predict(
    bench: pd.DataFrame,
    targets: pd.DataFrame,
    *,
    features: str | Sequence[str] | None = None,
    counters: str | None = None,
    ref_mhz: int | None = None,
    idle: str | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    overlap: str = "roofline",
    p_max: float = P_MAX,
    scale_idle: bool = True,
    form: Form | None = None,
    select: bool = False,
) -> Result:
    """Fit on `bench`, predict every target at its measured clocks and the benchmarks' clocks.

    features: None (every numeric column, known counter names by `counters`), "all" (every numeric
    column, unknown ones as the form their values show) or a list of column names, each optionally
    `name:form` (emo.model.columns); counters: "dcgm", "ncu", "emo", "gpupowermodel" to read only
    that source's known names; ref_mhz: the anchor clock (default the highest benchmark clock);
    idle: the name of the idle row (default a row named "idle", else estimated); pairs: same-work
    benchmark pairs (none: P_run = P_idle); overlap: "roofline" or "sum" (the default form's);
    form: the model form (emo.model.shapes.Form); select: choose the form by cross-validation on
    the benchmarks instead (the targets are never used for it).
    """
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap: {overlap!r} is not one of roofline, sum")
    notes: list[str] = []
    d = _read_inputs(bench, targets, features, counters, ref_mhz, notes)
    bn, form, p_idle_b, p_run_b, selection, j_idle = _bench_model(
        d, idle, pairs, overlap, p_max, scale_idle, form, select, notes
    )
    clocks, r, pred = _predictions(d, bn, form, p_idle_b, p_run_b, notes)
    measured = _measured_grid(d.s, clocks)
    scores = _scores(pred, measured, r)
    used = [c for c in d.wi_b.work_columns if c != UNATTRIBUTED] + list(d.wi_b.presence_columns)
    unused = [c for c in d.fs if c not in used]
    if unused:
        notes.append(f"counter columns no benchmark exercises (zero everywhere): {', '.join(unused)}")
    if j_idle is not None:
        notes.append(f"idle power from the row {d.b.names[j_idle]!r}")
    return Result(
        _table(d.s, clocks, d.f_ref, measured, pred),
        scores,
        d.f_ref,
        used,
        notes,
        d.warns,
        {c: d.norm[c] for c in used if c in d.norm},
        form.to_json(),
        selection,
    )
