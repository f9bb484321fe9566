"""One entry point for the optimize stage and the benchmarks: PackTables + optimizer config + budget
-> (FrequencyPolicy, summary).

EMO: the DP (solvers.dp, Algorithm 2, with its local search) plans on the timing engine; the
predictor (the same engine with clock timelines, at the configured request latencies) checks the
pick: a budget search re-solves the DP at a smaller budget while the worst case ends late, the best
static schedule joins as a start, windows are raised if nothing fits, and single-window moves judged
by the predictor finish. The ablation perseus+emo-search gets the same budget search (lowtime's walk
re-solved, projected onto the windows) and the same predictor polish, with the same counts
(optimizer.budget_solves, optimizer.predictor_evaluations): it differs from EMO only in the solver
the search asks. The ablation emo-dp is the DP's pick alone; emo-pass and emo-grid are EMO on other
change points (their configs). Perseus itself runs online (emo.baselines.perseus). Every limit is a
count, so the same inputs give the same files.
"""

from __future__ import annotations

import numpy as np

from emo.methods import ABLATIONS, OFFLINE, ONLINE, method
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


def fit_budget(tables, solve_at, build, repair, budget: float, *, transitions_ms, solves: int = 6):
    """(solution, policy, info): the DP's pick at the largest budget whose policy keeps `budget` in
    the predictor's expectation over the clock-request latencies (check.expected), least predicted
    energy among those; at most
    `solves` DP solves.

    The DP charges neither clock transitions nor windows drifting on the wall clock, so its pick at
    the full budget may end a little late. Raising windows one by one until it fits (the repair)
    throws away far more energy than asking the DP again for a pick with that overshoot taken off
    its budget: a secant step (at least an eighth of the budget, and half the way down when the
    pick did not change) while every try is late, then bisection between the last late and the best
    on-time budget. `solve_at(budget) -> Solution`; `repair(solution) -> (solution, policy, info)`
    finishes the last try when none fits."""
    base = predict(tables, None)
    deadline = deadline_ns(base, budget)
    lo, hi, b = 0.0, budget, budget
    best = None  # (predicted energy, DP budget, solution, policy, worst-case slowdown)
    info: dict = {"budget_tries": []}
    sol, last = None, b""
    for _ in range(solves):
        sol = solve_at(b)
        policy = build(sol)
        pred = expected(tables, policy, transitions_ms)
        worst = pred.makespan_ns
        slowdown = worst / base.makespan_ns - 1.0
        info["budget_tries"].append([round(b, 6), round(slowdown, 6)])
        same, last = sol.choice.tobytes() == last, sol.choice.tobytes()
        if worst <= deadline:
            e = pred.energy_j
            if best is None or e < best[0]:
                best = (e, b, sol, policy, slowdown)
            lo = b
            if b >= budget or hi - lo <= 0.05 * budget:
                break
            b = 0.5 * (lo + hi)
        else:
            hi = b
            if b <= 0.0:
                break
            step = max(1.2 * (slowdown - budget), budget / 8)
            b = 0.5 * (lo + hi) if best is not None or same else max(lo, b - step)
    if best is None:  # nothing fits: raise windows of the last (smallest) try until it does
        sol, policy, checked = repair(sol)
        info.update(checked)
    else:
        _, b, sol, policy, slowdown = best
        info.update({"dp_budget": round(b, 6), "predictor_slowdown": slowdown})
    return sol, policy, {**sol.info, **info}


