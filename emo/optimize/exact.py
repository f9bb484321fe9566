"""The exact reference: the same problem as a mixed-integer program (scipy's HiGHS).

Binary x[k, c] (item k at clock c, one per item), continuous start times with the DAG's precedence
constraints (a node's duration is Σ_c dur[c]·x[k, c]), the makespan T ≥ every finish, T ≤ deadline;
minimise Σ energy[k, c]·x[k, c] + idle power × (T − baseline). Times in ms for sane numerics.
For small instances only: it measures the DP's optimality gap.
"""
from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from emo.optimize.problem import Items, Problem, make_items
from emo.optimize.solution import Solution


def solve_exact(p: Problem, budget: float, *, change_interval_ms: float = 20.0, items: Items | None = None,
                replicate: bool = True, time_limit_s: float = 60.0, rel_gap: float = 1e-6) -> Solution:
    t0 = time.perf_counter()
    items = items or make_items(p, change_interval_ms, replicate=replicate)
    K, C, n = items.k, p.n_clocks, p.n
    nx = K * C
    iS = nx  # start variables
    iT = nx + n
    nv = nx + n + 1
    scale = 1e-6  # ns -> ms
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def add(cs, vs, lb, ub):
        nonlocal r
        rows.extend([r] * len(cs)), cols.extend(cs), vals.extend(vs), lo.append(lb), hi.append(ub)
        r += 1

    for k in range(K):
        add(list(range(k * C, k * C + C)), [1.0] * C, 1.0, 1.0)

    def dur_terms(u):
        k = items.item_of[u]
        if k < 0:
            return [], [], p.dur_ns[u, p.ref] * scale
        return list(range(k * C, k * C + C)), list(p.dur_ns[u] * scale), 0.0

    for v in range(n):
        for e in range(p.pred_ptr[v], p.pred_ptr[v + 1]):
            u = int(p.pred_idx[e])
            dl = p.delay_ns[v] * scale
            if p.pred_fs[e]:  # s_v >= s_u + delay_v
                add([iS + v, iS + u], [1.0, -1.0], dl, np.inf)
            else:  # s_v - s_u - dur_u >= delay_v
                cs, vs, const = dur_terms(u)
                add([iS + v, iS + u] + cs, [1.0, -1.0] + [-x for x in vs], const + dl, np.inf)
    # T >= s_v + dur_v for every node no successor waits to finish (a finish-to-start edge
    # dominates it); a start-to-start successor (a launch) can finish before its source does
    waited = np.zeros(n, bool)
    waited[p.pred_idx[~p.pred_fs]] = True
    for v in np.flatnonzero(~waited):
        cs, vs, const = dur_terms(v)
        add([iT, iS + v] + cs, [1.0, -1.0] + [-x for x in vs], const, np.inf)
    A = coo_matrix((vals, (rows, cols)), shape=(r, nv)).tocsr()
    c = np.zeros(nv)
    c[:nx] = items.energy.ravel()
    c[iT] = items.ext_power_w * 1e-3  # W × ms -> J
    deadline = p.makespan0_ns * (1 + budget) * scale
    lb = np.zeros(nv)
    ub = np.full(nv, np.inf)
    ub[:nx] = 1.0
    lb[iS:iS + n] = p.delay_ns * scale  # a source starts after its delay
    lb[iT], ub[iT] = p.makespan0_ns * scale, deadline * (1 + 1e-12)
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(lb, ub),
               options={"time_limit": time_limit_s, "mip_rel_gap": rel_gap, "disp": False})
    if res.x is None:
        raise ValueError(f"exact reference: HiGHS found no solution ({res.message})")
    choice = res.x[:nx].reshape(K, C).argmax(axis=1)
    sol = Solution(p, items, choice, "exact", budget,
                   info={"milp_status": int(res.status), "milp_message": str(res.message),
                         "milp_objective_j": float(res.fun), "milp_gap": float(getattr(res, "mip_gap", 0.0) or 0.0),
                         "variables": nv, "constraints": r})
    sol.solve_s = time.perf_counter() - t0
    return sol
