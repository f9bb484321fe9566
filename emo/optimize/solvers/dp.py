"""EMO's optimiser, the paper's Algorithm 2: dynamic programming over (change point, end-to-end time).

1. Change points every `change_interval_ms` of the max-clock timeline cut each clock group's
   timeline into windows (items); each item takes one clock ≥ min_clock_fraction × max.
2. A local what-if pass per item and clock gives the end-to-end delay of running that item alone at
   that clock (the slack it can absorb is used for free), discretised to `budget_step_ms`.
3. A DP over the items in change-point order and the end-to-end time used so far gives, for every
   delay t ≤ budget, the least energy (a multiple-choice knapsack, O(items · clocks · budget/step)).
4. Delays of windows that share the same slack do not add up. The DP's pick is therefore checked
   with a full what-if pass; if the iteration ends late, the DP's own table is read again at a
   smaller budget (no re-solve), and as a last resort clocks on the critical path are raised.
   A crash start (every item at its least-energy clock, the critical path sped up where that costs
   least) joins the DP's picks.
4b. The LP relaxation (HiGHS): each item a convex mix of its clocks, the DAG's precedence exact, the
   makespan within the deadline. Where delays interact, as in a pipeline whose stages are all
   critical in turn, the DP's additive delays are either optimistic or wasteful, while the LP sees
   every path; rounding each item to the fastest clock it mixes keeps every node as short as in
   the LP, so the pick meets the deadline and loses only the few mixed items' rounding (per-pack
   pipelines: within 0.05 % of the MILP's best in 2 min, 1-2 % below lowtime). It is polished in
   addition to the DP's starts, never instead of one. Its size is bounded (`lp_max_size` columns
   and rows): on a big DAG it uses every k-th clock (rounding stays safe), and it is skipped when
   the DAG alone leaves less than half of that or fewer than 4 clocks would remain.
5. One local search from the best starts: moves are every item's best single clock change that
   keeps the deadline (found by local what-if passes, applied in non-overlapping batches, each
   batch verified), and, when none is left, a trade the single moves cannot see (raise one slowed
   critical item a step, re-read the DP around it, move again; kept if the energy drops).

Every limit is a count (starts, rounds, trades), never a duration: the same problem gives the same
schedule on an idle or a loaded machine. Every time comparison uses the engine's one tolerance.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from scipy.optimize import Bounds, LinearConstraint, milp

from emo.graph import whatif as engine
from emo.graph.whatif import TOLERANCE_NS as TOL_NS
from emo.optimize.problem import Items, Problem, durations, make_items
from emo.optimize.solution import Solution
from emo.optimize.solvers.milp import formulation

MIN_STEPS = 256

Start = tuple[float, str, np.ndarray]  # (energy, the view it came from, clock per item)


class View(NamedTuple):
    """A timeline that each item's delays are measured against, alone at each clock."""

    name: str
    dur: np.ndarray  # each node's duration at the max clock
    start: np.ndarray
    finish: np.ndarray
    latest_finish: np.ndarray  # the latest finish that keeps the view's makespan: finish + slack
    steps: int  # budget steps the DP may spend on top of this timeline


def optimize(
    p: Problem,
    budget: float,
    *,
    change_interval_ms: float = 20.0,
    budget_step_ms: float = 1.0,
    replicate: bool = True,
    items: Items | None = None,
    polish_rounds: int = 50,
    max_starts: int = 32,
    max_repairs: int = 3,
    polish_starts: int = 1,
    kicks: int = 20,
    crash_share: float = 0.5,
    lp_max_size: int = 250_000,
    search: bool = True,
) -> Solution:
    """The least-energy clock per (group, window) whose makespan stays within (1 + budget) × baseline.

    Counts bound the work: `max_starts` DP read-backs per view, `polish_starts` starts searched
    from, `polish_rounds` move rounds per search, `kicks` trades in all. `lp_max_size`: the most LP
    columns + rows (items × clocks + nodes + edges); 0 turns the LP start off. `search=False`: the
    best start alone (steps 1-4), for a caller whose own local search judges with another engine
    (the optimize stage's, on the predictor's clocked timeline).
    """
    if not search:
        polish_rounds, kicks = 0, 0
    if budget < 0:
        raise ValueError(f"budget must be >= 0 (got {budget})")
    if budget_step_ms <= 0:
        raise ValueError(f"optimizer.budget_step_ms must be > 0 (got {budget_step_ms})")
    items = items or make_items(p, change_interval_ms, replicate=replicate)
    deadline = p.makespan0_ns * (1.0 + budget)
    step = budget_step_ns(p, budget, budget_step_ms)
    info: dict = {"dp_tries": 0, "critical_repairs": 0, "polish_rounds": 0, "polish_moves": 0}
    B = int(np.floor((deadline - p.makespan0_ns) / step + 1e-9))
    info["budget_steps"] = B
    info["budget_step_ms"] = step * 1e-6
    views = delay_views(p, budget, deadline, step, B)
    useful = items.useful
    starts: list[Start] = []
    for view in views:  # 2.-4. the DP's picks in each view
        starts += _dp_starts(p, items, view, useful, deadline, step, max_starts, max_repairs, info)
    starts += _crash_start(p, items, deadline, crash_share, info)
    starts.sort(key=lambda s: s[0])
    lp = _bounded_lp_start(p, items, deadline, lp_max_size, info)
    if lp is not None:
        starts.insert(0, lp)
    choice, view_name = _best_polished(p, items, starts, deadline, polish_starts, polish_rounds, info)
    info["start_view"] = view_name
    if kicks:
        choice = _kick(p, items, choice, deadline, kicks, info, step)
    return Solution(p, items, choice, "emo", budget, info=info)


