"""Frequency optimisation over the pack-level DAG: EMO's DP (Algorithm 2), its exact MILP reference,
and the static and Perseus (lowtime) baselines, all over the same `Problem`; `policy` turns a
solution into a FrequencyPolicy."""
from emo.optimize.problem import Items, Problem, build_problem, evaluate, make_items
from emo.optimize.solution import Solution
from emo.optimize.dp import optimize
from emo.optimize.exact import solve_exact
from emo.optimize.static import optimize_static
from emo.optimize.perseus import optimize_perseus
from emo.optimize.policy import build_policy
from emo.optimize.run import solve

__all__ = ["Items", "Problem", "Solution", "build_policy", "build_problem", "evaluate", "make_items", "optimize",
           "optimize_perseus", "optimize_static", "solve", "solve_exact"]
