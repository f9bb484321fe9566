"""What every optimiser returns: a clock per item, checked by a full what-if pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emo.graph.whatif import TOLERANCE_NS
from emo.optimize.problem import Items, Problem, evaluate


@dataclass
class Solution:
    problem: Problem
    items: Items
    choice: np.ndarray  # int64[K]: column of problem.clocks_mhz per item
    method: str
    budget: float
    makespan_ns: float = 0.0
    energy_j: float = 0.0
    solve_s: float = 0.0  # wall time, for benchmarks; never written to an artifact
    info: dict = field(default_factory=dict)  # rounds, repairs, fallbacks: what happened

    def __post_init__(self) -> None:
        self.choice = np.asarray(self.choice, dtype=np.int64)
        ev = evaluate(self.problem, self.items, self.choice)
        self.makespan_ns, self.energy_j = ev.makespan_ns, ev.energy_j
        self.start_ns, self.finish_ns = ev.start_ns, ev.finish_ns

    @property
    def deadline_ns(self) -> float:
        return self.problem.makespan0_ns * (1.0 + self.budget)

    @property
    def feasible(self) -> bool:
        """On time by the engine's one tolerance (what every solver's check uses)."""
        return self.makespan_ns <= self.deadline_ns + TOLERANCE_NS

    @property
    def item_mhz(self) -> np.ndarray:
        return self.problem.clocks_mhz[self.choice]

    def node_mhz(self) -> np.ndarray:
        """Clock of every node in the caller's order (-1 for host nodes)."""
        p, it = self.problem, self.items
        out = np.full(p.n, -1, dtype=np.int64)
        gpu = it.item_of >= 0
        out[p.perm[gpu]] = self.item_mhz[it.item_of[gpu]]
        return out

    def baseline(self) -> Solution:
        return Solution(self.problem, self.items, np.full(self.items.k, self.problem.ref), "max-clock", self.budget)

    def summary(self) -> dict:
        base_ns, base_j = baseline_of(self.problem, self.items)
        return {
            "method": self.method,
            "budget": self.budget,
            "feasible": bool(self.feasible),
            "baseline_time_ms": base_ns * 1e-6,
            "baseline_energy_j": base_j,
            "predicted_time_ms": self.makespan_ns * 1e-6,
            "predicted_energy_j": self.energy_j,
            "predicted_saving": 1.0 - self.energy_j / base_j if base_j > 0 else 0.0,
            "predicted_slowdown": self.makespan_ns / base_ns - 1.0 if base_ns > 0 else 0.0,
            "items": int(self.items.k),
            "clock_groups": [list(map(int, g)) for g in self.items.groups],
            **self.info,
        }


def baseline_of(p: Problem, items: Items) -> tuple[float, float]:
    """(makespan ns, energy J) of every item at the max clock, evaluated once per (problem, items):
    every policy the optimizer builds reports it."""
    cached = getattr(items, "_baseline", None)
    if cached is None or cached[0] is not p:
        ev = evaluate(p, items, np.full(items.k, p.ref, dtype=np.int64))
        cached = (p, ev.makespan_ns, ev.energy_j)
        setattr(items, "_baseline", cached)  # noqa: B010 (not one of Items' fields)
    return cached[1], cached[2]
