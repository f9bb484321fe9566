"""The optimiser's final check: the policy's time and energy by the predictor the optimize stage
reports (emo.model.predict: the timing engine's clocked forward pass), at the configured clock-request
latencies, and the repair that raises windows until it is within the budget.

The DP times a node at the clock of the window its *baseline* (max-clock) start falls in. The policy
runs by the wall clock: when the DP's own slowdowns push a node (within slack) past a window
boundary, or a pack runs on past one, it runs at the next window's clock, and clock requests land
`transition_ms` after they are issued. Neither is charged by the DP, so a pick that meets the deadline
in the DP's model can end late (a 2-stage pipeline at budget 0: +0.8 % predicted, +1.4 % measured).

The repair walks the predicted critical path: a slowed pack on it that runs (at its start or its
end) under a window slower than the clock the DP gave it gets that window raised to the DP's clock
(drift); when there is none, the slowed windows the critical path runs under go one clock step up.
Each round raises at least one window, so the loop ends (at worst at the max-clock baseline); it
is bounded by a count of rounds, never by time.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from emo.graph.whatif import critical_path
from emo.model.predict import iteration_marks, predict
from emo.optimize.solution import Solution
from emo.policy import FrequencyPolicy, Step


def _node_windows(tables, times_ns: np.ndarray, marks: np.ndarray, starts_ns: np.ndarray, group: np.ndarray,
                  period_ns: float) -> np.ndarray:
    """Window index of each GPU node at `times_ns` (node id order): the last window of its clock
    group (`group`, per node) whose start (`starts_ns` [group, window], offsets from the GPU's last
    iteration mark) it has reached."""
    dev = tables.device
    win = np.full(len(dev), -1, dtype=np.int64)
    for g in range(marks.shape[0]):
        v = np.flatnonzero(dev == g)
        if not len(v):
            continue
        m = marks[g]
        i = np.searchsorted(m, times_ns[v], side="right") - 1
        off = np.where(i >= 0, times_ns[v] - m[np.maximum(i, 0)], times_ns[v] - m[0] + period_ns)
        win[v] = np.maximum(np.searchsorted(starts_ns[group[v[0]]], off, side="right") - 1, 0)
    return win


def pessimistic(policy: FrequencyPolicy, spread_ms: float) -> FrequencyPolicy:
    """The policy as the device may apply it at worst, timed at the mean latency: every up-step
    lands spread/2 later (its request took the longest) and every down-step spread/2 earlier (the
    shortest) than the mean would have it."""
    steps = {}
    for d, ss in policy.steps.items():
        ss = sorted(ss, key=lambda s: s.t_ms)
        out = []
        for i, s in enumerate(ss):
            prev = ss[i - 1].sm_mhz  # the first step follows the previous iteration's last one
            shift = 0.0 if len(ss) == 1 else (0.5 * spread_ms if s.sm_mhz > prev else -0.5 * spread_ms)
            out.append(Step(max(0.0, s.t_ms + shift) if i else s.t_ms, s.sm_mhz))
        steps[d] = out
    return dataclasses.replace(policy, steps=steps)


def deadline_ns(base, budget: float) -> float:
    """The latest predicted makespan within `budget` of the max-clock prediction `base`: the one
    on-time test of the final check, the budget search and the predictor polish."""
    return base.makespan_ns * (1.0 + budget)


def latencies(transition_ms) -> tuple[float, float, float]:
    """(min, mean, max) of a clock-request latency range [min, max]: the latencies every check
    covers, the mean being the one the stage reports."""
    lo, hi = float(transition_ms[0]), float(transition_ms[-1])
    return lo, 0.5 * (lo + hi), hi


def planning_latencies(opt: dict, measured: dict | None, where: str = "calibration") -> tuple[tuple[float, float, float], str]:
    """((min, mean, max), where they come from): the clock-request latencies the optimizer plans with.

    optimizer.transition_ms, when set, overrides (its midpoint as the mean). Otherwise the
    calibration's measured distribution (emo.model.calibration.latency_summary): min and max are its
    optimizer.transition_percentiles (p10 and p90 by default), the mean its sample mean (clipped to
    that range). [min, max] is what a request is planned to land within: schedule.build_policy issues
    every step max ahead and delays down-steps by max - min, and check.worst_case holds the budget at
    both ends; a request outside it lands late (or early) only by its distance from the end, so the
    outer tails cost little time, where planning for them would drop every short slower window. No
    measurement and no override: a ValueError that names what to run."""
    if opt.get("transition_ms") is not None:
        return latencies(opt["transition_ms"]), "optimizer.transition_ms"
    samples = (measured or {}).get("samples") or []
    if not samples:
        raise ValueError(f"{where}: no clock-request latency measurement (a calibration from before EMO measured "
                         "it, or from a device that cannot time clock requests): re-run the calibrate stage (emo run "
                         "after removing that folder), or set optimizer.transition_ms=[min,max] (ms)")
    a, b = (float(x) for x in opt.get("transition_percentiles", (10.0, 90.0)))
    lo, hi = (float(v) for v in np.percentile(np.asarray(samples, dtype=np.float64), [a, b]))
    mean = min(max(float(np.mean(samples)), lo), hi)
    return (lo, mean, hi), f"measured p{a:g}-p{b:g} of {len(samples)} clock steps"


def expected(tables, policy: FrequencyPolicy, transitions_ms: tuple[float, ...]):
    """The prediction of `policy` at the mean latency (what the stage reports): the middle of a
    (min, mean, max) triple, else the midpoint of the range."""
    t = tuple(transitions_ms)
    mean = t[1] if len(t) == 3 else 0.5 * (min(t) + max(t))
    return predict(tables, policy, transition_ms=mean)


def worst_case(tables, policy: FrequencyPolicy, transitions_ms: tuple[float, ...]):
    """The slowest prediction of `policy` over the clock-request latencies (a request lands anywhere
    in [min, max]: the stage reports the mean, the device may take either end)."""
    lo, hi = min(transitions_ms), max(transitions_ms)
    runs = [predict(tables, policy, transition_ms=x) for x in transitions_ms]
    runs.append(predict(tables, pessimistic(policy, hi - lo), transition_ms=0.5 * (lo + hi)))
    return max(runs, key=lambda r: r.makespan_ns)


def fit_to_prediction(tables, sol: Solution, build, *, budget: float, interval_ms: float, period_ns: float,
                      transitions_ms: tuple[float, ...], max_rounds: int = 400, window_starts=None):
    """(solution, policy, info): `sol` with windows raised until predict(tables, policy) is within
    (1 + budget) × the predicted max-clock time for every clock-request latency in `transitions_ms`
    (worst_case). `build(sol) -> FrequencyPolicy` makes the policy; `window_starts(sol)` ->
    [group, window] offsets (ns) where it puts each window (default: the items' change points on the
    baseline timeline, else every `interval_ms`)."""
    p, items = sol.problem, sol.items
    c = tables.compiled
    base = predict(tables, None)
    deadline = deadline_ns(base, budget)
    nwin = int(items.window.max()) + 1
    # items are (group, window) with every window present: item = group * nwin + window
    if not np.array_equal(items.group * nwin + items.window, np.arange(items.k)):
        raise ValueError("fit_to_prediction: items are not (group, window) over every window")
    inv = np.empty(p.n, dtype=np.int64)
    inv[p.perm] = np.arange(p.n)
    item_of = items.item_of[inv]  # node id order
    gpu = tables.device >= 0
    grp = np.where(gpu, items.group_of_device[np.maximum(tables.device, 0)], -1)
    lag = c.lag.astype(np.float64)
    choice = sol.choice.copy()
    info = {"predictor_rounds": 0, "predictor_drift_raises": 0, "predictor_step_raises": 0}

    def worst(policy):
        return worst_case(tables, policy, transitions_ms)

    def starts(s: Solution) -> np.ndarray:
        if window_starts is not None:
            return window_starts(s)
        if items.edges_ns is not None:  # the baseline change points
            return items.edges_ns[:, :-1]
        return np.tile(np.arange(nwin) * interval_ms * 1e6, (len(items.groups), 1))

    policy = build(sol)
    pred = worst(policy)
    info["predictor_slowdown_before"] = pred.makespan_ns / base.makespan_ns - 1.0
    while pred.makespan_ns > deadline and info["predictor_rounds"] < max_rounds:
        info["predictor_rounds"] += 1
        crit_pos = critical_path(c.indptr, c.src, c.from_start, lag, pred.start_ns[c.order], pred.finish_ns[c.order])
        crit = c.order[crit_pos]
        crit = crit[gpu[crit] & tables.is_pack[crit] & (item_of[crit] >= 0)]
        marks = iteration_marks(tables, pred.start_ns)
        edges = starts(sol)
        wins = [_node_windows(tables, x, marks, edges, grp, period_ns)[crit]
                for x in (pred.start_ns, np.maximum(pred.finish_ns - 1.0, pred.start_ns))]
        want = choice[item_of[crit]]  # the clock the DP timed each critical pack at
        raised = False
        for w in wins:
            k = grp[crit] * nwin + w
            low = choice[k] < want
            if low.any():
                np.maximum.at(choice, k[low], want[low])
                info["predictor_drift_raises"] += int(low.sum())
                raised = True
        if not raised:  # no drift on the critical path: speed up the slowed windows it runs under
            ks = np.unique(np.concatenate([grp[crit] * nwin + w for w in wins]))
            ks = ks[choice[ks] < p.ref]
            if len(ks) == 0:
                break
            choice[ks] = np.minimum(choice[ks] + 1, p.ref)
            info["predictor_step_raises"] += len(ks)
        sol = Solution(p, items, choice.copy(), sol.method, sol.budget, info=sol.info)
        policy = build(sol)
        pred = worst(policy)
    if pred.makespan_ns > deadline:  # the max-clock policy is the baseline itself
        info["predictor_fallback"] = "max clock"
        sol = Solution(p, items, np.full(items.k, p.ref, dtype=np.int64), sol.method, sol.budget, info=sol.info)
        policy = build(sol)
        pred = worst(policy)
    info["predictor_slowdown"] = pred.makespan_ns / base.makespan_ns - 1.0
    return sol, policy, info
