"""Choosing among the model's forms, and idle power without an idle row, by cross-validation on the
benchmarks only: each benchmark in turn is a target, anchored at the reference clock and predicted
from the others; the form (or idle curve) that predicts them best wins, a form other than the
default only when it is clearly better. The targets are never seen.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np

from emo.model.features import Inputs
from emo.model.shapes import ANCHORS, MIXES, OVERLAPS, Anchors, Basis, Form, predict

MAX_FOLDS = 30  # at most this many held-out groups (benchmarks interleaved), so large suites stay quick


def forms(has_time: bool, anchors: tuple[str, ...] = ANCHORS) -> list[Form]:
    """Every form that changes a prediction: anchoring and overlap only act where there is time."""
    if not has_time:
        return [Form(m, "dynamic", "roofline", s) for m, s in itertools.product(MIXES, (True, False))]
    return [Form(*c) for c in itertools.product(MIXES, anchors, OVERLAPS, (True, False))]


def _rows(a: Inputs, idx: list[int]) -> Inputs:
    return Inputs(a.work[idx], a.presence[idx], a.work_columns, a.presence_columns)


def folds(rows: list[int]) -> list[list[int]]:
    n = min(len(rows), MAX_FOLDS)
    return [rows[k::n] for k in range(n)] if len(rows) > 1 else []


def held_out_errors(form: Form, basis: Basis, truth: dict[str, np.ndarray]) -> np.ndarray:
    """[folds] each held-out group's MAPE % (every clock but the reference, every quantity measured),
    predicted from the other benchmarks. truth: measured [J, C] on basis's grid."""
    r, out = basis.r, []
    for held in folds(basis.rows):
        b = replace(basis, rows=[j for j in basis.rows if j not in held])
        a = Anchors(
            _rows(basis.inputs, held),
            basis.raw[held],
            truth["time_s"][held, r] if "time_s" in truth else None,
            truth["energy_j"][held, r] if "energy_j" in truth else None,
            truth["power_w"][held, r],
        )
        pred, _ = predict(form, b, a)
        errs = []
        for q, v in pred.items():
            if q == "power_w" and "time_s" in truth:
                continue  # with time, power is energy over time: scored twice otherwise
            true = truth[q][held]
            m = np.isfinite(true) & np.isfinite(v)
            m[:, r] = False
            if m.any():
                errs.append(float(np.mean(np.abs(v[m] - true[m]) / true[m])))
        out.append(100.0 * float(np.mean(errs)) if errs else np.nan)
    return np.asarray(out)


def held_out_error(form: Form, basis: Basis, truth: dict[str, np.ndarray]) -> float:
    e = held_out_errors(form, basis, truth)
    return float(np.nanmean(e)) if np.isfinite(e).any() else float("inf")


def clearly_better(errs: np.ndarray, base: np.ndarray) -> bool:
    """True when `errs` beats `base` over the same folds by more than one standard error of the
    paired difference: the benchmarks are few and each has a near-twin, so a smaller mean alone is
    often noise."""
    d = (errs - base)[np.isfinite(errs - base)]
    if len(d) < 2:
        return False
    return float(d.mean() + d.std(ddof=1) / np.sqrt(len(d))) < 0.0


def choose_form(
    bases: dict[bool, Basis], truth: dict[str, np.ndarray], candidates: list[Form] | None = None
) -> tuple[Form, dict[str, float]]:
    """(form, {form: held-out error %}); bases by smoothing on/off. The first candidate (the
    caller's default) stays unless another is clearly better (one-standard-error rule); of those
    that are, the least error wins."""
    candidates = candidates or forms(bases[True].time_s is not None)
    per_fold = {f: held_out_errors(f, bases[f.smooth], truth) for f in candidates}
    mean = {f: float(np.nanmean(e)) if np.isfinite(e).any() else float("inf") for f, e in per_fold.items()}
    base = per_fold[candidates[0]]
    better = [f for f in candidates[1:] if clearly_better(per_fold[f], base)]
    best = min(better, key=lambda f: mean[f]) if better else candidates[0]
    return best, {str(f): round(e, 3) for f, e in mean.items()}


def choose_idle(basis: Basis, candidates: np.ndarray, run_power, truth: dict[str, np.ndarray], form: Form) -> int:
    """Index of the candidate idle curve [K, C] under which the benchmarks, each predicted from the
    others, are predicted best. run_power(p_idle) -> P_run for that idle curve."""
    errs = [held_out_error(form, replace(basis, p_idle=c, p_run=run_power(c)), truth) for c in candidates]
    return int(np.argmin(errs))
