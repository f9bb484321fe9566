"""The offline methods' contract and EMO's planner.

A planner (Planner) is an offline method's `run` (emo.methods): from a PlanContext it sets up the
stage's Setting (the Problem, its windows, the clock-request latencies it plans with, the planning
budget), asks `frontier` for candidates along the time-energy frontier and `pick` for the budget
point, as lowtime does, and `Setting.finish` turns the pick into the policy and the summary. A new
offline method subclasses Planner and writes `frontier` (and `pick` when least energy on time is not
its rule); docs/design.md §14.

EMO's planner (EmoPlanner) is one class whose steps are named methods: the DP (solvers.dp,
Algorithm 2) answers at each budget the budget search asks (`frontier`: the predictor, the same
engine with clock timelines at the configured request latencies, judges each pick; `pick`: least
predicted energy on time, else `repair` the last try), the best static schedule joins as a start
(`uniform_start`), single-window moves judged by the predictor finish (`polish`), the lead is chosen
among the measured latencies' percentiles (`choose_lead`) and a plan too close to the single-clock
curve gives way to the best single clock (`single_clock_unless_clear`). The ablations are its
options: perseus+emo-search is lowtime's walk (projected onto the windows) in the same search,
polish and lead with the same counts (optimizer.budget_solves, optimizer.predictor_evaluations);
emo-dp is the DP's pick alone; emo-pass and emo-grid are EMO on other change points (their configs).
Perseus itself runs online (emo.baselines.perseus). Every limit is a count, so the same inputs give
the same files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from emo.errors import ConfigError
from emo.methods import PlanContext
from emo.model.predict import predict
from emo.optimize.pipeline.check import (
    CURVE_MIN_GAIN,
    LEAD_SCREEN_SHARE,
    Latencies,
    below_curve,
    deadline_ns,
    expected,
    fit_to_prediction,
    kept_lead,
    lead_options,
    planning_latencies,
)
from emo.optimize.pipeline.schedule import build_policy
from emo.optimize.pipeline.search import polish_on_predictor
from emo.optimize.pipeline.tables import (
    baseline_timing,
    iteration_items,
    planned_window_clear,
    planned_window_starts,
    problem_from_tables,
    time_tolerance_ns,
)
from emo.optimize.problem import Items, Problem
from emo.optimize.solution import Solution
from emo.optimize.solvers.dp import optimize
from emo.optimize.solvers.perseus import optimize_perseus
from emo.optimize.solvers.static import optimize_static
from emo.policy import FrequencyPolicy, policy_device_ids

Checked = tuple[Solution, FrequencyPolicy, dict]  # a plan and what its search recorded


@dataclass
class Candidate:
    """One point of a planner's frontier: a clock per item (`choice`), its time and energy as the
    planner judged them, and whether it keeps the budget; `solution`, `policy`, the budget the solver
    was asked for and the predicted slowdown where the planner has them."""

    choice: np.ndarray
    time_ns: float
    energy_j: float
    on_time: bool
    solution: Solution | None = None
    policy: FrequencyPolicy | None = None
    budget: float = 0.0
    slowdown: float = 0.0


class Setting:
    """What every offline planner plans in (the optimize stage's setup): the Problem on the model's
    tables, its items (clock groups x windows), the clock-request latencies (`lats`), the planning
    budget (the user's plus the iteration time's own noise) and the method's record for the summary."""

    def __init__(self, ctx: PlanContext):
        opt, budget = ctx.opt, ctx.budget
        if not 0 <= budget < 1:
            raise ConfigError(f"budget: {budget} is not a fraction in [0, 1)")
        self.interval, self.min_interval = float(opt.change_interval_ms), float(opt.min_interval_ms)
        if self.interval < self.min_interval:
            raise ConfigError(
                f"optimizer.change_interval_ms ({self.interval}) is below optimizer.min_interval_ms "
                f"({self.min_interval})"
            )
        self.ctx, self.tables, self.opt, self.budget = ctx, ctx.tables, opt, budget
        self.p = p = problem_from_tables(ctx.tables, float(opt.min_clock_fraction))
        self.timing = baseline_timing(p, ctx.tables)
        self.items: Items = iteration_items(p, self.timing, self.interval, align=str(opt.change_points))
        # a clock group's GPUs raise together and wait for each other at their collectives: a raise is
        # on time when the latest of theirs is
        self.lats, source = planning_latencies(opt, ctx.clock_latency, peers=max(len(g) for g in self.items.groups))
        # The budget is relative to the measured run at the default clock, not to the model's prediction
        # of it (fit's check measured both), never looser than the prediction (a model that is slow at
        # the default clock may be as slow under the plan), and never stricter than the iteration's noise
        # (tables.time_tolerance_ns: with a strict 0, microseconds of predicted delay would rule out
        # every lower clock). A floor, not a term: the verdict's tolerance (PL_TOLERANCE_PCT) is room
        # for measuring, not for planning into (docs/optimize.md, "Time tolerance").
        sd = None if ctx.iteration_sd_s is None else ctx.iteration_sd_s * 1e9
        tolerance_ns = time_tolerance_ns(self.timing, p.makespan0_ns, sd)
        ratio = 1.0 if ctx.baseline_ratio is None else min(float(ctx.baseline_ratio), 1.0)
        self.plan_budget = max((1.0 + budget) * ratio - 1.0, tolerance_ns / p.makespan0_ns)
        lats = self.lats
        self.record: dict = {
            "planning_budget": self.plan_budget,
            "time_tolerance_ms": tolerance_ns * 1e-6,
            "baseline_ratio": ratio,
            "transition_ms": lats.range(),
            "transition_source": source,
            "latency_quadrature": {
                "nodes_ms": [round(x, 4) for x in lats.nodes],
                "weights": [round(x, 6) for x in lats.weights],
            },
        }
        if lats.own_nodes is not None:  # the energy's: each GPU's own raise
            assert lats.own_weights is not None  # set with own_nodes (planning_latencies)
            self.record["latency_quadrature"].update(
                {
                    "own_nodes_ms": [round(x, 4) for x in lats.own_nodes],
                    "own_weights": [round(x, 6) for x in lats.own_weights],
                }
            )

    def starts(self, s: Solution) -> np.ndarray:
        assert self.items.edges_ns is not None  # iteration_items sets the change points
        return planned_window_starts(s, self.tables, self.timing, self.items.edges_ns)

    def build(self, s: Solution, lats: Latencies | None = None) -> FrequencyPolicy:
        """The policy of solution `s`, raises issued `lats.hi` ahead (the setting's latencies by default)."""
        return build_policy(
            s,
            self.ctx.gpu,
            window_ms=self.interval,
            device_ids=policy_device_ids(self.tables.device_keys),
            transition_ms=self.lats if lats is None else lats,
            min_interval_ms=self.min_interval,
            period_ms=self.timing.period_ns * 1e-6 * s.makespan_ns / self.p.makespan0_ns,
            window_start_ms=self.starts(s) * 1e-6,
            window_clear_ms=planned_window_clear(s, self.tables, self.timing) * 1e-6,
        )

    def energy(self, policy: FrequencyPolicy, lats: Latencies) -> float:
        return expected(self.tables, policy, lats).energy_j

    def deadline_ns(self) -> float:
        """The predictor's deadline at the planning budget."""
        return deadline_ns(predict(self.tables, None), self.plan_budget)

    def solution(self, choice: np.ndarray, method: str, info: dict | None = None) -> Solution:
        return Solution(self.p, self.items, choice, method, self.plan_budget, info={} if info is None else info)

    def candidate(self, choice: np.ndarray, method: str, lats: Latencies | None = None) -> Candidate:
        """A clock per item as the predictor judges it, in expectation over the latencies (`lats`, the
        setting's by default), against the planning budget: a frontier point for any planner."""
        lats = self.lats if lats is None else lats
        sol = self.solution(choice, method)
        policy = self.build(sol, lats)
        pred = expected(self.tables, policy, lats)
        on_time = pred.makespan_ns <= self.deadline_ns()
        return Candidate(sol.choice, pred.makespan_ns, pred.energy_j, on_time, sol, policy, self.plan_budget)

    def finish(self, sol: Solution, policy: FrequencyPolicy, lats: Latencies) -> tuple[FrequencyPolicy, dict]:
        """The policy with its prediction (in expectation over `lats`, the latencies it was planned
        with) and the stage's summary: the method's record under its name, the plan's predictions."""
        name, budget, p, record = self.ctx.name, self.budget, self.p, self.record
        record["transition_ms"] = lats.range()  # its max: the lead the plan kept
        policy.budget = budget  # the user's budget; the planning budget is in the summary
        pred = expected(self.tables, policy, lats)
        policy.predicted_time_s, policy.predicted_energy_j = pred.time_s, pred.energy_j
        planned = sol.summary()
        own: tuple[str, ...] = ("method", "budget", "feasible", "items", "clock_groups", "predicted_time_ms")
        own += ("predicted_energy_j", "baseline_time_ms", "baseline_energy_j", "predicted_saving", "predicted_slowdown")
        summary = {
            "method": name,
            "budget": budget,
            "plan": {k: planned[k] for k in ("feasible", "items", "clock_groups")}
            | {
                "time_ms": planned["predicted_time_ms"],
                "energy_j": planned["predicted_energy_j"],
                "baseline_time_ms": planned["baseline_time_ms"],
                "baseline_energy_j": planned["baseline_energy_j"],
            },
            name: {k: v for k, v in {**planned, **record}.items() if k not in own},
            "graph": {
                "packs": int(np.sum(self.tables.is_pack)),
                "nodes": int(p.n),
                "clocks": [int(c) for c in p.clocks_mhz],
            },
            "steps": {str(d): len(s) for d, s in policy.steps.items()},
        }
        return policy, summary


class Planner:
    """An offline method: `frontier` yields candidates along the time-energy frontier, `pick` chooses
    the budget point (by default the least energy on time, else the fastest), `plan` turns it into a
    solution and its policy; calling the planner with a PlanContext runs the stage's whole step."""

    method = "planner"  # the Solution's method label

    def frontier(self, s: Setting) -> Iterator[Candidate]:
        raise NotImplementedError

    def pick(self, s: Setting, candidates: Iterable[Candidate]) -> Candidate:
        seen = list(candidates)
        on_time = [c for c in seen if c.on_time]
        if on_time:
            return min(on_time, key=lambda c: c.energy_j)
        return min(seen, key=lambda c: c.time_ns)

    def plan(self, s: Setting) -> tuple[Solution, FrequencyPolicy, Latencies]:
        best = self.pick(s, self.frontier(s))
        sol = best.solution or s.solution(best.choice, self.method)
        return sol, best.policy or s.build(sol), s.lats

    def __call__(self, ctx: PlanContext) -> tuple[FrequencyPolicy, dict]:
        s = Setting(ctx)
        return s.finish(*self.plan(s))


def project(sol: Solution, items: Items) -> np.ndarray:
    """A per-unit solution (Perseus) onto windows: each window takes the duration-weighted mean clock
    of its nodes, rounded up to a candidate clock (what a clock applier with ε can follow)."""
    p: Problem = sol.problem
    node_c = np.where(sol.items.item_of >= 0, sol.choice[np.maximum(sol.items.item_of, 0)], p.ref)
    gpu = items.item_of >= 0
    w = p.dur_ns[np.arange(p.n), node_c][gpu]
    num = np.zeros(items.k)
    den = np.zeros(items.k)
    np.add.at(num, items.item_of[gpu], w * p.clocks_mhz[node_c[gpu]])
    np.add.at(den, items.item_of[gpu], w)
    mean = np.where(den > 0, num / np.maximum(den, 1e-300), p.clocks_mhz[p.ref])
    return np.minimum(np.searchsorted(p.clocks_mhz, mean - 1e-6), p.n_clocks - 1)


def budget_tries(tables, solve_at, build, budget: float, *, transitions_ms, solves: int = 6) -> Iterator[Candidate]:
    """The budget search's frontier: the solver's pick at each budget it asks, judged by the predictor
    in expectation over the clock-request latencies (check.expected), at most `solves` solves.

    The DP charges neither clock transitions nor windows drifting on the wall clock, so its pick at
    the full budget may end a little late. Raising windows one by one until it fits (the repair)
    throws away far more energy than asking the DP again for a pick with that overshoot taken off
    its budget: a secant step (at least an eighth of the budget, and half the way down when the
    pick did not change) while every try is late, then bisection between the last late and the best
    on-time budget. `solve_at(budget) -> Solution`, `build(solution) -> FrequencyPolicy`."""
    base = predict(tables, None)
    deadline = deadline_ns(base, budget)
    lo, hi, b = 0.0, budget, budget
    fits, last = False, b""
    for _ in range(solves):
        sol = solve_at(b)
        policy = build(sol)
        pred = expected(tables, policy, transitions_ms)
        slowdown = pred.makespan_ns / base.makespan_ns - 1.0
        same, last = sol.choice.tobytes() == last, sol.choice.tobytes()
        on_time = pred.makespan_ns <= deadline
        yield Candidate(sol.choice, pred.makespan_ns, pred.energy_j, on_time, sol, policy, b, slowdown)
        if on_time:
            fits, lo = True, b
            if b >= budget or hi - lo <= 0.05 * budget:
                return
            b = 0.5 * (lo + hi)
        else:
            hi = b
            if b <= 0.0:
                return
            step = max(1.2 * (slowdown - budget), budget / 8)
            b = 0.5 * (lo + hi) if fits or same else max(lo, b - step)


def pick_budget_point(candidates: Iterable[Candidate], repair: Callable[[Solution], Checked]) -> Checked:
    """(solution, policy, info): the least predicted energy among the tries that keep the budget (the
    largest such budget, as the search goes); when none does, `repair(last try)` raises windows until
    it fits."""
    tries: list[list[float]] = []
    best: Candidate | None = None
    last: Candidate | None = None
    for c in candidates:
        tries.append([round(c.budget, 6), round(c.slowdown, 6)])
        last = c
        if c.on_time and (best is None or c.energy_j < best.energy_j):
            best = c
    info: dict = {"budget_tries": tries}
    if best is None:  # nothing fits: raise windows of the last (smallest) try until it does
        assert last is not None and last.solution is not None  # at least one try, from budget_tries
        sol, policy, checked = repair(last.solution)
        info.update(checked)
    else:
        assert best.solution is not None and best.policy is not None  # budget_tries sets both
        sol, policy = best.solution, best.policy
        info.update({"dp_budget": round(best.budget, 6), "predictor_slowdown": best.slowdown})
    return sol, policy, {**sol.info, **info}


def fit_budget(tables, solve_at, build, repair, budget: float, *, transitions_ms, solves: int = 6) -> Checked:
    """The budget search: pick_budget_point over budget_tries (the DP's pick at the largest budget
    whose policy keeps `budget` in the predictor's expectation, least predicted energy among those)."""
    tries = budget_tries(tables, solve_at, build, budget, transitions_ms=transitions_ms, solves=solves)
    return pick_budget_point(tries, repair)


class EmoPlanner(Planner):
    """EMO's planner; its options are the ablations. `solver`: "dp" (Algorithm 2) or "lowtime"
    (Perseus's walk, projected onto the windows); `search`: the budget search, polish and choice of
    lead (off: the solver's pick at the planning budget as it is); `uniform_start`: the best static
    schedule joins as a start; `single_clock`: the single-clock fallback."""

    method = "emo"

    def __init__(
        self, solver: str = "dp", *, search: bool = True, uniform_start: bool = True, single_clock: bool = True
    ):
        self.solver, self.search = solver, search
        self.uniform_start_on, self.single_clock_on = uniform_start, single_clock

    # ---------------------------------------------------------------- the solver
    def solve_at(self, s: Setting, b: float) -> Solution:
        """The solver's pick at budget `b`."""
        if self.solver == "dp":
            return optimize(s.p, b, items=s.items, budget_step_ms=float(s.opt.budget_step_ms), search=False)
        raw = optimize_perseus(s.p, b, level=str(s.opt.perseus_level))  # its per-unit clocks onto windows
        return Solution(
            s.p,
            s.items,
            project(raw, s.items),
            raw.method,
            b,
            info={**raw.info, "unprojected_energy_j": raw.energy_j, "unprojected_time_ms": raw.makespan_ns * 1e-6},
        )

    # ---------------------------------------------------------------- the contract
    def frontier(
        self, s: Setting, solve_at: Callable[[float], Solution] | None = None, lats: Latencies | None = None
    ) -> Iterator[Candidate]:
        """The budget search's tries (budget_tries), raises issued `lats.hi` ahead."""
        lats = s.lats if lats is None else lats
        at = solve_at or (lambda b: self.solve_at(s, b))
        yield from budget_tries(
            s.tables,
            at,
            lambda s2: s.build(s2, lats),
            s.plan_budget,
            transitions_ms=lats,
            solves=int(s.opt.budget_solves),
        )

    def pick(self, s: Setting, candidates: Iterable[Candidate]) -> Candidate:
        """The budget point of the search's tries (pick_budget_point; the repair when none fits)."""
        sol, policy, _ = pick_budget_point(candidates, lambda s2: self.repair(s, s2, s.lats))
        pred = expected(s.tables, policy, s.lats)
        return Candidate(sol.choice, pred.makespan_ns, pred.energy_j, True, sol, policy, s.plan_budget)

    # ---------------------------------------------------------------- the steps
    def budget_search(self, s: Setting, solve_at, lats: Latencies) -> Checked:
        """The budget search over the solver's picks (fit_budget), every solver the same count."""
        return fit_budget(
            s.tables,
            solve_at,
            lambda s2: s.build(s2, lats),
            lambda s2: self.repair(s, s2, lats),
            s.plan_budget,
            transitions_ms=lats,
            solves=int(s.opt.budget_solves),
        )

    def repair(self, s: Setting, sol: Solution, lats: Latencies) -> Checked:
        """Raise windows on the predicted critical path until the plan keeps the budget (check.fit_to_prediction)."""
        return fit_to_prediction(
            s.tables,
            sol,
            lambda s2: s.build(s2, lats),
            budget=s.plan_budget,
            interval_ms=s.interval,
            period_ns=s.timing.period_ns,
            transitions_ms=lats,
            window_starts=s.starts,
        )

    def uniform_start(self, s: Setting, found: Checked, lats: Latencies) -> Checked:
        """Every static schedule is an EMO schedule too: start from the best one when clock transitions
        (which the DP does not charge) cost the windowed pick more than it saved."""
        sol, policy, checked = found
        dp_energy = s.energy(policy, lats)
        static = optimize_static(s.p, s.plan_budget, items=s.items).choice
        uni, uni_policy, uni_checked = self.repair(s, s.solution(static, "emo", sol.info), lats)
        if s.energy(uni_policy, lats) < dp_energy:
            sol, policy, checked = uni, uni_policy, {**checked, **uni_checked, "start_view": "uniform"}
        checked["dp_energy_j"] = dp_energy  # which layer saved what
        return sol, policy, checked

    def polish(self, s: Setting, found: Checked, lats: Latencies, evaluations: int) -> Checked:
        """The same predictor polish for every solver; a second call goes on from the first one's plan."""
        sol, policy, checked = found
        checked.setdefault("start_energy_j", s.energy(policy, lats))
        sol, policy, moves = polish_on_predictor(
            s.tables,
            sol,
            lambda s2: s.build(s2, lats),
            budget=s.plan_budget,
            evaluations=evaluations,
            transitions_ms=lats,
        )
        checked["predictor_moves"] = checked.get("predictor_moves", 0) + moves
        checked["predictor_slowdown"] = (
            expected(s.tables, policy, lats).makespan_ns / predict(s.tables, None).makespan_ns - 1.0
        )
        checked["polished_energy_j"] = s.energy(policy, lats)
        return sol, policy, checked

    def plan_at_lead(self, s: Setting, solve_at, lats: Latencies, evaluations: int) -> Checked:
        """The budget search, the uniform start and `evaluations` of polish, raises issued lats.hi ahead."""
        found = self.budget_search(s, solve_at, lats)
        if self.uniform_start_on:
            found = self.uniform_start(s, found, lats)
        else:
            found[2]["search_energy_j"] = s.energy(found[1], lats)
        return self.polish(s, found, lats, evaluations)

    def choose_lead(self, s: Setting, deadline: float) -> tuple[Latencies, Checked]:
        """The lead: how far ahead raises are issued, which no solver sees (check.lead_options). The
        method plans at the measured p90 with its own solves, then at each longer lead with those
        same solves (the nearest at or below each budget the search asks for: the safe side), and
        keeps the one check.kept_lead picks: every method the same leads, counts and rule. Each lead
        is judged after a screen share of the polish, and only the kept one gets the rest: with three
        leads, 1.5 polishes' worth of predictions instead of three."""
        solved: dict[float, Solution] = {}

        def first(b: float) -> Solution:
            if b not in solved:
                solved[b] = self.solve_at(s, b)
            return solved[b]

        def again(b: float) -> Solution:
            below = [x for x in solved if x <= b]
            return solved[max(below) if below else min(solved)]

        options = lead_options(s.opt, s.ctx.clock_latency, s.lats)
        total = int(s.opt.predictor_evaluations)
        screen = total if len(options) == 1 else int(total * LEAD_SCREEN_SHARE)
        tries, plans = [], []
        for i, option in enumerate(options):
            found = self.plan_at_lead(s, first if i == 0 else again, option, screen)
            pred = expected(s.tables, found[1], option)
            tries.append([round(option.hi, 4), round(pred.energy_j, 6), pred.makespan_ns <= deadline])
            plans.append((option, found))
        kept = kept_lead([(e, ok) for _, e, ok in tries])
        lats, found = plans[kept]
        if kept:  # what the log and the summary say the plan assumed
            s.record["transition_source"] += f"; raises issued {lats.hi:.2f} ms ahead, a longer lead (check.kept_lead)"
        if total > screen:
            found = self.polish(s, found, lats, total - screen)
        s.record.update({**found[2], "lead_tries": tries})
        return lats, found

    def single_clock_unless_clear(
        self, s: Setting, sol: Solution, policy: FrequencyPolicy, lats: Latencies, deadline: float
    ) -> tuple[Solution, FrequencyPolicy]:
        """EMO's plan, or the single clock the predictor puts least energy on time when the plan is
        within check.CURVE_MIN_GAIN of the single-clock curve at its own predicted time."""
        p = s.p
        ones = [s.solution(np.full(s.items.k, c), "emo", sol.info) for c in range(p.n_clocks)]
        policies = [s.build(s1, lats) for s1 in ones]
        preds = [expected(s.tables, pol, lats) for pol in policies]
        final = expected(s.tables, policy, lats)
        gain = below_curve(final.makespan_ns, final.energy_j, [(x.makespan_ns, x.energy_j) for x in preds])
        s.record["curve_gain"] = round(gain, 6)
        on_time = [c for c, x in enumerate(preds) if x.makespan_ns <= deadline]
        if gain >= CURVE_MIN_GAIN or not on_time:
            return sol, policy
        c = min(on_time, key=lambda c: preds[c].energy_j)
        s.record["single_clock_mhz"] = int(p.clocks_mhz[c])
        return ones[c], policies[c]

    def plan(self, s: Setting) -> tuple[Solution, FrequencyPolicy, Latencies]:
        if not self.search:  # the solver's pick at the planning budget as it is: what the DP alone saves
            sol = self.solve_at(s, s.plan_budget)
            s.record["dp_only"] = True
            return sol, s.build(sol), s.lats
        deadline = s.deadline_ns()
        lats, (sol, policy, _) = self.choose_lead(s, deadline)
        if self.single_clock_on:
            sol, policy = self.single_clock_unless_clear(s, sol, policy, lats, deadline)
        return sol, policy, lats


EMO = EmoPlanner()
EMO_DP = EmoPlanner(search=False)  # emo-dp: no budget search, repair, uniform start, polish, lead or single clock
PERSEUS_EMO_SEARCH = EmoPlanner("lowtime", uniform_start=False, single_clock=False)  # perseus+emo-search