def budget_step_ns(p: Problem, budget: float, budget_step_ms: float) -> float:
    """The DP's time step (ns): `budget_step_ms`, or finer so that the budget holds MIN_STEPS steps
    (down to 1 µs), since rounding each window's delay up to a step wastes up to a step per slowed
    window."""
    if budget > 0:
        return min(budget_step_ms * 1e6, max(budget * p.makespan0_ns / MIN_STEPS, 1e3))
    return budget_step_ms * 1e6


def delay_views(p: Problem, budget: float, deadline: float, step: float, B: int) -> list[View]:
    """2. The max-clock schedule's views: its total slack (optimistic where windows share slack),
    its free slack (additive: always safe), and the free slack of the timeline stretched by a share
    of the budget, every GPU slowed at once as in a pipeline where all stages are critical in turn
    (additive again; the rest of the budget goes to the DP)."""
    dur_ref = p.dur_ns[:, p.ref].copy()
    s0, f0, T0 = p.base_start, p.base_finish, p.makespan0_ns
    views = [
        View("total", dur_ref, s0, f0, p.latest_finish(dur_ref, T0), B),
        View("free", dur_ref, s0, f0, engine.free_finish(*p.graph, dur_ref, s0, T0), B),
    ]
    for share in (0.5, 1.0) if budget > 0 else ():
        sc = 1.0 + share * budget
        ss = s0 * sc
        lf = engine.free_finish(*p.graph, dur_ref, ss, T0 * sc)
        views.append(
            View(f"stretch{share:g}", dur_ref, ss, ss + dur_ref, lf, int(np.floor((deadline - T0 * sc) / step + 1e-9)))
        )
    return views


def _dp_starts(
    p: Problem,
    items: Items,
    view: View,
    useful: np.ndarray,
    deadline: float,
    step: float,
    max_starts: int,
    max_repairs: int,
    info: dict,
) -> list[Start]:
    """3. The DP over one view's delays: every end-to-end delay it can reach, least energy first, read
    back as a start (`max_starts` at most); 4. a pick that ends late (shared slack) is repaired,
    `max_repairs` at most, and dropped if still late."""
    d = engine.local_delays(
        *p.graph,
        view.dur,
        view.start,
        view.finish,
        view.latest_finish - view.finish,
        p.dur_ns,
        items.item_of,
        items.lo,
        items.hi,
        np.arange(items.k),
        useful,
        view.steps * step + TOL_NS,
    )
    q = _quantise(d, step, view.steps)
    best, arg = knapsack(q, items.energy, view.steps)
    objective = best + items.ext_power_w * np.arange(view.steps + 1) * step * 1e-9
    order = np.argsort(objective, kind="stable")
    starts: list[Start] = []
    repairs = 0
    for t in order[np.isfinite(objective[order])][:max_starts]:
        cand = backtrack(q, arg, int(t))
        info["dp_tries"] += 1
        _, _, mk = p.forward(durations(p, items, cand))
        if mk > deadline + TOL_NS:  # shared slack: the pick ends late, repair it
            if repairs >= max_repairs:
                continue
            repairs += 1
            cand = repair_deadline(p, items, cand, deadline, info)
            _, _, mk = p.forward(durations(p, items, cand))
            if mk > deadline + TOL_NS:
                continue
        starts.append((items.total(cand, mk, p.makespan0_ns), view.name, cand))
    return starts


