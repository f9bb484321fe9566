"""From the model's PackTables (emo.model.predict) to a Problem, with windows that repeat every
iteration: a frequency policy is one iteration's schedule, replayed from each iteration mark, so a
window is (clock group, offset from the iteration mark // change interval) over all traced iterations."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import median_abs_deviation

from emo.graph.whatif import ROUNDING_TOLERANCE_NS
from emo.optimize.problem import Items, Problem, build_problem, make_items

# The time tolerance never exceeds this fraction of the makespan: a trace whose iterations vary by
# more (data-loader stalls) says little about any one slowdown, and the budget is what the user asked.
MAX_TIME_TOLERANCE = 1e-3


@dataclass
class Timing:
    """Iteration marks of every GPU on the baseline timeline (caller's node order, ns)."""

    marks_ns: np.ndarray  # float64[D, I]
    period_ns: float  # mean iteration time at the default clock


def problem_from_tables(t, min_clock_fraction: float = 0.5) -> Problem:
    """A Problem over the pack graph of `t` (a PackTables), with the what-if's fixed delays."""
    delay = getattr(t, "delay_ns", None)
    if delay is None:  # the compiled what-if holds them in topological order
        delay = np.empty(len(t.device))
        delay[t.compiled.order] = t.compiled.delay
    return build_problem(t.src, t.dst, t.device, t.dur_ns, t.energy_j, t.idle_power_w, t.clocks_mhz,
                         from_start=t.from_start, delay_ns=delay, min_clock_fraction=min_clock_fraction,
                         default_mhz=int(t.clocks_mhz[t.default_index]))


def baseline_timing(p: Problem, t) -> Timing:
    """Each GPU's iteration marks from the pack stage's anchors (host node + offset), at max clocks."""
    start = np.empty(p.n)
    start[p.perm] = p.base_start
    D = p.devices
    a = getattr(t, "anchors", None)
    if a is None or not len(a):
        return Timing(np.zeros((D, 1)), p.makespan0_ns)
    iters = int(a.groupby("rank").size().max())
    marks = np.zeros((D, iters))
    for g, (rank, _) in enumerate(t.device_keys):
        r = a[a["rank"] == rank]
        if r.empty:
            r = a[a["rank"] == a["rank"].min()]
        r = r.sort_values("iteration")
        m = start[r["node"].to_numpy(np.int64)] + r["offset_ns"].to_numpy(np.float64)
        marks[g, :len(m)] = m
        marks[g, len(m):] = m[-1]
    period = float(np.mean(np.diff(marks, axis=1))) if iters > 1 else max(p.makespan0_ns - marks.min(), 1.0)
    return Timing(marks, period)


def iteration_noise_ns(timing: Timing) -> float:
    """Run-to-run variability of one iteration's time in the trace: the robust standard deviation
    (scaled MAD, so a slow warm-up iteration does not dominate) of the mark-to-mark iteration times,
    averaged over GPUs per iteration; 0 with fewer than two full iterations traced."""
    lengths = np.diff(timing.marks_ns, axis=1)  # [D, I-1]: full iterations only (the tail differs per GPU)
    if lengths.shape[1] < 2:
        return 0.0
    return float(median_abs_deviation(lengths.mean(axis=0), scale="normal"))


def time_tolerance_ns(timing: Timing, makespan_ns: float) -> float:
    """How much later than its deadline a schedule may end and still count as on time, over the
    whole graph (all traced iterations): per iteration, the iteration time's own variability in the
    trace, at least the trace's timestamp resolution (what-if rounding). A predicted delay below it
    is not a slowdown anyone can measure or a replay can resolve, so with a budget of 0 ("no
    slowdown") a workload whose GPU is on the critical path but memory-bound (a clock step costs it
    microseconds per iteration) still gets lower clocks. At most MAX_TIME_TOLERANCE of the makespan."""
    iters = max(timing.marks_ns.shape[1], 1)
    per_iteration = max(iteration_noise_ns(timing), float(ROUNDING_TOLERANCE_NS))
    return min(iters * per_iteration, MAX_TIME_TOLERANCE * makespan_ns)


def iteration_items(p: Problem, timing: Timing, interval_ms: float, *, replicate: bool = True) -> Items:
    """Items = (group, window of the iteration): node v of GPU g in iteration i (the last mark at or
    before its baseline start) falls in window (start - mark_i) // interval. Work before the first
    mark is counted as the end of an iteration (it runs under the previous iteration's last steps)."""
    if interval_ms <= 0:
        raise ValueError(f"optimizer.change_interval_ms must be > 0 (got {interval_ms})")
    step = interval_ms * 1e6
    start = np.empty(p.n)
    start[p.perm] = p.base_start
    dev = np.empty(p.n, dtype=np.int64)
    dev[p.perm] = p.device
    win = np.full(p.n, -1, dtype=np.int64)
    nwin = max(1, int(np.ceil(timing.period_ns / step)))
    for g in range(p.devices):
        v = np.flatnonzero(dev == g)
        m = timing.marks_ns[g]
        i = np.searchsorted(m, start[v], side="right") - 1
        off = np.where(i >= 0, start[v] - m[np.maximum(i, 0)], start[v] - m[0] + timing.period_ns)
        win[v] = np.clip((off // step).astype(np.int64), 0, nwin - 1)
    # idle time each window index covers: its share of the period, in every iteration
    iters = timing.marks_ns.shape[1]
    edges = np.minimum(np.arange(nwin + 1) * step, timing.period_ns)
    lens = np.diff(edges) * iters
    lens[-1] += max(0.0, p.makespan0_ns - iters * timing.period_ns)  # work outside the marked iterations
    return make_items(p, interval_ms, replicate=replicate, windows=win, window_len_ns=lens)
