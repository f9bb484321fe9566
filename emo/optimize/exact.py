"""The exact reference: the same problem as a mixed-integer program (scipy's HiGHS).

The linear program of emo.optimize.lp (EMO's DP solves its relaxation for a start) with x[k, c]
binary. For small instances only: it measures the DP's optimality gap.
"""
from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from emo.optimize.lp import formulation
from emo.optimize.problem import Items, Problem, make_items
from emo.optimize.solution import Solution


def solve_exact(p: Problem, budget: float, *, change_interval_ms: float = 20.0, items: Items | None = None,
                replicate: bool = True, time_limit_s: float = 60.0, rel_gap: float = 1e-6) -> Solution:
    t0 = time.perf_counter()
    items = items or make_items(p, change_interval_ms, replicate=replicate)
    K, C = items.k, p.n_clocks
    c, A, lo, hi, lb, ub = formulation(p, items, p.makespan0_ns * (1 + budget) * (1 + 1e-12))
    integrality = np.zeros(len(c))
    integrality[:K * C] = 1
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(lb, ub),
               options={"time_limit": time_limit_s, "mip_rel_gap": rel_gap, "disp": False})
    if res.x is None:
        raise ValueError(f"exact reference: HiGHS found no solution ({res.message})")
    choice = res.x[:K * C].reshape(K, C).argmax(axis=1)
    sol = Solution(p, items, choice, "exact", budget,
                   info={"milp_status": int(res.status), "milp_message": str(res.message),
                         "milp_objective_j": float(res.fun), "milp_gap": float(getattr(res, "mip_gap", 0.0) or 0.0),
                         "variables": len(c), "constraints": A.shape[0]})
    sol.solve_s = time.perf_counter() - t0
    return sol
