"""One entry point for the optimize stage and the benchmarks: PackTables + optimizer config + budget
-> (FrequencyPolicy, summary)."""
from __future__ import annotations

import time

import numpy as np

from emo.model.predict import predict
from emo.optimize.dp import optimize
from emo.optimize.perseus import optimize_perseus
from emo.optimize.policy import build_policy
from emo.optimize.problem import Items, Problem
from emo.optimize.solution import Solution
from emo.optimize.static import optimize_static
from emo.optimize.tables import (baseline_timing, iteration_items, planned_window_clear, planned_window_starts,
                                 problem_from_tables, time_tolerance_ns)
from emo.optimize.verify import deadline_ns, fit_to_prediction, polish_on_predictor, worst_case
from emo.policy import FrequencyPolicy

METHODS = ("emo", "static", "perseus")


def policy_device_ids(tables) -> list[int]:
    """The policy's device id of each dense GPU index: the rank when ranks tell GPUs apart (one GPU
    per rank), else the device index (one rank driving several GPUs)."""
    ranks = [k[0] for k in tables.device_keys]
    return ranks if len(set(ranks)) == len(ranks) else [k[1] for k in tables.device_keys]


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


def fit_budget(tables, solve_at, build, repair, budget: float, *, time_limit_s: float | None,
               transitions_ms: tuple[float, ...] = (5.0, 10.0, 15.0), tries: int = 6):
    """(solution, policy, info): the DP's pick at the largest budget whose policy keeps `budget` in
    the predictor's worst case (emo.optimize.verify.worst_case), least predicted energy among those.

    The DP charges neither clock transitions nor windows drifting on the wall clock, so its pick at
    the full budget may end a little late. Raising windows one by one until it fits (the repair)
    throws away far more energy than asking the DP again for a pick with that overshoot taken off
    its budget: a secant step (at least an eighth of the budget, and half the way down when the
    pick did not change) while every try is late, then bisection between the last late and the best
    on-time budget. `solve_at(budget, time_limit_s) -> Solution`; `repair(solution) -> (solution,
    policy, info)` finishes the last try when none fits."""
    t0 = time.perf_counter()
    base = predict(tables, None)
    deadline = deadline_ns(base, budget)
    lo, hi, b = 0.0, budget, budget
    best = None  # (predicted energy, DP budget, solution, policy, worst-case slowdown)
    info: dict = {"budget_tries": []}
    sol, last = None, b""
    for _ in range(tries):
        left = None if time_limit_s is None else max(0.1 * time_limit_s, time_limit_s - (time.perf_counter() - t0))
        sol = solve_at(b, left)
        policy = build(sol)
        worst = worst_case(tables, policy, transitions_ms).makespan_ns
        slowdown = worst / base.makespan_ns - 1.0
        info["budget_tries"].append([round(b, 6), round(slowdown, 6)])
        same, last = sol.choice.tobytes() == last, sol.choice.tobytes()
        if worst <= deadline:
            e = predict(tables, policy).energy_j
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
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            break
    if best is None:  # nothing fits: raise windows of the last (smallest) try until it does
        sol, policy, checked = repair(sol)
        info.update(checked)
    else:
        _, b, sol, policy, slowdown = best
        info.update({"dp_budget": round(b, 6), "predictor_slowdown": slowdown})
    sol.solve_s = time.perf_counter() - t0
    return sol, policy, {**sol.info, **info}