def _crash_start(p: Problem, items: Items, deadline: float, share: float, info: dict) -> list[Start]:
    """Crash from the slow end: every item at its least-energy clock, then the critical path sped up
    where it costs least (a greedy time-cost tradeoff, as Perseus walks it with min-cuts); none if late."""
    cand = repair_deadline(p, items, np.argmin(items.energy, axis=1), deadline, info, share=share)
    _, _, mk = p.forward(durations(p, items, cand))
    if mk <= deadline + TOL_NS:
        return [(items.total(cand, mk, p.makespan0_ns), "crash", cand)]
    return []


def lp_columns(p: Problem, items: Items, lp_max_size: int) -> np.ndarray | None:
    """4b. The clocks the LP may use within `lp_max_size` columns + rows: every one, or every k-th
    (with the default clock); None, to skip the LP, where the DAG alone leaves less than half of
    that or fewer than 4 clocks would remain."""
    room = lp_max_size - p.n - len(p.src)  # LP columns left for the clocks
    stride = int(np.ceil(items.k * p.n_clocks / max(room, 1)))  # every clock, or every stride-th
    cols = np.unique(np.r_[np.arange(p.n_clocks - 1, -1, -stride), p.ref])
    return cols if room >= 0.5 * lp_max_size and len(cols) >= min(4, p.n_clocks) else None


def _bounded_lp_start(p: Problem, items: Items, deadline: float, lp_max_size: int, info: dict) -> Start | None:
    """The LP relaxation, rounded (_lp_start): near-optimal where delays interact (pipelines); None
    where it is skipped (HiGHS takes too long on big problems), has no optimum, or ends late."""
    cols = lp_columns(p, items, lp_max_size)
    if cols is None:
        return None
    cand = _lp_start(p, items, deadline, cols)
    if cand is None:
        return None
    _, _, mk = p.forward(durations(p, items, cand))
    if mk > deadline + TOL_NS:  # only with durations that rise with the clock
        cand = repair_deadline(p, items, cand, deadline, info)
        _, _, mk = p.forward(durations(p, items, cand))
    return (items.total(cand, mk, p.makespan0_ns), "lp", cand) if mk <= deadline + TOL_NS else None


def _best_polished(
    p: Problem, items: Items, starts: list[Start], deadline: float, polish_starts: int, rounds: int, info: dict
) -> tuple[np.ndarray, str]:
    """5. Polish the LP's start and the best `polish_starts` others (each pick once); the least
    energy wins, with the view it came from (all max clocks without any start)."""
    best_e, choice, view = np.inf, np.full(items.k, p.ref, dtype=np.int64), "max-clock"
    seen: set[bytes] = set()
    polished = 0  # DP and crash starts polished
    for _e0, v, cand in starts:
        if cand.tobytes() in seen or (v != "lp" and polished >= polish_starts):
            continue
        seen.add(cand.tobytes())
        polished += v != "lp"
        cand = _polish(p, items, cand, deadline, rounds, info)
        _, _, mk = p.forward(durations(p, items, cand))
        e = items.total(cand, mk, p.makespan0_ns)
        if e < best_e:
            best_e, choice, view = e, cand, v
    return choice, view


def _lp_start(p: Problem, items: Items, deadline: float, cols: np.ndarray) -> np.ndarray | None:
    """The LP relaxation (HiGHS, run to its optimum: no time limit) of milp.formulation over the
    clocks `cols`, each item then rounded to the fastest clock it uses: no node lasts longer than in
    the LP (durations fall with the clock), so the pick meets the deadline. None without an optimum."""
    c, A, lo, hi, lb, ub = formulation(p, items, deadline, cols)
    res = milp(c, constraints=LinearConstraint(A, lo, hi), bounds=Bounds(lb, ub), options={"disp": False})
    if res.status != 0 or res.x is None:
        return None
    C = len(cols)
    used = res.x[: items.k * C].reshape(items.k, C) > 1e-6
    return cols[C - 1 - np.argmax(used[:, ::-1], axis=1)].astype(np.int64)


def _quantise(d: np.ndarray, step: float, B: int) -> np.ndarray:
    """Delays in budget steps, rounded up; B + 1 (never fits) for what is past the budget."""
    q = np.full(d.shape, B + 1, dtype=np.int64)
    ok = d <= (B + 1) * step
    q[ok] = np.ceil(np.maximum(d[ok] - TOL_NS, 0.0) / step - 1e-9)
    return np.minimum(q, B + 1)


