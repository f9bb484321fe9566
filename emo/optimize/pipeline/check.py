"""The optimiser's final check: the policy's time and energy by the predictor the optimize stage
reports (emo.model.predict: the timing engine's clocked forward pass), in expectation over the
clock-request latencies calibrate measured (planning_latencies, expected), and the repair that raises windows until it is within the budget.

The DP times a node at the clock of the window its *baseline* (max-clock) start falls in. The policy
runs by the wall clock: when the DP's own slowdowns push a node (within slack) past a window
boundary, or a pack runs on past one, it runs at the next window's clock, and clock requests land
`transition_ms` after they are issued. Neither is charged by the DP, so a pick that meets the deadline
in the DP's model can end late.

The repair walks the predicted critical path: a slowed pack on it that runs (at its start or its
end) under a window slower than the clock the DP gave it gets that window raised to the DP's clock
(drift); when there is none, the slowed windows the critical path runs under go one clock step up;
when it runs under fast windows only (a raise into one landed late: a stall), the window before
each takes its clock, so there is no raise to wait for.
Each round raises at least one window; the loop is bounded by a count of rounds, never by time.
When the raises run out (or the rounds do) with the pick still late, the plan is shrunk toward the
max clock as a whole (`_shrink`: the largest on-time share of each window's way down), never
replaced by the max clock, which would drop the slack it found.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from emo.graph.whatif import critical_path
from emo.model.predict import iteration_marks, predict, predict_lanes, with_node_times
from emo.model.timelines import issue_plans
from emo.optimize.solution import Solution
from emo.policy import FrequencyPolicy

if TYPE_CHECKING:
    from emo.sections import OptimizerConfig


def _node_windows(
    tables, times_ns: np.ndarray, marks: np.ndarray, starts_ns: np.ndarray, group: np.ndarray, period_ns: float
) -> np.ndarray:
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


def deadline_ns(base, budget: float) -> float:
    """The latest predicted makespan within `budget` of the max-clock prediction `base`: the one
    on-time test of the final check, the budget search and the predictor polish."""
    return base.makespan_ns * (1.0 + budget)


# Strata of the measured latency distribution (cumulative probability): finer towards the top,
# where the rare long stalls are, since a late request costs nothing while slack absorbs it and
# then all at once (the cost is convex in the latency: one node for the whole tail would hide it).
STRATA = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 1.0)


@dataclass(frozen=True)
class Latencies:
    """The clock-request latencies (ms) a plan assumes. [lo, hi] is the range a raise is built for
    (schedule.build_policy issues it hi early); [down_lo, down_hi] the same for a lowering, which is
    delayed by down_hi - down_lo so that it lands inside its own window. `nodes` and `weights` are a
    quadrature over the raises' whole distribution, tail included, that the predictor averages over
    (expected): each node is the latency of every request to a faster clock, `down` that of every
    request to a slower one (None: the node's too). `own_nodes`/`own_weights`: the same for one
    GPU's own raise when `nodes` are the latest of several peers' (None: `nodes`): a GPU's clock
    follows its own request, while the group's time waits for the latest one.

    `scale`: (target MHz, factor) points: a request to clock f takes every figure above times the
    factor interpolated at f (1 without points). On hardware the latency depends on where the clock
    goes (the regulator settles longer for a target high on the voltage curve), so one lead for every
    step makes the raises to the top clocks late and the others early (planning_latencies)."""

    lo: float
    mean: float
    hi: float
    nodes: tuple[float, ...]
    weights: tuple[float, ...]
    down: float | None = None
    own_nodes: tuple[float, ...] | None = None
    own_weights: tuple[float, ...] | None = None
    down_lo: float | None = None  # None: lo
    down_hi: float | None = None  # None: hi
    scale: tuple[tuple[float, float], ...] = ()

    @classmethod
    def of(cls, lats) -> Latencies:
        """A Latencies, or a plain [min, max] (or (min, mean, max)) range: requests landing uniformly
        in it, Simpson's three nodes (its ends and middle)."""
        if isinstance(lats, cls):
            return lats
        lo, hi = float(min(lats)), float(max(lats))
        mid = 0.5 * (lo + hi)
        if hi == lo:
            return cls(lo, lo, hi, (lo,), (1.0,))
        return cls(lo, mid, hi, (lo, mid, hi), (1 / 6, 2 / 3, 1 / 6))

    def range(self) -> list[float]:
        """[min, mean, max], as the stage's summary records it."""
        return [round(x, 4) for x in (self.lo, self.mean, self.hi)]

    def factor(self, mhz):
        """The latency factor of a request to `mhz` (a number or an array)."""
        if not self.scale:
            return np.ones_like(np.asarray(mhz, dtype=np.float64))
        f, x = np.asarray(self.scale, dtype=np.float64).T
        return np.interp(np.asarray(mhz, dtype=np.float64), f, x)

    def lead(self, mhz: float, up: bool) -> float:
        """How far ahead of its window a request to `mhz` is issued: a raise its hi, a lowering its
        down_hi (build_policy places a lowering down_hi - down_lo into its window)."""
        return float(self.factor(mhz)) * (self.hi if up else self.down_hi if self.down_hi is not None else self.hi)

    def earliest(self, mhz: float, up: bool) -> float:
        """The planned range's min of a request to `mhz`: lo for a raise, down_lo for a lowering."""
        return float(self.factor(mhz)) * (self.lo if up else self.down_lo if self.down_lo is not None else self.lo)

    def spread(self, mhz: float) -> float:
        """down_hi - down_lo of a lowering to `mhz`: how far into its window it is placed."""
        lo = self.down_lo if self.down_lo is not None else self.lo
        hi = self.down_hi if self.down_hi is not None else self.hi
        return float(self.factor(mhz)) * (hi - lo)

    def at(self, node: float, clocks_mhz=None):
        """predict's transition_ms for one node: (up, down) latencies, or one for both; with `scale`
        and the tables' clocks, (up, down) per target clock (arrays over clocks_mhz)."""
        if self.scale and clocks_mhz is not None:
            f = self.factor(clocks_mhz)
            return node * f, (node if self.down is None else self.down) * f
        return node if self.down is None else (node, self.down)


def quadrature(samples_ms) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(nodes, weights): the mean of each STRATA slice of the sorted samples and its share of them."""
    x = np.sort(np.asarray(samples_ms, dtype=np.float64))
    n = len(x)
    cuts = sorted({int(round(q * n)) for q in STRATA})
    nodes, weights = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a:
            nodes.append(float(x[a:b].mean()))
            weights.append((b - a) / n)
    return tuple(nodes), tuple(weights)


MIN_DIRECTION_SAMPLES = 20  # fewer steps in one direction: plan both with every sample
MAX_OF_GRID = 2000  # points of the quantile grid the latest of several requests is read on


def latest_of(samples_ms: np.ndarray, peers: int) -> np.ndarray:
    """The distribution of the latest of `peers` requests, each landing after its own draw from
    `samples_ms`, as samples: the quantile function Q(u^(1/peers)) on an even grid of u (the max of
    k independent draws has CDF F^k). Peers that share a schedule wait for each other at every
    collective, so a raise is on time only when all of theirs are."""
    if peers <= 1:
        return samples_ms
    u = (np.arange(MAX_OF_GRID) + 0.5) / MAX_OF_GRID
    return np.quantile(samples_ms, u ** (1.0 / peers))


def planning_latencies(
    opt: OptimizerConfig, measured: dict | None, where: str = "calibration", peers: int = 1
) -> tuple[Latencies, str]:
    """(Latencies, where they come from): the clock-request latencies the optimizer plans with.

    optimizer.transition_ms, when set, overrides: requests land uniformly in that [min, max]
    (Latencies.of). Otherwise the calibration's measured distribution (emo.model.calibration.
    latency_summary): lo and hi are its optimizer.transition_percentiles (p10 and p90 by default),
    what a request is planned to land within. The quadrature covers every sample: a request to a
    faster clock takes each stratum's latency in turn (of the steps that went up), one to a slower
    clock the mean of the steps down within their planned range. A stall is a request's own bad
    luck, not a shift of the whole schedule: a late raise lengthens the slow stretch before it (onto
    the critical path once slack is used up), a late lowering only wastes a little energy; and a
    stalled request is superseded when a later one lands (the last one issued wins). No measurement
    and no override: a ValueError that names what to run."""
    if opt.transition_ms is not None:
        return Latencies.of(opt.transition_ms), "optimizer.transition_ms"
    samples = (measured or {}).get("samples") or []
    if not samples:
        raise ValueError(
            f"{where}: no clock-request latency measurement (a calibration from before EMO measured "
            "it, or from a device that cannot time clock requests): re-run the calibrate stage (emo run "
            "after removing that folder), or set optimizer.transition_ms=[min,max] (ms)"
        )
    assert measured is not None  # it has samples
    x, x_up, x_down, scale = _directions(measured)
    split = "raises on the steps up, lowerings on the steps down, " if x_up is not x else ""
    a, b = (float(v) for v in opt.transition_percentiles)
    lo, hi = (float(v) for v in np.percentile(x_up, [a, b]))
    down_lo, down_hi = (float(v) for v in np.percentile(x_down, [a, b]))
    nodes, weights = quadrature(latest_of(x_up, peers))  # a late lowering on one peer costs only its energy
    down = float(x_down[x_down <= down_hi].mean())
    latest = f", the latest of {peers} GPUs' raises" if peers > 1 else ""
    by_target = f", scaled by target clock over {len(scale)} bins" if scale else ""
    own = quadrature(x_up) if peers > 1 else (None, None)
    return (
        Latencies(
            lo,
            float(np.dot(nodes, weights)),
            hi,
            nodes,
            weights,
            down,
            own_nodes=own[0],
            own_weights=own[1],
            down_lo=down_lo,
            down_hi=down_hi,
            scale=scale,
        ),
        f"measured p{a:g}-p{b:g} of {len(x)} clock steps, {split}expectation over {len(nodes)} strata{latest}{by_target}",
    )


MIN_TARGET_SAMPLES = 20  # clock steps per bin of target clocks the latency factor is read on


def target_scale(x: np.ndarray, to: np.ndarray, up: np.ndarray) -> tuple[tuple[tuple[float, float], ...], np.ndarray]:
    """(scale, x / factor): how a request's latency depends on its target clock, as Latencies.scale
    points (the median target of each bin of MIN_TARGET_SAMPLES steps or more, its factor), and the
    samples with that dependence divided out. Latency is taken as direction times target (additive
    in the log), each read as medians (a stall moves neither) by backfitting the two in turn; the
    factors' median over the samples is 1. Fewer than two bins: no dependence, the samples as they are."""
    targets = np.unique(to)
    counts = np.array([(to == t).sum() for t in targets])
    bins, cur, n = [], [], 0
    for t, c in zip(targets, counts):
        cur.append(t)
        n += c
        if n >= MIN_TARGET_SAMPLES:
            bins.append(cur)
            cur, n = [], 0
    if cur and bins:
        bins[-1] += cur  # a short last bin joins the one below
    if len(bins) < 2:
        return (), x
    bin_of = np.empty(len(x), dtype=np.int64)
    for i, ts in enumerate(bins):
        bin_of[np.isin(to, ts)] = i
    f = np.ones(len(x))
    fb = np.ones(len(bins))
    for _ in range(10):  # rounds enough for the two sets of medians to settle
        d = np.empty(len(x))
        for side in (up, ~up):
            if side.any():
                d[side] = x[side] / np.median(x[side] / f[side])
        fb = np.array([np.median(d[bin_of == i]) for i in range(len(bins))])
        fb = np.maximum(fb / np.median(fb[bin_of]), 1e-3)
        f = fb[bin_of]
    points = tuple((float(np.median(to[bin_of == i])), round(float(fb[i]), 4)) for i in range(len(bins)))
    return points, x / f


