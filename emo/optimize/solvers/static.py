"""The static baseline: one clock for every GPU for the whole run, the lowest-energy one (by the
model) whose makespan stays within the budget."""

from __future__ import annotations

import numpy as np

from emo.graph.whatif import TOLERANCE_NS
from emo.optimize.problem import Evaluation, Items, Problem, evaluate, make_items
from emo.optimize.solution import Solution


def single_clock_curve(p: Problem, items: Items) -> list[Evaluation]:
    """Every candidate clock on every item, on the engine: the static curve, one point per clock."""
    return [evaluate(p, items, np.full(items.k, c)) for c in range(p.n_clocks)]


def optimize_static(
    p: Problem, budget: float, *, change_interval_ms: float = 20.0, items: Items | None = None
) -> Solution:
    items = items or make_items(p, change_interval_ms)
    deadline = p.makespan0_ns * (1 + budget)
    curve = []
    best_c, best_e = p.ref, np.inf
    for c, ev in enumerate(single_clock_curve(p, items)):
        curve.append({"sm_mhz": int(p.clocks_mhz[c]), "time_ms": ev.makespan_ns * 1e-6, "energy_j": ev.energy_j})
        if ev.makespan_ns <= deadline + TOLERANCE_NS and ev.energy_j < best_e:
            best_c, best_e = c, ev.energy_j
    return Solution(
        p,
        items,
        np.full(items.k, best_c),
        "static",
        budget,
        info={"static_mhz": int(p.clocks_mhz[best_c]), "static_curve": curve},
    )
