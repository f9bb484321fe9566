"""From the model's PackTables (emo.model.predict) to a Problem, with windows that repeat every
iteration: a frequency policy is one iteration's schedule, replayed from each iteration mark, so a
window is (clock group, offset from the iteration mark // change interval) over all traced iterations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import median_abs_deviation

from emo.graph.whatif import ROUNDING_TOLERANCE_NS
from emo.model.predict import iteration_marks as model_iteration_marks
from emo.optimize.problem import Items, Problem, build_problem, make_items, opens_pass, symmetric_groups

# The time tolerance never exceeds this fraction of the makespan: a trace whose iterations vary by
# more (data-loader stalls) says little about any one slowdown, and the budget is what the user asked.
MAX_TIME_TOLERANCE = 1e-3


@dataclass
class Timing:
    """Iteration marks of every GPU on the baseline timeline (caller's node order, ns)."""

    marks_ns: np.ndarray  # float64[D, I]
    period_ns: float  # mean iteration time at the default clock


def problem_from_tables(t, min_clock_fraction: float = 0.5) -> Problem:
    """A Problem over the compiled pack graph of `t` (a PackTables): the engine's lags and offsets,
    the predictor's own, so plan and check time the same graph the same way."""
    return build_problem(
        t.src,
        t.dst,
        t.device,
        t.dur_ns,
        t.energy_j,
        t.idle_power_w,
        t.clocks_mhz,
        from_start=t.from_start,
        lag_ns=t.lag_ns,
        offset_ns=t.offset_ns,
        min_clock_fraction=min_clock_fraction,
        default_mhz=int(t.clocks_mhz[t.default_index]),
    )


def baseline_timing(p: Problem, t) -> Timing:
    """Each GPU's iteration marks from the pack stage's anchors (host node + offset), at max clocks."""
    marks = iteration_marks(p, t, p.base_start)
    if marks is None:
        return Timing(np.zeros((p.devices, 1)), p.makespan0_ns)
    iters = marks.shape[1]
    period = float(np.mean(np.diff(marks, axis=1))) if iters > 1 else max(p.makespan0_ns - marks.min(), 1.0)
    return Timing(marks, period)


def iteration_marks(p: Problem, t, start_ns: np.ndarray) -> np.ndarray | None:
    """float64[D, I]: each GPU's iteration marks (emo.model.predict.iteration_marks) on the timeline
    `start_ns` (internal order); None without anchors."""
    if getattr(t, "anchors", None) is None or not len(t.anchors):
        return None
    start = np.empty(p.n)
    start[p.perm] = start_ns
    return model_iteration_marks(t, start)


def window_edges(
    p: Problem, timing: Timing, interval_ms: float, groups: list[list[int]], *, align: str = "grid"
) -> np.ndarray:
    """float64[G, W + 1]: the change points of each clock group, offsets from the iteration mark on
    the baseline timeline (ns), from 0 to the period; groups with fewer windows are padded with
    empty ones at the end.

    "grid": every `interval_ms`. "passes": at the starts of the group's passes (emo.optimize.problem
    .opens_pass: a GPU node that waits on another GPU or the host, such as a pipeline's forward and
    backward passes or the work after a collective), the first one at least `interval_ms` after the
    previous change point; where no pass starts within 1.5 intervals, at the first GPU work after one
    interval. Slack opens and closes where a GPU waits on something else, so windows that start there
    hold work of one kind instead of the tail of one pass and the head of the next, and windows
    start where work starts rather than in the middle of a pack. "pass": at every pass start, with
    no interval between them (one window per pass)."""
    if interval_ms <= 0:
        raise ValueError(f"optimizer.change_interval_ms must be > 0 (got {interval_ms})")
    step, period = interval_ms * 1e6, timing.period_ns
    if align == "grid":
        nwin = max(1, int(np.ceil(period / step)))
        return np.tile(np.minimum(np.arange(nwin + 1) * step, period), (len(groups), 1))
    if align not in ("passes", "pass"):
        raise ValueError(f"optimizer.change_points must be 'grid', 'passes' or 'pass' (got {align!r})")
    opens = np.empty(p.n, dtype=bool)
    opens[p.perm] = opens_pass(p)
    start = np.empty(p.n)
    start[p.perm] = p.base_start
    dev = np.empty(p.n, dtype=np.int64)
    dev[p.perm] = p.device
    rows = []
    for ds in groups:
        v = np.flatnonzero(dev == ds[0])
        m = timing.marks_ns[ds[0]]
        i = np.searchsorted(m, start[v], side="right") - 1
        keep = i >= 0
        off = start[v][keep] - m[i[keep]]
        order = np.argsort(off, kind="stable")
        off, op = off[order], opens[v][keep][order]
        nxt = np.r_[off[op], np.inf]  # pass starts, ascending
        e = [0.0]
        if align == "pass":  # one window per pass: every pass start, however close (the ablation of pass-level clocks)
            rows.append(e + sorted({c for c in off[op].tolist() if 0 < c < period}) + [period])
            continue
        for c, o in zip(off.tolist(), op.tolist()):
            if c <= 0 or c >= period or c - e[-1] < step:
                continue
            # a work start that opens no pass only when no pass opens within half an interval more
            if o or nxt[np.searchsorted(nxt, c, side="right")] - e[-1] > 1.5 * step:
                e.append(c)
        rows.append(e + [period])
    width = max(len(r) for r in rows)
    return np.array([r + [period] * (width - len(r)) for r in rows])


def planned_window_starts(sol, t, timing: Timing, edges_ns: np.ndarray) -> np.ndarray:
    """float64[G, W]: where each window of each clock group starts on the *planned* timeline, as an
    offset from the planned iteration mark (ns). The DP assigns nodes to windows by their baseline
    start (`edges_ns`, window_edges), but under its own clocks work runs later (up to the budget by
    the iteration's end), so a step placed at the baseline edge would land early and slow the
    previous window's tail. Each edge is carried through the plan's time warp: the shift (start
    planned - start at max clocks) of the group's first GPU's nodes, interpolated at the edge and
    averaged over the traced iterations. Padding windows (a group with fewer windows than another)
    start at infinity: never a step."""
    p, items = sol.problem, sol.items
    planned = _planned_marks(sol, t, timing)
    out = np.array(edges_ns[:, :-1], dtype=np.float64)
    for g, devs in enumerate(items.groups):
        d = devs[0]
        v = np.flatnonzero(p.device == d)  # internal order: sorted by baseline start
        if not len(v):
            continue
        xb = p.base_start[v]
        shift = sol.start_ns[v] - xb
        tb = timing.marks_ns[d][:, None] + edges_ns[g, :-1][None, :]  # [I, W] on the baseline timeline
        ts = tb + np.interp(tb, xb, shift)
        out[g] = np.mean(ts - planned[d][:, None], axis=0)
    out[:, 0] = 0.0
    out = np.maximum.accumulate(out, axis=1)
    out[np.diff(edges_ns, axis=1) <= 0] = np.inf
    return out


def planned_window_clear(sol, t, timing: Timing) -> np.ndarray:
    """float64[G, W]: when, on the planned timeline (offset from the planned iteration mark, ns), the
    packs of the window before each window have finished on the group's first GPU: the latest
    finish over the traced iterations (window 0 follows the previous iteration's last window, so
    its value is that window's finish minus the period, and may be negative). A slower clock that
    lands before then would stretch a pack the DP timed at the faster clock: down-steps wait for it.
    -inf where the window before holds no pack."""
    p, items = sol.problem, sol.items
    planned = _planned_marks(sol, t, timing)
    period = float(np.mean(np.diff(planned, axis=1))) if planned.shape[1] > 1 else timing.period_ns
    nwin = int(items.window.max()) + 1
    out = np.full((len(items.groups), nwin), -np.inf)
    is_pack = np.asarray(getattr(t, "is_pack", np.ones(p.n, dtype=bool)))[p.perm]  # internal order
    for g, devs in enumerate(items.groups):
        v = np.flatnonzero((p.device == devs[0]) & is_pack & (items.item_of >= 0))
        if not len(v):
            continue
        m = timing.marks_ns[devs[0]]
        i = np.searchsorted(m, p.base_start[v], side="right") - 1
        v, i = v[i >= 0], i[i >= 0]  # work before the first mark belongs to no traced iteration
        off = sol.finish_ns[v] - planned[devs[0]][i]
        np.maximum.at(out[g], items.window[items.item_of[v]], off)
    real = (
        (np.diff(items.edges_ns, axis=1) > 0).sum(axis=1)
        if items.edges_ns is not None
        else np.full(len(items.groups), nwin)
    )
    clear = np.full_like(out, -np.inf)
    clear[:, 1:] = out[:, :-1]
    clear[np.arange(len(items.groups)), 0] = out[np.arange(len(items.groups)), real - 1] - period
    return clear


def _planned_marks(sol, t, timing: Timing) -> np.ndarray:
    planned = iteration_marks(sol.problem, t, sol.start_ns)
    return np.zeros_like(timing.marks_ns) if planned is None else planned  # no anchors: one iteration from 0


def iteration_noise_ns(timing: Timing) -> float:
    """Run-to-run variability of one iteration's time in the trace: the robust standard deviation
    (scaled MAD, so a slow warm-up iteration does not dominate) of the mark-to-mark iteration times,
    averaged over GPUs per iteration; 0 with fewer than two full iterations traced."""
    lengths = np.diff(timing.marks_ns, axis=1)  # [D, I-1]: full iterations only (the tail differs per GPU)
    if lengths.shape[1] < 2:
        return 0.0
    return float(median_abs_deviation(lengths.mean(axis=0), scale="normal"))


def time_tolerance_ns(timing: Timing, makespan_ns: float, iteration_sd_ns: float | None = None) -> float:
    """How much later than its deadline a schedule may end and still count as on time, over the
    whole graph (all traced iterations): per iteration, the iteration time's own variability in the
    trace, at least the trace's timestamp resolution (what-if rounding). A predicted delay below it
    is not a slowdown anyone can measure or a replay can resolve, so with a budget of 0 ("no
    slowdown") a workload whose GPU is on the critical path but memory-bound (a clock step costs it
    microseconds per iteration) still gets lower clocks. At most MAX_TIME_TOLERANCE of the makespan.
    `iteration_sd_ns`: the spread measured over many iterations (the profile's baseline, through
    fit's check.json), which wins over the few a trace holds (their spread is a noisy estimate)."""
    iters = max(timing.marks_ns.shape[1], 1)
    noise = iteration_noise_ns(timing) if iteration_sd_ns is None else float(iteration_sd_ns)
    per_iteration = max(noise, float(ROUNDING_TOLERANCE_NS))
    return min(iters * per_iteration, MAX_TIME_TOLERANCE * makespan_ns)


def iteration_items(
    p: Problem, timing: Timing, interval_ms: float, *, replicate: bool = True, align: str = "grid"
) -> Items:
    """Items = (group, window of the iteration), windows by window_edges(align): node v of GPU g in
    iteration i (the last mark at or before its baseline start) falls in the window its offset
    (start - mark_i) is in. Work before the first mark is counted as the end of an iteration (it runs
    under the previous iteration's last steps)."""
    groups = symmetric_groups(p) if replicate else [[d] for d in range(p.devices)]
    edges = window_edges(p, timing, interval_ms, groups, align=align)
    real = (np.diff(edges, axis=1) > 0).sum(axis=1)  # each group's own windows; the rest is padding
    gdev = np.zeros(p.devices, dtype=np.int64)
    for g, ds in enumerate(groups):
        gdev[ds] = g
    start = np.empty(p.n)
    start[p.perm] = p.base_start
    dev = np.empty(p.n, dtype=np.int64)
    dev[p.perm] = p.device
    win = np.full(p.n, -1, dtype=np.int64)
    for g in range(p.devices):
        v = np.flatnonzero(dev == g)
        m = timing.marks_ns[g]
        i = np.searchsorted(m, start[v], side="right") - 1
        off = np.where(i >= 0, start[v] - m[np.maximum(i, 0)], start[v] - m[0] + timing.period_ns)
        win[v] = np.clip(np.searchsorted(edges[gdev[g]], off, side="right") - 1, 0, real[gdev[g]] - 1)
    # idle time each window covers: its share of the period, in every iteration
    iters = timing.marks_ns.shape[1]
    lens = np.diff(edges, axis=1) * iters
    lens[np.arange(len(groups)), real - 1] += max(
        0.0, p.makespan0_ns - iters * timing.period_ns
    )  # work outside the marked iterations
    items = make_items(p, interval_ms, windows=win, groups=groups, window_len_ns=lens)
    items.edges_ns = edges
    items.t0_ns = edges[items.group, items.window]
    return items