def repair_deadline(
    p: Problem, items: Items, choice: np.ndarray, deadline: float, info: dict, share: float = 0.5
) -> np.ndarray:
    """Raise clocks on the critical path until the iteration meets the deadline (all-max does):
    each round, the slowed critical items with the least energy per ns of critical time won back,
    enough of them to cover the overshoot, one clock step faster each."""
    choice = choice.copy()
    C = p.n_clocks
    while True:
        dur = durations(p, items, choice)
        s, f, mk = p.forward(dur)
        if mk <= deadline + TOL_NS:
            return choice
        lf = p.latest_finish(dur, mk)
        crit = np.flatnonzero((lf - f <= TOL_NS) & (items.item_of >= 0))
        crit = crit[choice[items.item_of[crit]] != p.ref]
        if len(crit) == 0:  # nothing slowed is critical: only with non-monotone durations
            info["critical_repairs"] += 1
            return np.full(items.k, p.ref, dtype=np.int64)
        ks, inv = np.unique(items.item_of[crit], return_inverse=True)
        cd = np.zeros((len(ks), C))
        np.add.at(cd, inv, p.dur_ns[crit])  # critical time of each slowed item at each clock
        cur = cd[np.arange(len(ks)), choice[ks]]
        # the nearest faster clock of each item (by its critical time), else the default
        faster = (cd < cur[:, None] - TOL_NS) & (np.arange(C)[None, :] > choice[ks][:, None])
        nxt = np.where(faster.any(axis=1), np.argmax(faster, axis=1), p.ref)
        gain = np.maximum(cur - cd[np.arange(len(ks)), nxt], TOL_NS)
        ratio = (items.energy[ks, nxt] - items.energy[ks, choice[ks]]) / gain
        order = np.argsort(ratio, kind="stable")
        # half the overshoot per round: won-back time rarely adds up (other paths take over)
        need = np.searchsorted(np.cumsum(gain[order]), share * (mk - deadline)) + 1
        take = order[:need]
        choice[ks[take]] = nxt[take]
        info["critical_repairs"] += len(take)


