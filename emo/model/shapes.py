"""The model's forms: how a target's mix of benchmarks becomes its time, energy and power curves.

A form picks, for one fit:
  mix      "work": NNLS on busy seconds with presence averages matched (emo.model.features);
           "plain": the columns as they come, scaled by their largest benchmark value;
  anchor   "dynamic": the measured anchor sets the level of the mix's work energy; idle (or running)
           power is the board's, the same for every kernel (E = P_run T + k sum_j x_j W_j);
           "curve": one factor on the whole curve (E = k (P_run T + sum_j x_j W_j));
  overlap  "roofline": the p-norm of per-resource busy times, p per target; "sum": busy times add;
  smooth   whether each benchmark curve is denoised first (emo.model.kernels.denoise).
The defaults are the physics (emo.model.kernels.default_form: the dynamic anchor where idle power
is measured); `emo.model.select` chooses among forms by cross-validation on the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emo.model.features import Inputs, mix, spread_duplicates
from emo.model.nnls import solve_nnls
from emo.model.overlap import calibrate_p, time_curves

PRESENCE_WEIGHT = 0.1  # weight of the average-matching rows (as in emo.model.fit)
MIXES, ANCHORS, OVERLAPS = ("work", "plain"), ("dynamic", "curve"), ("roofline", "sum")


@dataclass(frozen=True)
class Form:
    mix: str = "work"
    anchor: str = "dynamic"
    overlap: str = "roofline"
    smooth: bool = True

    def __str__(self) -> str:
        return f"mix={self.mix} anchor={self.anchor} overlap={self.overlap} smooth={'on' if self.smooth else 'off'}"

    def to_json(self) -> dict:
        return {"mix": self.mix, "anchor": self.anchor, "overlap": self.overlap, "smooth": self.smooth}


@dataclass(frozen=True)
class Basis:
    """Benchmark curves on an evaluation grid [J, C] and their inputs (rows: the basis benchmarks)."""

    inputs: Inputs  # every benchmark
    raw: np.ndarray  # [J, K] counter columns at the reference clock (plain mix)
    time_s: np.ndarray | None
    power_w: np.ndarray
    resource: list[str]  # per benchmark: the resource of its largest work feature
    rows: list[int]
    p_idle: np.ndarray  # [C]
    p_run: np.ndarray  # [C]
    r: int  # the reference clock's column
    p_max: float

    @property
    def energy_j(self) -> np.ndarray | None:
        return None if self.time_s is None else self.power_w * self.time_s


@dataclass(frozen=True)
class Anchors:
    """What is known of S targets: inputs and raw counters, and time, energy, power at the reference."""

    inputs: Inputs
    raw: np.ndarray
    time_s: np.ndarray | None
    energy_j: np.ndarray | None
    power_w: np.ndarray


def times(x, tb, res: list[str], ts_ref, r: int, overlap: str, p_max: float) -> np.ndarray:
    """[S, C] anchored time: the p-norm of per-resource busy times (emo.model.overlap)."""
    kinds = sorted(set(res))
    onehot = np.array([[q == k for q in res] for k in kinds], dtype=np.float64)
    busy = np.einsum("sj,rj,jc->src", x, onehot, tb)
    p = calibrate_p(busy[:, :, r], ts_ref, p_max) if overlap == "roofline" else np.ones(len(ts_ref))
    return time_curves(busy, ts_ref, r, p)


def energies(x, t_s, tb, eb, p_run, es_ref, r: int, anchor: str) -> np.ndarray:
    """[S, C] anchored energy: running power over the predicted time plus the mix's work energy,
    W_j = E_j - P_run T_j. "dynamic": the anchor sets the work energy's level only (where the anchor
    leaves it a positive share); "curve": one factor on the whole curve."""
    work = x @ np.maximum(eb - p_run[None, :] * tb, 0.0)
    base = p_run[None, :] * t_s
    whole = base + work
    ok = whole[:, r] > 0
    curve = np.where(
        ok[:, None],
        es_ref[:, None] * whole / np.where(ok, whole[:, r], 1.0)[:, None],
        es_ref[:, None] * t_s / t_s[:, r : r + 1],
    )
    if anchor == "curve":
        return curve
    left = es_ref - base[:, r]
    dyn = (work[:, r] > 0) & (left > 0)
    k = np.where(dyn, left / np.where(work[:, r] > 0, work[:, r], 1.0), 0.0)
    return np.where(dyn[:, None], base + k[:, None] * work, curve)


def powers(x, pb, p_idle, ps_ref, r: int) -> np.ndarray:
    """[S, C] anchored power (data without time): idle plus k_s x the mix's power above idle."""
    dyn = x @ (pb - p_idle[None, :])
    ok = dyn[:, r] > 0
    k = np.where(ok, (ps_ref - p_idle[r]) / np.where(ok, dyn[:, r], 1.0), 0.0)
    p = p_idle[None, :] + np.maximum(k, 0.0)[:, None] * dyn
    flat = ~ok | (k <= 0)
    p[flat] = ps_ref[flat, None] * (p_idle / p_idle[r] if p_idle[r] > 0 else np.ones_like(p_idle))[None, :]
    return p


