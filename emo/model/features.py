"""Counter columns (as a source names them) -> the model's inputs: busy seconds and averages.

Every work feature becomes "seconds of that unit's work at the suite's peak rate", whatever its
source form (emo.device.features): a total is divided by the highest rate any benchmark reached,
a ratio or a rate is multiplied by the range's duration first. Presence features (SM active,
occupancy) become averages over the range, scaled to the suite's largest. Without durations (data
with power only), a ratio is used as it is (the duration is taken as 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emo.device.features import FeatureSet

UNATTRIBUTED = "sm_active_unattributed"  # derived work column: SM-active time beyond the busiest named unit


@dataclass(frozen=True)
class Inputs:
    """Model inputs of N ranges: W work columns, M presence columns."""

    work: np.ndarray  # [N, W] busy seconds at peak rate
    presence: np.ndarray  # [N, M] averages, 0..1 of the suite's largest
    work_columns: list[str]
    presence_columns: list[str]


def _raw(values: np.ndarray, fs: FeatureSet, duration: np.ndarray) -> tuple[np.ndarray, np.ndarray, list, list]:
    work, pres, wc, pc = [], [], [], []
    for k, name in enumerate(fs):
        col = fs.columns[name]
        v = values[:, k] * col.scale
        if fs.feature(name).role == "work":
            work.append(v if col.form == "total" else v * duration)
            wc.append(name)
        else:
            pres.append(v / duration if col.form == "total" else v)
            pc.append(name)
    n = len(values)
    stack = lambda cols: np.stack(cols, axis=1) if cols else np.zeros((n, 0))  # noqa: E731
    return stack(work), stack(pres), wc, pc


def model_inputs(
    bench_values: np.ndarray,
    bench_time_s: np.ndarray | None,
    target_values: np.ndarray,
    target_time_s: np.ndarray | None,
    fs: FeatureSet,
) -> tuple[Inputs, Inputs]:
    """(bench inputs, target inputs) from counter values [N, K] in the column order of `fs`, read
    at the reference clock, and the ranges' durations there (None: power-only data)."""
    tb = np.ones(len(bench_values)) if bench_time_s is None else np.asarray(bench_time_s, float)
    ts = np.ones(len(target_values)) if target_time_s is None else np.asarray(target_time_s, float)
    wb, pb, wc, pc = _raw(bench_values, fs, tb)
    ws, ps, _, _ = _raw(target_values, fs, ts)
    rate = (wb / tb[:, None]).max(axis=0) if wb.size else np.zeros(0)
    top = pb.max(axis=0) if pb.size else np.zeros(0)
    keep_w, keep_p = rate > 0, top > 0  # a column no benchmark exercises says nothing about the mix
    wcols, pcols = [c for c, k in zip(wc, keep_w) if k], [c for c, k in zip(pc, keep_p) if k]
    # Ratio sources (DCGM) name few units; totals sources (ncu) name every pipe, so only a ratio
    # SM-active gets the derived column.
    sm = [i for i, c in enumerate(pcols) if fs.feature(c).name == "sm_active" and fs.columns[c].form == "ratio"]
    out = []
    for w, p, t in ((wb, pb, tb), (ws, ps, ts)):
        w, p = w[:, keep_w] / rate[keep_w], p[:, keep_p] / top[keep_p]
        if sm:  # SM time no named unit accounts for (integer, shared-memory, latency-bound work)
            busiest = (w / t[:, None]).max(axis=1) if w.shape[1] else np.zeros(len(t))
            w = np.column_stack([w, np.maximum(p[:, sm[0]] - busiest, 0.0) * t])
        out.append(Inputs(w, p, wcols + ([UNATTRIBUTED] if sm else []), pcols))
    return out[0], out[1]


def mix(
    bench: Inputs, target: Inputs, basis: list[int], bench_time_s: np.ndarray | None, presence_weight: float
) -> np.ndarray:
    """[S, len(basis)] x >= 0: each target's work as a mix of the basis benchmarks' work (NNLS on busy
    seconds), with the presence averages matched time-weighted, presence_weight x
    sum_j x_j T_j (a_j - a_s) = 0 (busy times add up in a mix but overlap in a kernel, so averages,
    not totals)."""
    from emo.model.nnls import solve_nnls

    wb = bench.work[basis]
    if not wb.shape[1]:
        return np.zeros((len(target.work), len(basis)))
    t_w = bench_time_s[basis] if bench_time_s is not None else np.ones(len(basis))
    zero = None
    if bench.presence.shape[1]:
        ab, as_ = bench.presence[basis], target.presence
        zero = presence_weight * t_w[None, None, :] * (ab.T[None, :, :] - as_[:, :, None])
    x, _ = solve_nnls(wb, target.work, np.ones(wb.shape[1]), zero_rows=zero)
    return x


def distinguishable(bench: Inputs, rtol: float = 1e-3) -> np.ndarray:
    """[N] bool: False for a benchmark the counters cannot tell from an earlier one (work in the
    same proportions, same averages; emo.model.fit.distinguishable for EMO's own counters)."""
    w = bench.work
    norm = np.linalg.norm(w, axis=1, keepdims=True)
    direction = np.where(norm > 0, w / np.where(norm > 0, norm, 1.0), 0.0)
    keep = np.ones(len(w), dtype=bool)
    for j in range(len(w)):
        for i in range(j):
            if (
                keep[i]
                and np.allclose(direction[j], direction[i], atol=rtol)
                and np.allclose(bench.presence[j], bench.presence[i], rtol=rtol, atol=1e-12)
            ):
                keep[j] = False
                break
    return keep


def spread_duplicates(x: np.ndarray, bench: Inputs, basis: list[int], rtol: float = 1e-3) -> np.ndarray:
    """x with each weight shared equally among the basis benchmarks whose inputs are the same (the
    counters cannot tell them apart, e.g. fp16 and bf16 tensor benchmarks): the mix's work is
    unchanged, and its curves average over them instead of resting on one measurement's noise."""
    w = np.hstack([bench.work[basis], bench.presence[basis]])
    scale = np.maximum(np.abs(w).max(axis=0), 1e-300)
    out = x.copy()
    seen = np.zeros(len(basis), dtype=bool)
    for j in range(len(basis)):
        if seen[j]:
            continue
        same = np.all(np.abs(w - w[j]) <= rtol * scale, axis=1)
        seen |= same
        if same.sum() > 1:
            out[:, same] = x[:, same].sum(axis=1, keepdims=True) / same.sum()
    return out
