"""The optimize stage's one local search: single-window moves judged by the predictor itself (the
timing engine with clock timelines, at the configured request latencies), bounded by a count of
candidate policies predicted."""

from __future__ import annotations

import numpy as np

from emo.model.predict import predict
from emo.optimize.pipeline.check import deadline_ns, expected
from emo.optimize.solution import Solution


def polish_on_predictor(tables, sol: Solution, build, *, budget: float, evaluations: int, transitions_ms):
    """(solution, policy, moves): single-window moves judged by the stage's predictor itself, clock
    transitions included, which the DP does not see: lower a window one clock step, give it a
    neighbouring window's clock (one step fewer, one transition less), or raise it one step while
    another window goes one step lower. A move is kept when the predicted energy drops and the
    predicted time keeps the budget, both in expectation over the clock-request latencies
    (check.expected); rounds go on until none is kept or
    `evaluations` candidate policies have been predicted. Windows are tried in order of the energy
    they hold."""
    p, items = sol.problem, sol.items
    deadline = deadline_ns(predict(tables, None), budget)
    policy = build(sol)
    energy = expected(tables, policy, transitions_ms).energy_j
    nwin = int(items.window.max()) + 1
    order = np.argsort(-items.energy[np.arange(items.k), sol.choice], kind="stable")
    moves, tried, improved = 0, 0, True
    while improved:
        improved = False
        for k in order:
            c = int(sol.choice[k])
            cands = {c - 1} if c > 0 else set()
            for nb in (k - 1, k + 1):  # neighbours in the same group (items are group * nwin + window)
                if 0 <= nb < items.k and nb // nwin == k // nwin and sol.choice[nb] != c:
                    cands.add(int(sol.choice[nb]))
            # trades: this window one step faster, another one step slower (spends the time a
            # faster window frees where it saves more)
            trades = [(j, int(sol.choice[j]) - 1) for j in order if j != k and sol.choice[j] > 0] if c < p.ref else []
            for c2, other in [(x, None) for x in sorted(cands)] + [(c + 1, t) for t in trades]:
                if tried >= evaluations:
                    return sol, policy, moves
                tried += 1
                choice = sol.choice.copy()
                choice[k] = c2
                if other is not None:
                    choice[other[0]] = other[1]
                s2 = Solution(p, items, choice, sol.method, sol.budget, info=sol.info)
                pol2 = build(s2)
                pred2 = expected(tables, pol2, transitions_ms)
                e2 = pred2.energy_j
                if e2 < energy * (1 - 1e-6) and pred2.makespan_ns <= deadline:
                    sol, policy, energy = s2, pol2, e2
                    moves += 1
                    improved = True
                    break
    return sol, policy, moves
