"""The clock-scheduling problem as a linear program (HiGHS via scipy): the DP's LP-relaxation start
(emo.optimize.dp) and, with binary x, the exact reference (emo.optimize.exact)."""
from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from emo.optimize.problem import Items, Problem


def formulation(p: Problem, items: Items, deadline_ns: float, cols: np.ndarray | None = None):
    """The problem as a linear program over the clocks `cols` (default: all), times in ms:
    x[k, c] ∈ [0, 1] with Σ_c x[k, c] = 1 (item k at clock cols[c]), a start per node with the
    what-if's precedence (a node lasts Σ_c dur[c]·x[k, c]; host nodes their fixed time), the makespan
    T ≥ the finish of every node no successor waits to finish (a finish-to-start edge dominates it;
    a launch's start-to-start successor may finish first), baseline ≤ T ≤ deadline. Objective:
    Σ energy·x + the idle energy of a longer iteration (Items.total's stretch, at max clocks).
    Returns (c, A, lo, hi, lb, ub): variables are x (items × cols), the node starts, then T."""
    cols = np.arange(p.n_clocks) if cols is None else np.asarray(cols)
    K, C, n = items.k, len(cols), p.n
    dur, energy = p.dur_ns[:, cols] * 1e-6, items.energy[:, cols]
    nx, iT = K * C, K * C + n
    dst = np.repeat(np.arange(n), np.diff(p.pred_ptr))
    src, m = p.pred_idx, len(p.pred_idx)
    waited_on = np.zeros(n, dtype=bool)
    waited_on[src[~p.pred_fs]] = True
    sinks = np.flatnonzero(~waited_on)
    # rows: one per item (Σ x = 1), per edge (s_v − s_u [− dur_u] ≥ delay_v), per unwaited node (T − s_v − dur_v ≥ 0)
    e_rows, s_rows = K + np.arange(m), K + m + np.arange(len(sinks))
    r = [np.repeat(np.arange(K), C), e_rows, e_rows, s_rows, s_rows]
    j = [np.arange(nx), nx + dst, nx + src, np.full(len(sinks), iT), nx + sinks]
    v = [np.ones(nx), np.ones(m), -np.ones(m), np.ones(len(sinks)), -np.ones(len(sinks))]
    lo = np.concatenate([np.ones(K), p.delay_ns[dst] * 1e-6, np.zeros(len(sinks))])
    hi = np.concatenate([np.ones(K), np.full(m + len(sinks), np.inf)])
    # the duration of a finish-to-start edge's source and of every unwaited node: Σ_c dur[c]·x[k, c]
    # on GPU nodes, a constant on host nodes
    r_of = np.concatenate([e_rows[~p.pred_fs], s_rows])
    u_of = np.concatenate([src[~p.pred_fs], sinks])
    k_of = items.item_of[u_of]
    gpu = k_of >= 0
    r.append(np.repeat(r_of[gpu], C))
    j.append((k_of[gpu][:, None] * C + np.arange(C)).ravel())
    v.append(-dur[u_of[gpu]].ravel())
    np.add.at(lo, r_of[~gpu], p.dur_ns[u_of[~gpu], p.ref] * 1e-6)
    A = csr_matrix((np.concatenate(v), (np.concatenate(r), np.concatenate(j))), shape=(K + m + len(sinks), iT + 1))
    c = np.zeros(iT + 1)
    c[:nx] = energy.ravel()
    c[iT] = items.idle_energy[:, p.ref].sum() / (p.makespan0_ns * 1e-6)  # Items.total's stretch, linearised
    lb = np.r_[np.zeros(nx), p.delay_ns * 1e-6, p.makespan0_ns * 1e-6]
    ub = np.r_[np.ones(nx), np.full(n, np.inf), deadline_ns * 1e-6]
    return c, A, lo, hi, lb, ub
