"""Frequency optimisation over the pack-level DAG.

Core: `problem` (the Problem on the timing engine's graph, its items, `evaluate`) and `solution`.
`solvers`: EMO's DP (Algorithm 2), static, Perseus (lowtime), the LP/MILP formulation.
`pipeline`: PackTables to a Problem, a Solution to a FrequencyPolicy, the predictor's check, `solve`.
"""

from emo.optimize.pipeline.solve import solve
from emo.optimize.problem import Items, Problem, build_problem, evaluate, make_items
from emo.optimize.solution import Solution
from emo.optimize.solvers.dp import optimize
from emo.optimize.solvers.milp import solve_exact
from emo.optimize.solvers.perseus import optimize_perseus
from emo.optimize.solvers.static import optimize_static

__all__ = [
    "Items",
    "Problem",
    "Solution",
    "build_problem",
    "evaluate",
    "make_items",
    "optimize",
    "optimize_perseus",
    "optimize_static",
    "solve",
    "solve_exact",
]