def _directions(measured: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """(all, up, down, scale): measured latencies (ms), the target clock's factor (target_scale)
    divided out: a raise plans with the steps to a faster clock, a lowering with those to a slower
    one (on hardware a request's latency depends on its direction: the voltage moves first on the
    way up); all of them for a direction with too few samples. Without (from, to) pairs for every
    sample, no direction and no target dependence."""
    x = np.asarray(measured["samples"], dtype=np.float64)
    pairs = np.asarray(measured.get("pairs") or [], dtype=np.float64).reshape(-1, 2)
    if len(pairs) != len(x):
        return x, x, x, ()
    up = pairs[:, 1] > pairs[:, 0]
    scale, x = target_scale(x, pairs[:, 1], up)
    x_up = x[up] if up.sum() >= MIN_DIRECTION_SAMPLES else x
    x_down = x[~up] if (~up).sum() >= MIN_DIRECTION_SAMPLES else x
    return x, x_up, x_down, scale


# Leads a plan may take besides the planned range's max (optimizer.transition_percentiles' hi):
# percentiles of the measured raise latency. Issued that far ahead, a raise lands before the work that
# needs it more often, at the cost of running the end of the slower window before it at the faster
# clock; which pays depends on the plan, so each offline method plans at every lead and keeps its best.
LEAD_PERCENTILES = (95.0, 98.0)
# A longer lead replaces the p90 plan (on time) only when it predicts this share less energy: plans
# that close are told apart by the predictor's errors, and the least of them wins by its error (a
# winner's curse), where the gains of a lead that lands raises on time are a few percent.
LEAD_MIN_GAIN = 0.01
# The share of optimizer.predictor_evaluations each lead's plan is polished with before the pick;
# the kept lead's polish goes on with the rest.
LEAD_SCREEN_SHARE = 0.25


# EMO keeps a plan that changes the clock only when the predictor puts it this share of energy below
# the single-clock curve at its own predicted time. Nearer the curve its saving is one a slower clock
# makes too (time traded for energy, not slack), and the model's per-pack errors decide whether it lands
# above or below the measured curve; one clock risks no clock change.
CURVE_MIN_GAIN = 0.01


def below_curve(time_ns: float, energy_j: float, curve: list[tuple[float, float]]) -> float:
    """The share of energy a plan (predicted makespan, energy) saves against the single-clock curve,
    (makespan, energy) per clock: its front (each clock that spends less than every faster one; clocks
    that slack hides tie in time), interpolated at the plan's time and held at its ends beyond it."""
    t, e = np.asarray(curve, dtype=np.float64).T
    o = np.lexsort((e, t))
    t, e = t[o], e[o]
    front = e < np.minimum.accumulate(np.r_[np.inf, e[:-1]])
    return 1.0 - energy_j / float(np.interp(time_ns, t[front], e[front]))


def kept_lead(tries: list[tuple[float, bool]], min_gain: float = LEAD_MIN_GAIN) -> int:
    """Index of the lead to keep from (predicted energy, on time) per lead, the p90 plan first: the
    least energy on time (the least energy of all when none is on time), yet the p90 plan when it is
    on time and that saves less than min_gain of its energy."""
    best = min(range(len(tries)), key=lambda i: (not tries[i][1], tries[i][0]))
    e0, on_time0 = tries[0]
    return best if not on_time0 or e0 - tries[best][0] >= min_gain * e0 else 0


def lead_options(opt: OptimizerConfig, measured: dict | None, lats: Latencies) -> list[Latencies]:
    """`lats` and its variants with raises issued earlier: max at each LEAD_PERCENTILES of the
    measured raise latency above lats.hi (none with optimizer.transition_ms, which measures nothing).
    Only the lead changes; the quadrature a plan is judged by stays the same."""
    if opt.transition_ms is not None or not (measured or {}).get("samples"):
        return [lats]
    assert measured is not None  # it has samples
    _, x_up, _, _ = _directions(measured)
    his = [float(np.percentile(x_up, q)) for q in LEAD_PERCENTILES]
    return [lats] + [dataclasses.replace(lats, hi=h) for h in dict.fromkeys(his) if h > lats.hi]


def expected(tables, policy: FrequencyPolicy, lats):
    """The prediction of `policy` in expectation over the clock-request latencies (Latencies.of
    `lats`): time, energy, makespan and the per-GPU energies are the quadrature's weighted means; the
    node times (start_ns, finish_ns, for the critical path) are those of its slowest node. With
    `own_nodes` (peers sharing a schedule), time is the mean over the latest-of-peers latencies and
    energy the mean over each GPU's own, plus the peers' wait at idle power. What the stage reports,
    and the one on-time test of the budget search, the polish and the repair."""
    q = Latencies.of(lats)
    clocks = tables.clocks_mhz
    plans = issue_plans(tables, policy)  # the policy's requests, read once for every latency
    runs = predict_lanes(tables, policy, [q.at(x, clocks) for x in q.nodes], plans=plans, node_times=False)

    def mean(runs, weights, attr: str) -> float:  # clipped to the runs' range: equal runs give exactly their value
        w = np.asarray(weights) / np.sum(weights)
        x = np.asarray([getattr(r, attr) for r in runs], dtype=np.float64)
        return float(np.clip(np.dot(w, x), x.min(), x.max()))

    def per_gpu(runs, weights) -> dict:
        w = np.asarray(weights) / np.sum(weights)
        return {
            k: np.tensordot(w, [getattr(r, k) for r in runs], axes=1)
            for k in ("idle_per_device_j", "dynamic_per_device_j")
        }

    slow = with_node_times(tables, max(runs, key=lambda r: r.makespan_ns))  # the one whose node times are kept
    time: dict[str, Any] = {k: mean(runs, q.weights, k) for k in ("time_s", "makespan_ns")}  # Prediction's fields
    if q.own_nodes is None:
        energy: dict[str, Any] = {
            k: mean(runs, q.weights, k) for k in ("energy_j", "idle_energy_j", "dynamic_energy_j")
        }
        return dataclasses.replace(slow, **time, **energy, **per_gpu(runs, q.weights))
    # each GPU's clock follows its own raise; only the time waits for the group's latest: the energy
    # at the GPUs' own latencies, plus the wait for the latest peer at the GPUs' default-clock idle
    # power (the latest-of-peers latency for every GPU kept each one slow for as long as the slowest,
    # which on the hybrid TP2 x PP2 x DP2 predicted 0.8 points of ES more than its own latencies)
    own = predict_lanes(tables, policy, [q.at(x, clocks) for x in q.own_nodes], plans=plans, node_times=False)
    energy = {k: mean(own, q.own_weights, k) for k in ("energy_j", "idle_energy_j", "dynamic_energy_j")}
    wait_ns = max(time["makespan_ns"] - mean(own, q.own_weights, "makespan_ns"), 0.0)
    wait_j = wait_ns * 1e-9 * float(tables.idle_power_w[:, tables.default_index].sum())
    energy["energy_j"] += wait_j / max(slow.iterations, 1)
    energy["idle_energy_j"] += wait_j
    return dataclasses.replace(slow, **time, **energy, **per_gpu(own, q.own_weights))


def _raise_windows(choice: np.ndarray, ks: list[np.ndarray], want: np.ndarray, nwin: int, ref: int, info: dict) -> bool:
    """One round's raise of `choice` (in place) for the critical packs, whose windows (at their start
    and end) are `ks`: a window below the clock the DP timed its pack at goes up to it (drift); with
    no drift, the slowed windows the path runs under go one clock up; when it runs under fast windows
    only, a raise into one landed late (a stall), so the window before it (its group's previous,
    wrapping) takes its clock. False: nothing left to raise."""
    raised = False
    for k in ks:
        low = choice[k] < want
        if low.any():
            np.maximum.at(choice, k[low], want[low])
            info["predictor_drift_raises"] += int(low.sum())
            raised = True
    if raised:
        return True
    under = np.unique(np.concatenate(ks))
    slow = under[choice[under] < ref]
    if len(slow):
        choice[slow] = np.minimum(choice[slow] + 1, ref)
        info["predictor_step_raises"] += len(slow)
        return True
    prev = np.where(under % nwin > 0, under - 1, under + nwin - 1)
    low = choice[prev] < choice[under]
    if not low.any():
        return False
    np.maximum.at(choice, prev[low], choice[under[low]])
    info["predictor_merge_raises"] = info.get("predictor_merge_raises", 0) + int(low.sum())
    return True


def fit_to_prediction(
    tables,
    sol: Solution,
    build,
    *,
    budget: float,
    interval_ms: float,
    period_ns: float,
    transitions_ms: Latencies | tuple[float, ...],
    max_rounds: int = 400,
    window_starts=None,
    shrink_steps: int = 8,
):
    """(solution, policy, info): `sol` with windows raised until predict(tables, policy) is within
    (1 + budget) × the predicted max-clock time in expectation over the clock-request latencies
    `transitions_ms` (expected). `build(sol) -> FrequencyPolicy` makes the policy; `window_starts(sol)` ->
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
        return expected(tables, policy, transitions_ms)

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
        wins = [
            _node_windows(tables, x, marks, edges, grp, period_ns)[crit]
            for x in (pred.start_ns, np.maximum(pred.finish_ns - 1.0, pred.start_ns))
        ]
        want = choice[item_of[crit]]  # the clock the DP timed each critical pack at
        if not _raise_windows(choice, [grp[crit] * nwin + w for w in wins], want, nwin, p.ref, info):
            break
        sol = Solution(p, items, choice.copy(), sol.method, sol.budget, info=sol.info)
        policy = build(sol)
        pred = worst(policy)
    if pred.makespan_ns > deadline:  # the raises ran out: shrink the plan toward the max clock
        sol, policy, pred, info["predictor_shrink"] = _shrink(sol, build, worst, deadline, shrink_steps)
    info["predictor_slowdown"] = pred.makespan_ns / base.makespan_ns - 1.0
    return sol, policy, info


def _shrink(sol: Solution, build, worst, deadline: float, steps: int):
    """(solution, policy, prediction, share): every window's clock moved a share of the way from the
    max clock to its planned one (rounded up to a candidate clock), the largest share on time by
    bisection in `steps` predictions. Share 0 is the max-clock policy, the baseline itself, which is on
    time by definition; keeping the plan's shape keeps the slack it found, where all-max drops it."""
    p, items = sol.problem, sol.items
    ref = p.clocks_mhz[p.ref]
    planned = p.clocks_mhz[sol.choice]

    def at(share: float):
        mhz = ref - share * (ref - planned)
        choice = np.minimum(np.searchsorted(p.clocks_mhz, mhz - 1e-6), p.ref).astype(np.int64)
        choice = np.where(sol.choice > p.ref, sol.choice, choice)  # above the default: left as planned
        s = Solution(p, items, choice, sol.method, sol.budget, info=sol.info)
        policy = build(s)
        return s, policy, worst(policy)

    lo, hi = 0.0, 1.0
    best = at(0.0)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        trial = at(mid)
        if trial[2].makespan_ns <= deadline:
            lo, best = mid, trial
        else:
            hi = mid
    return (*best, round(lo, 6))