def solve(tables, opt: dict, budget: float, *, gpu: str) -> tuple[FrequencyPolicy, dict]:
    name = opt.get("name", "emo")
    if name not in METHODS:
        raise ValueError(f"optimizer.name: unknown offline method {name!r} (expected one of {', '.join(METHODS)})")
    if not 0 <= budget < 1:
        raise ValueError(f"budget: {budget} is not a fraction in [0, 1)")
    interval = float(opt.get("change_interval_ms", 20.0))
    min_interval = float(opt.get("min_interval_ms", 10.0))
    if interval < min_interval:
        raise ValueError(f"optimizer.change_interval_ms ({interval}) is below optimizer.min_interval_ms ({min_interval})")
    p = problem_from_tables(tables, float(opt.get("min_clock_fraction", 0.5)))
    timing = baseline_timing(p, tables)
    items = iteration_items(p, timing, interval, align=str(opt.get("change_points", "passes")))
    # plan against the budget plus the iteration time's own noise (tables.time_tolerance_ns): with a
    # strict 0, microseconds of predicted delay would rule out every lower clock
    tolerance_ns = time_tolerance_ns(timing, p.makespan0_ns)
    plan_budget = budget + tolerance_ns / p.makespan0_ns
    extra: dict = {"budget": budget, "planning_budget": plan_budget, "time_tolerance_ms": tolerance_ns * 1e-6}
    tr = opt.get("transition_ms", [5.0, 15.0])
    lats = (float(tr[0]), 0.5 * (float(tr[0]) + float(tr[1])), float(tr[1]))  # the latencies every check covers

    def starts(s: Solution) -> np.ndarray:
        return planned_window_starts(s, tables, timing, items.edges_ns)

    def build(s: Solution) -> FrequencyPolicy:
        return build_policy(s, gpu, window_ms=interval, device_ids=policy_device_ids(tables),
                            transition_ms=(lats[0], lats[-1]), min_interval_ms=min_interval,
                            period_ms=timing.period_ns * 1e-6 * s.makespan_ns / p.makespan0_ns,
                            window_start_ms=starts(s) * 1e-6,
                            window_clear_ms=planned_window_clear(s, tables, timing) * 1e-6)

    def repair(s: Solution):
        return fit_to_prediction(tables, s, build, budget=plan_budget, interval_ms=interval,
                                 period_ns=timing.period_ns, transitions_ms=lats, window_starts=starts)

    if name == "emo":  # the final check: the stage's predictor (wall-clock windows, clock transitions)
        sol, policy, checked = fit_budget(
            tables, lambda b, limit: optimize(p, b, items=items, budget_step_ms=float(opt.get("budget_step_ms", 1.0)),
                                              time_limit_s=limit),
            build, repair, plan_budget, time_limit_s=opt.get("time_limit_s", 30.0), transitions_ms=lats)
        # every static schedule is an EMO schedule too: keep the best one when clock transitions (which
        # the DP does not charge) cost the windowed pick more than it saved
        uni, uni_policy, uni_checked = repair(Solution(p, items, optimize_static(p, plan_budget, items=items).choice,
                                                       "emo", plan_budget, info=sol.info))
        if predict(tables, uni_policy).energy_j < predict(tables, policy).energy_j:
            uni.solve_s = sol.solve_s
            sol, policy, checked = uni, uni_policy, {**checked, **uni_checked, "start_view": "uniform"}
        t1, solve_s = time.perf_counter(), sol.solve_s
        sol, policy, checked["predictor_moves"] = polish_on_predictor(
            tables, sol, build, budget=plan_budget, time_limit_s=float(opt.get("predictor_polish_s", 10.0)),
            transitions_ms=lats)
        sol.solve_s = solve_s + time.perf_counter() - t1
        checked["predictor_slowdown"] = worst_case(tables, policy, lats).makespan_ns / predict(tables, None).makespan_ns - 1.0
        extra.update(checked)
    elif name == "static":
        sol = optimize_static(p, plan_budget, items=items)
        extra["static_curve"] = sol.info.pop("static_curve")
        policy = build(sol)
    else:  # perseus: its per-unit clocks projected onto windows, then the same final check as EMO's
        raw = optimize_perseus(p, plan_budget, level=str(opt.get("perseus_level", "pass")))
        sol = Solution(p, items, project(raw, items), raw.method, plan_budget, info=dict(raw.info))
        sol.solve_s = raw.solve_s
        extra.update({"unprojected_energy_j": raw.energy_j, "unprojected_time_ms": raw.makespan_ns * 1e-6})
        sol, policy, checked = repair(sol)
        extra.update(checked)
    summary = {**sol.summary(), **extra, "packs": int(np.sum(tables.is_pack)), "nodes": int(p.n),
               "clocks": [int(c) for c in p.clocks_mhz], "steps": {str(d): len(s) for d, s in policy.steps.items()}}
    return policy, summary
