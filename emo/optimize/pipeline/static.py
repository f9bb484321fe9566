"""The static method: one clock for every GPU for the whole run. Its frontier is the single-clock
curve on the engine (solvers.static.single_clock_curve), its pick the least energy within the planning
budget (the max clock when none is). The flag `measures_static_curve` (emo.methods) has validate
measure the curve on the device and report the best measured clock instead (docs/baselines.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from emo.graph.whatif import TOLERANCE_NS
from emo.optimize.pipeline.check import Latencies
from emo.optimize.pipeline.planner import Candidate, Planner, Setting
from emo.optimize.solution import Solution
from emo.optimize.solvers.static import single_clock_curve
from emo.policy import FrequencyPolicy


class StaticPlanner(Planner):
    method = "static"

    def frontier(self, s: Setting) -> Iterator[Candidate]:
        deadline = s.p.makespan0_ns * (1 + s.plan_budget)
        for c, ev in enumerate(single_clock_curve(s.p, s.items)):
            choice = np.full(s.items.k, c)
            yield Candidate(choice, ev.makespan_ns, ev.energy_j, ev.makespan_ns <= deadline + TOLERANCE_NS)

    def pick(self, s: Setting, candidates: Iterable[Candidate]) -> Candidate:
        seen = list(candidates)
        on_time = [c for c in seen if c.on_time]
        return min(on_time, key=lambda c: c.energy_j) if on_time else seen[s.p.ref]

    def plan(self, s: Setting) -> tuple[Solution, FrequencyPolicy, Latencies]:
        curve = list(self.frontier(s))
        best = self.pick(s, curve)
        mhz = [int(x) for x in s.p.clocks_mhz]
        s.record["static_curve"] = [
            {"sm_mhz": mhz[c], "time_ms": x.time_ns * 1e-6, "energy_j": x.energy_j} for c, x in enumerate(curve)
        ]
        sol = s.solution(best.choice, self.method, {"static_mhz": mhz[int(best.choice[0])]})
        return sol, s.build(sol), s.lats


STATIC = StaticPlanner()