def solve(
    tables,
    opt: dict,
    budget: float,
    *,
    gpu: str,
    clock_latency: dict | None = None,
    iteration_sd_s: float | None = None,
) -> tuple[FrequencyPolicy, dict]:
    """The policy of method opt["name"] within `budget`, and its summary: the method's own record
    under "<method>." keys, the predictions under "predicted." (the stage's predictor, mean latency).
    `clock_latency`: the calibration's measured clock-request latency (check.planning_latencies:
    what the plan assumes unless optimizer.transition_ms overrides it); `iteration_sd_s`: one
    iteration's measured spread (tables.time_tolerance_ns). The policy carries its prediction, in
    expectation over the latencies it was planned with (check.expected)."""
    name = opt["name"]
    m = method(name)
    if m.online:
        raise ValueError(
            f"optimizer.name: {name!r} is not an offline method ({', '.join(OFFLINE)}); "
            f"{', '.join(ONLINE)} run online in validate"
        )
    if m.run is not None:  # a registered solver (emo.methods) plans by itself
        return m.run(tables, opt, budget, gpu=gpu, clock_latency=clock_latency, iteration_sd_s=iteration_sd_s)
    planner = ABLATIONS.get(name, name)  # an ablation runs its method's planner on its own config
    if not 0 <= budget < 1:
        raise ValueError(f"budget: {budget} is not a fraction in [0, 1)")
    interval, min_interval = float(opt["change_interval_ms"]), float(opt["min_interval_ms"])
    if interval < min_interval:
        raise ValueError(
            f"optimizer.change_interval_ms ({interval}) is below optimizer.min_interval_ms ({min_interval})"
        )
    p = problem_from_tables(tables, float(opt["min_clock_fraction"]))
    timing = baseline_timing(p, tables)
    items = iteration_items(p, timing, interval, align=str(opt["change_points"]))
    # a clock group's GPUs raise together and wait for each other at their collectives: a raise is
    # on time when the latest of theirs is
    lats, source = planning_latencies(opt, clock_latency, peers=max(len(g) for g in items.groups))
    # plan against the budget plus the iteration time's own noise (tables.time_tolerance_ns): with a
    # strict 0, microseconds of predicted delay would rule out every lower clock
    tolerance_ns = time_tolerance_ns(timing, p.makespan0_ns, None if iteration_sd_s is None else iteration_sd_s * 1e9)
    plan_budget = budget + tolerance_ns / p.makespan0_ns
    record: dict = {
        "planning_budget": plan_budget,
        "time_tolerance_ms": tolerance_ns * 1e-6,
        "transition_ms": lats.range(),
        "transition_source": source,
        "latency_quadrature": {
            "nodes_ms": [round(x, 4) for x in lats.nodes],
            "weights": [round(x, 6) for x in lats.weights],
        },
    }
    if lats.own_nodes is not None:  # the energy's: each GPU's own raise
        assert lats.own_weights is not None  # set with own_nodes (planning_latencies)
        record["latency_quadrature"].update(
            {
                "own_nodes_ms": [round(x, 4) for x in lats.own_nodes],
                "own_weights": [round(x, 6) for x in lats.own_weights],
            }
        )

    def starts(s: Solution) -> np.ndarray:
        assert items.edges_ns is not None  # iteration_items sets the change points
        return planned_window_starts(s, tables, timing, items.edges_ns)

    def build(s: Solution, lats: Latencies) -> FrequencyPolicy:
        return build_policy(
            s,
            gpu,
            window_ms=interval,
            device_ids=policy_device_ids(tables.device_keys),
            transition_ms=lats,
            min_interval_ms=min_interval,
            period_ms=timing.period_ns * 1e-6 * s.makespan_ns / p.makespan0_ns,
            window_start_ms=starts(s) * 1e-6,
            window_clear_ms=planned_window_clear(s, tables, timing) * 1e-6,
        )

    def repair(s: Solution, lats: Latencies):
        return fit_to_prediction(
            tables,
            s,
            lambda s2: build(s2, lats),
            budget=plan_budget,
            interval_ms=interval,
            period_ns=timing.period_ns,
            transitions_ms=lats,
            window_starts=starts,
        )

    def energy(policy: FrequencyPolicy, lats: Latencies) -> float:
        return expected(tables, policy, lats).energy_j

    def search(solve_at, lats: Latencies):  # the budget search over one method's solves, every method the same count
        return fit_budget(
            tables,
            solve_at,
            lambda s2: build(s2, lats),
            lambda s2: repair(s2, lats),
            plan_budget,
            transitions_ms=lats,
            solves=int(opt["budget_solves"]),
        )

    def polish(sol: Solution, policy: FrequencyPolicy, checked: dict, lats: Latencies, evaluations: int):
        """The same predictor polish for every method; a second call goes on from the first one's plan."""
        checked.setdefault("start_energy_j", energy(policy, lats))
        sol, policy, moves = polish_on_predictor(
            tables, sol, lambda s2: build(s2, lats), budget=plan_budget, evaluations=evaluations, transitions_ms=lats
        )
        checked["predictor_moves"] = checked.get("predictor_moves", 0) + moves
        checked["predictor_slowdown"] = (
            expected(tables, policy, lats).makespan_ns / predict(tables, None).makespan_ns - 1.0
        )
        checked["polished_energy_j"] = energy(policy, lats)
        return sol, policy, checked

    def plan(solve_at, lats: Latencies, evaluations: int):
        """(solution, policy, record): the method's budget search and `evaluations` of polish, raises
        issued lats.hi ahead."""
        sol, policy, checked = search(solve_at, lats)
        if planner == "emo":
            dp_energy = energy(policy, lats)
            # every static schedule is an EMO schedule too: start from the best one when clock transitions
            # (which the DP does not charge) cost the windowed pick more than it saved
            uni, uni_policy, uni_checked = repair(
                Solution(
                    p, items, optimize_static(p, plan_budget, items=items).choice, "emo", plan_budget, info=sol.info
                ),
                lats,
            )
            if energy(uni_policy, lats) < dp_energy:
                sol, policy, checked = uni, uni_policy, {**checked, **uni_checked, "start_view": "uniform"}
            checked["dp_energy_j"] = dp_energy  # which layer saved what
        else:
            checked["search_energy_j"] = energy(policy, lats)
        return polish(sol, policy, checked, lats, evaluations)

    def dp_at(b: float) -> Solution:
        return optimize(p, b, items=items, budget_step_ms=float(opt["budget_step_ms"]), search=False)

    def perseus_at(b: float) -> Solution:  # its per-unit clocks projected onto windows
        raw = optimize_perseus(p, b, level=str(opt["perseus_level"]))
        return Solution(
            p,
            items,
            project(raw, items),
            raw.method,
            b,
            info={**raw.info, "unprojected_energy_j": raw.energy_j, "unprojected_time_ms": raw.makespan_ns * 1e-6},
        )

    def single_clock_unless_clear(sol: Solution, policy: FrequencyPolicy, lats: Latencies, deadline: float):
        """EMO's plan, or the single clock the predictor puts least energy on time when the plan is
        within check.CURVE_MIN_GAIN of the single-clock curve at its own predicted time."""
        ones = [Solution(p, items, np.full(items.k, c), "emo", plan_budget, info=sol.info) for c in range(p.n_clocks)]
        policies = [build(s1, lats) for s1 in ones]
        preds = [expected(tables, pol, lats) for pol in policies]
        final = expected(tables, policy, lats)
        gain = below_curve(final.makespan_ns, final.energy_j, [(x.makespan_ns, x.energy_j) for x in preds])
        record["curve_gain"] = round(gain, 6)
        on_time = [c for c, x in enumerate(preds) if x.makespan_ns <= deadline]
        if gain >= CURVE_MIN_GAIN or not on_time:
            return sol, policy
        c = min(on_time, key=lambda c: preds[c].energy_j)
        record["single_clock_mhz"] = int(p.clocks_mhz[c])
        return ones[c], policies[c]

    if name == "emo-dp":  # the DP's pick at the planning budget as it is: what the DP alone saves
        sol = dp_at(plan_budget)
        record["dp_only"] = True
        policy = build(sol, lats)
    elif name == "static":
        sol = optimize_static(p, plan_budget, items=items)
        record["static_curve"] = sol.info.pop("static_curve")
        policy = build(sol, lats)
    else:
        # the lead: how far ahead raises are issued, which no solver sees (check.lead_options). The
        # method plans at the measured p90 with its own solves, then at each longer lead with those
        # same solves (the nearest at or below each budget the search asks for: the safe side), and
        # keeps the one check.kept_lead picks: every method the same leads, counts and rule
        solved: dict[float, Solution] = {}

        def first(b: float) -> Solution:
            if b not in solved:
                solved[b] = (dp_at if planner == "emo" else perseus_at)(b)
            return solved[b]

        def again(b: float) -> Solution:
            below = [x for x in solved if x <= b]
            return solved[max(below) if below else min(solved)]

        deadline = deadline_ns(predict(tables, None), plan_budget)
        options = lead_options(opt, clock_latency, lats)
        # each lead is judged after a screen share of the polish, and only the kept one gets the rest:
        # with three leads, 1.5 polishes' worth of predictions instead of three
        total = int(opt["predictor_evaluations"])
        screen = total if len(options) == 1 else int(total * LEAD_SCREEN_SHARE)
        tries, plans = [], []
        for i, option in enumerate(options):
            sol_i, policy_i, checked_i = plan(first if i == 0 else again, option, screen)
            pred = expected(tables, policy_i, option)
            tries.append([round(option.hi, 4), round(pred.energy_j, 6), pred.makespan_ns <= deadline])
            plans.append((option, sol_i, policy_i, checked_i))
        kept = kept_lead([(e, ok) for _, e, ok in tries])
        lats, sol, policy, checked = plans[kept]
        if kept:  # what the log and the summary say the plan assumed
            record["transition_source"] += f"; raises issued {lats.hi:.2f} ms ahead, a longer lead (check.kept_lead)"
        if total > screen:
            sol, policy, checked = polish(sol, policy, checked, lats, total - screen)
        record.update({**checked, "lead_tries": tries})
        if planner == "emo":
            sol, policy = single_clock_unless_clear(sol, policy, lats, deadline)
    record["transition_ms"] = lats.range()  # its max: the lead the plan kept
    policy.budget = budget  # the user's budget; the planning budget is in the summary
    pred = expected(tables, policy, lats)
    policy.predicted_time_s, policy.predicted_energy_j = pred.time_s, pred.energy_j
    planned = sol.summary()
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
        name: {
            k: v
            for k, v in {**planned, **record}.items()
            if k
            not in (
                "method",
                "budget",
                "feasible",
                "items",
                "clock_groups",
                "predicted_time_ms",
                "predicted_energy_j",
                "baseline_time_ms",
                "baseline_energy_j",
                "predicted_saving",
                "predicted_slowdown",
            )
        },
        "graph": {"packs": int(np.sum(tables.is_pack)), "nodes": int(p.n), "clocks": [int(c) for c in p.clocks_mhz]},
        "steps": {str(d): len(s) for d, s in policy.steps.items()},
    }
    return policy, summary