def _polish(
    p: Problem, items: Items, choice: np.ndarray, deadline: float, rounds: int, info: dict, frozen: int = -1
) -> np.ndarray:
    """Best single-item moves that keep the deadline, applied until none saves energy (at most
    `rounds` rounds)."""
    choice = choice.copy()
    rows = np.arange(items.k)
    for _ in range(rounds):
        info["polish_rounds"] += 1
        dur = durations(p, items, choice)
        s, f, mk = p.forward(dur)
        slack = p.latest_finish(dur, mk) - f
        useful = items.useful
        useful[rows, choice] = True
        d = engine.local_delays(
            *p.graph,
            dur,
            s,
            f,
            slack,
            p.dur_ns,
            items.item_of,
            items.lo,
            items.hi,
            rows,
            useful,
            deadline - mk + TOL_NS,
        )
        d = np.where(d <= TOL_NS, 0.0, d)
        cost = items.energy + items.ext_power_w * d * 1e-9  # a move that lengthens the iteration pays idle power
        cost[mk + d > deadline + TOL_NS] = np.inf
        if frozen >= 0:  # a kicked item stays where the kick put it
            cost[frozen] = np.inf
            cost[frozen, choice[frozen]] = items.energy[frozen, choice[frozen]]
        new = np.argmin(cost, axis=1)
        gain = items.energy[rows, choice] - cost[rows, new]
        movers = np.flatnonzero(gain > 1e-9 * max(1.0, float(items.energy[rows, choice].sum())) / items.k)
        if len(movers) == 0:
            break
        movers = movers[np.argsort(-gain[movers])]
        # a batch of moves whose spans do not overlap; verified as a whole, halved until it holds
        picked, last_hi = [], -1
        for k in movers[np.argsort(items.lo[movers], kind="stable")]:
            if items.lo[k] < 0 or items.lo[k] > last_hi:
                picked.append(k)
                last_hi = max(last_hi, items.hi[k])
        batch = np.array(sorted(picked, key=lambda k: -gain[k]), dtype=np.int64)
        base_e = items.total(choice, mk, p.makespan0_ns)
        while len(batch):
            trial = choice.copy()
            trial[batch] = new[batch]
            _, _, mk2 = p.forward(durations(p, items, trial))
            e2 = items.total(trial, mk2, p.makespan0_ns)
            if mk2 <= deadline + TOL_NS and e2 < base_e:
                choice = trial
                info["polish_moves"] += len(batch)
                break
            batch = batch[: len(batch) // 2] if len(batch) > 1 else batch[:0]
        else:
            break
    return choice


def _energy(p: Problem, items: Items, choice: np.ndarray) -> tuple[float, float]:
    _, _, mk = p.forward(durations(p, items, choice))
    e = items.total(choice, mk, p.makespan0_ns)
    return e, mk


def _redp(p: Problem, items: Items, choice: np.ndarray, deadline: float, step: float, frozen: int = -1) -> np.ndarray:
    """The DP again, around the current pick: delays against its free slack (additive) and its total
    slack (optimistic: read back at smaller budgets until the pick meets the deadline), the budget
    what is left of it. The best pick that saves energy wins."""
    dur = durations(p, items, choice)
    s, f, mk = p.forward(dur)
    B = max(0, int(np.floor((deadline - mk) / step + 1e-9)))
    best_e, _ = _energy(p, items, choice)
    out = choice
    for lf in (engine.free_finish(*p.graph, dur, s, mk), p.latest_finish(dur, mk)):
        useful = items.useful
        useful[np.arange(items.k), choice] = True
        d = engine.local_delays(
            *p.graph,
            dur,
            s,
            f,
            lf - f,
            p.dur_ns,
            items.item_of,
            items.lo,
            items.hi,
            np.arange(items.k),
            useful,
            B * step + TOL_NS,
        )
        q = _quantise(d, step, B)
        if frozen >= 0:
            q[frozen] = B + 1
            q[frozen, choice[frozen]] = 0
        best, arg = knapsack(q, items.energy, B)
        objective = best + items.ext_power_w * np.arange(B + 1) * step * 1e-9
        limit = B
        while limit >= 0:
            t = int(np.argmin(objective[: limit + 1]))
            if not np.isfinite(objective[t]):
                break
            cand = backtrack(q, arg, t)
            e1, mk1 = _energy(p, items, cand)
            if mk1 <= deadline + TOL_NS:
                if e1 < best_e:
                    best_e, out = e1, cand
                break
            limit = t - 1
    return out


def _kick(
    p: Problem, items: Items, choice: np.ndarray, deadline: float, kicks: int, info: dict, step: float
) -> np.ndarray:
    """Iterated local search: raise a slowed critical item one clock step, re-polish, keep if better."""
    best_e, _ = _energy(p, items, choice)
    info["kicks"] = info["kicks_kept"] = 0
    tried: set[tuple[bytes, int]] = set()
    stale, max_stale = 0, 20  # stop after this many trades in a row that saved nothing
    while info["kicks"] < kicks:
        dur = durations(p, items, choice)
        s, f, mk = p.forward(dur)
        lf = p.latest_finish(dur, mk)
        crit = (lf - f <= TOL_NS) & (items.item_of >= 0)
        ks = [k for k in np.unique(items.item_of[crit]) if choice[k] < p.n_clocks - 1]
        key = choice.tobytes()
        improved = False
        for k in ks:
            if (key, k) in tried or info["kicks"] >= kicks:
                continue
            tried.add((key, k))
            info["kicks"] += 1
            trial = choice.copy()
            trial[k] += 1
            trial = _redp(p, items, trial, deadline, step, frozen=k)
            trial = _polish(p, items, trial, deadline, 20, {"polish_rounds": 0, "polish_moves": 0}, frozen=k)
            e, mk2 = _energy(p, items, trial)
            if mk2 <= deadline + TOL_NS and e < best_e - 1e-12 * abs(best_e):
                best_e, choice, improved = e, trial, True
                info["kicks_kept"] += 1
                stale = 0
                break
            stale += 1
            if stale >= max_stale:
                break
        if not improved or stale >= max_stale:
            break
    return choice


@njit(cache=True)
def knapsack(q, cost, budget):
    """Multiple-choice knapsack: one option per item, Σ q ≤ budget, min Σ cost.

    Returns best[t] (min cost using exactly t units) and arg[k, t] (the option of item k on that
    optimum), to be read back by `backtrack`. O(K · C · budget).
    """
    K, C = q.shape
    inf = np.inf
    best = np.full(budget + 1, inf)
    best[0] = 0.0
    arg = np.full((K, budget + 1), -1, np.int16)
    nxt = np.empty(budget + 1)
    for k in range(K):
        nxt[:] = inf
        for t in range(budget + 1):
            b = best[t]
            if b == inf:
                continue
            for c in range(C):
                t2 = t + q[k, c]
                if t2 <= budget:
                    val = b + cost[k, c]
                    if val < nxt[t2]:
                        nxt[t2] = val
                        arg[k, t2] = c
        best[:] = nxt
    return best, arg


@njit(cache=True)
def backtrack(q, arg, t):
    K = arg.shape[0]
    choice = np.empty(K, np.int64)
    for k in range(K - 1, -1, -1):
        c = arg[k, t]
        choice[k] = c
        t -= q[k, c]
    return choice