def weights(form: Form, basis: Basis, anchors: Anchors) -> np.ndarray:
    """[S, len(basis.rows)] the targets' mix of the basis benchmarks."""
    rows = basis.rows
    if form.mix == "plain":
        raw = basis.raw[rows]
        top = raw.max(axis=0) if raw.size else np.zeros(0)
        if not raw.shape[1] or not (top > 0).any():
            return np.zeros((len(anchors.power_w), len(rows)))
        return solve_nnls(raw, anchors.raw, np.where(top > 0, top, 0.0))[0]
    tref = basis.time_s[:, basis.r] if basis.time_s is not None else None
    x = mix(basis.inputs, anchors.inputs, rows, tref, PRESENCE_WEIGHT)
    return spread_duplicates(x, basis.inputs, rows)


def mean_shapes(basis: Basis) -> dict[str, np.ndarray]:
    """[C] the basis benchmarks' mean normalised curve per quantity (the kernel-agnostic reference)."""
    rows, r = basis.rows, basis.r
    norm = lambda v: (v[rows] / v[rows, r : r + 1]).mean(axis=0)  # noqa: E731
    out = {"power_w": norm(basis.power_w)}
    if basis.time_s is not None:
        out["time_s"], out["energy_j"] = norm(basis.time_s), norm(basis.energy_j)
    return out


def predict(form: Form, basis: Basis, anchors: Anchors) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """({quantity: [S, C]}, mixed [S]): every target's curves under `form`; a target no benchmark
    shares work with gets the mean curve."""
    rows, r = basis.rows, basis.r
    x = weights(form, basis, anchors)
    mixed = x.sum(axis=1) > 0
    mean = mean_shapes(basis)
    if basis.time_s is None:
        p = powers(x, basis.power_w[rows], basis.p_idle, anchors.power_w, r)
        p[~mixed] = anchors.power_w[~mixed, None] * mean["power_w"][None, :]
        return {"power_w": p}, mixed
    eb_all, ts_ref, es_ref = basis.energy_j, anchors.time_s, anchors.energy_j
    assert eb_all is not None and ts_ref is not None and es_ref is not None  # time on the basis: on the targets too
    tb, eb = basis.time_s[rows], eb_all[rows]
    t = times(x, tb, [basis.resource[j] for j in rows], ts_ref, r, form.overlap, basis.p_max)
    t[~mixed] = ts_ref[~mixed, None] * mean["time_s"][None, :]
    e = energies(x, t, tb, eb, basis.p_run, es_ref, r, form.anchor)
    e[~mixed] = es_ref[~mixed, None] * mean["energy_j"][None, :]
    return {"time_s": t, "energy_j": e, "power_w": e / t}, mixed
