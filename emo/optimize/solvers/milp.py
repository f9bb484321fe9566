"""The clock-scheduling problem as a linear program (HiGHS via scipy): the DP's LP-relaxation start
(solvers.dp) and, with binary x, the exact reference the DP is measured against (benchmarks/dp_gap.py).

MIP reference: x binary, otherwise the same constraints. HiGHS proves optimality on small instances;
with a time limit (a reference, not a schedule anyone applies) it still reports a bound.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix

from emo.graph.whatif import TOLERANCE_NS
from emo.optimize.problem import Items, Problem, make_items
from emo.optimize.solution import Solution


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
    dst, src, fs = p.dst, p.src, p.from_start
    m = len(src)
    waited_on = np.zeros(n, dtype=bool)
    waited_on[src[~fs]] = True
    sinks = np.flatnonzero(~waited_on)
    # rows: one per item (Σ x = 1), per edge (s_v − s_u [− dur_u] ≥ lag_e), per unwaited node (T − s_v − dur_v ≥ 0)
    e_rows, s_rows = K + np.arange(m), K + m + np.arange(len(sinks))
    r = [np.repeat(np.arange(K), C), e_rows, e_rows, s_rows, s_rows]
    j = [np.arange(nx), nx + dst, nx + src, np.full(len(sinks), iT), nx + sinks]
    v = [np.ones(nx), np.ones(m), -np.ones(m), np.ones(len(sinks)), -np.ones(len(sinks))]
    lo = np.concatenate([np.ones(K), p.lag_ns * 1e-6, np.zeros(len(sinks))])
    hi = np.concatenate([np.ones(K), np.full(m + len(sinks), np.inf)])
    # the duration of a finish-to-start edge's source and of every unwaited node: Σ_c dur[c]·x[k, c]
    # on GPU nodes, a constant on host nodes
    r_of = np.concatenate([e_rows[~fs], s_rows])
    u_of = np.concatenate([src[~fs], sinks])
    k_of = items.item_of[u_of]
    gpu = k_of >= 0
    r.append(np.repeat(r_of[gpu], C))
    j.append((k_of[gpu][:, None] * C + np.arange(C)).ravel())
    v.append(-dur[u_of[gpu]].ravel())
    np.add.at(lo, r_of[~gpu], p.dur_ns[u_of[~gpu], p.ref] * 1e-6)
    A = csr_matrix((np.concatenate(v), (np.concatenate(r), np.concatenate(j))), shape=(K + m + len(sinks), iT + 1))
    c = np.zeros(iT + 1)
    c[:nx] = energy.ravel()
    assert items.idle_energy is not None  # iteration_items sets it
    c[iT] = items.idle_energy[:, p.ref].sum() / (p.makespan0_ns * 1e-6)  # Items.total's stretch, linearised
    lb = np.r_[np.zeros(nx), p.offset_ns * 1e-6, p.makespan0_ns * 1e-6]
    ub = np.r_[np.ones(nx), np.full(n, np.inf), deadline_ns * 1e-6]
    return c, A, lo, hi, lb, ub


def solve_exact(
    p: Problem,
    budget: float,
    *,
    change_interval_ms: float = 20.0,
    items: Items | None = None,
    replicate: bool = True,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
) -> Solution:
    """The MIP optimum (or HiGHS' best within `time_limit_s`, with its bound in info)."""
    items = items or make_items(p, change_interval_ms, replicate=replicate)
    K, C = items.k, p.n_clocks
    # the deadline by the engine's tolerance, the same on-time rule as every other solver's
    c, A, lo, hi, lb, ub = formulation(p, items, p.makespan0_ns * (1 + budget) + TOLERANCE_NS)
    integrality = np.zeros(len(c))
    integrality[: K * C] = 1
    res = milp(
        c,
        constraints=LinearConstraint(A, lo, hi),
        integrality=integrality,
        bounds=Bounds(lb, ub),
        options={"time_limit": time_limit_s, "mip_rel_gap": rel_gap, "disp": False},
    )
    if res.x is None:
        raise ValueError(f"exact reference: HiGHS found no solution ({res.message})")
    choice = res.x[: K * C].reshape(K, C).argmax(axis=1)
    bound = getattr(res, "mip_dual_bound", None)
    return Solution(
        p,
        items,
        choice,
        "exact",
        budget,
        info={
            "milp_status": int(res.status),
            "milp_message": str(res.message),
            "milp_objective_j": float(res.fun),
            "milp_gap": float(getattr(res, "mip_gap", 0.0) or 0.0),
            "milp_bound_j": float(bound) if bound is not None else float(res.fun),
            "variables": len(c),
            "constraints": A.shape[0],
        },
    )
