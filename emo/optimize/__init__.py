"""Frequency optimisation over the pack-level DAG: EMO's DP (Algorithm 2), its exact MILP reference,
and the static and Perseus (lowtime) baselines, all over the same `Problem`; `policy` turns a
solution into a FrequencyPolicy."""
from emo.optimize.problem import Items, Problem, build_problem, evaluate, make_items
from emo.optimize.solution import Solution
from emo.optimize.dp import optimize

__all__ = ["Items", "Problem", "Solution", "build_problem", "evaluate", "make_items", "optimize"]
