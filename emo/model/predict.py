"""Predict a frequency policy's end-to-end time and energy: the what-if pass over the pack graph with
every pack's modelled time and energy at the clock its GPU runs at while it runs.

Inputs are artifacts: the pack-level graph and packs table (stage pack), the iteration anchors
(pack), and the fitted model table (stage fit). A pack of signature s measured at T_p (default clock)
takes T_p * time_s[s, f] / time_default_s[s] at clock f and adds T_p / time_default_s[s] *
dynamic_energy_j[s, f] above idle; other nodes (collectives, copies, host) keep their recorded
duration and add nothing above idle (their share is in the calibrated energy level). Every GPU pays
its idle power at its clock over the whole makespan.

The clock a GPU runs at follows the policy as the applier applies it (`clock_timelines`, from
emo.policy.issue_plan): relative to each iteration's start (the host's ProfilerStep mark,
`emo.graph.iterations`) every step is requested `lead_ms` before its time (wrapped into the previous
iteration by period_ms), and lands `transition_ms` later (the caller's latency); the last request wins,
and a pack that spans a change runs at each clock in turn (the timing engine's forward_clocked). Iteration marks move with the host, which waits for the GPU at synchronisations, so the
pass is repeated until the marks stop moving (two or three passes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from emo.graph.graph import Graph
from emo.graph.whatif import Compiled, compile_graph, forward_clocked, forward_clocked_lanes
from emo.model.fit import model_arrays
from emo.model.timelines import IssuePlans, issue_plans, timelines
from emo.policy import FrequencyPolicy, dense_index


@dataclass
class PackTables:
    """The optimiser's input: per node of the pack graph (node ids of `graph`) and per clock.

    clocks_mhz      int64[C]  ascending calibrated SM clocks; `default_index` is the default clock's column
    dur_ns          float64[N, C]  node duration at each clock (packs: modelled; others: recorded, constant)
    energy_j        float64[N, C]  energy ABOVE IDLE at each clock (packs: modelled dynamic energy;
                    constant 0 for non-pack nodes, whose energy above idle is folded into the level)
    device          int32[N]  dense GPU index 0..D-1 of GPU nodes, -1 for host nodes and rendezvous
    idle_power_w    float64[D, C]  idle power of each GPU at each clock (paid over the whole makespan)
    is_pack         bool[N]
    src, dst        int64[E]  edges of the pack graph; from_start bool[E] (start-to-start edge)
    lag_ns          int64[E]  the what-if's gap after each edge's constraint is met (launch latency,
                    queueing: emo.graph.whatif); offset_ns int64[N] the start of source nodes
    device_keys     (rank, device) of each dense GPU index; `policy_device` maps a policy's device id
                    (the GPU index, i.e. the rank on one node) to the dense index
    Energy of a schedule = sum over nodes of energy_j[node, clock] + sum over GPUs of
    idle_power_w[gpu, clock(t)] integrated over [0, makespan].
    """

    clocks_mhz: np.ndarray
    default_index: int
    dur_ns: np.ndarray
    energy_j: np.ndarray
    device: np.ndarray
    idle_power_w: np.ndarray
    is_pack: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    from_start: np.ndarray
    lag_ns: np.ndarray
    offset_ns: np.ndarray
    device_keys: list[tuple[int, int]]
    graph: Graph = field(repr=False)
    compiled: Compiled = field(repr=False)
    anchors: pd.DataFrame | None = field(default=None, repr=False)
    iterations: int = 1
    # caches of engine_arrays and anchor_arrays, made on first use
    _engine_arrays: tuple[np.ndarray, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _anchor_arrays: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)
    _default_pass: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def default_mhz(self) -> int:
        return int(self.clocks_mhz[self.default_index])

    def policy_device(self, gpu: int) -> int:
        """Dense index of a policy's device id (emo.policy.dense_index)."""
        return dense_index(self.device_keys, gpu)


def pack_tables(
    graph: Graph, packs: pd.DataFrame, model: pd.DataFrame, anchors: pd.DataFrame | None = None
) -> PackTables:
    """Build the tables from the pack-level graph, its packs table and the fitted model table."""
    m = model_arrays(model)
    nodes = graph.nodes
    n, c = len(nodes), len(m.clocks)
    rec = nodes["dur_ns"].to_numpy(np.float64)
    dur = np.repeat(rec[:, None], c, axis=1)
    energy = np.zeros((n, c))
    row = {s: i for i, s in enumerate(m.signatures)}
    missing = sorted(set(packs["signature"]) - set(row))
    if missing:
        raise ValueError(f"model: no fit for pack signature {missing[0]!r} ({len(missing)} missing)")
    node = packs["node"].to_numpy(np.int64)
    sig = np.array([row[s] for s in packs["signature"]], np.int64)
    t0 = m.time_s[:, list(m.clocks).index(m.default_mhz)]
    scale = packs["dur_ns"].to_numpy(np.float64) * 1e-9 / t0[sig]  # this pack's time / the signature's
    dur[node] = packs["dur_ns"].to_numpy(np.float64)[:, None] * (m.time_s[sig] / t0[sig][:, None])
    energy[node] = scale[:, None] * m.dynamic_energy_j[sig]
    is_pack = np.zeros(n, bool)
    is_pack[node] = True
    gpu = nodes["device"].to_numpy() >= 0
    keys = sorted(set(zip(nodes["rank"].to_numpy()[gpu].tolist(), nodes["device"].to_numpy()[gpu].tolist())))
    index = {k: i for i, k in enumerate(keys)}
    device = np.full(n, -1, np.int32)
    device[gpu] = [
        index[k] for k in zip(nodes["rank"].to_numpy()[gpu].tolist(), nodes["device"].to_numpy()[gpu].tolist())
    ]
    compiled = compile_graph(graph)
    lag = np.empty(len(graph.edges), np.int64)
    lag[compiled.edge_id] = compiled.lag
    offset = np.empty(n, np.int64)
    offset[compiled.order] = compiled.offset
    e = graph.edges
    iters = int(anchors.groupby("rank").size().max()) if anchors is not None and len(anchors) else 1
    return PackTables(
        m.clocks.astype(np.int64),
        list(m.clocks).index(m.default_mhz),
        dur,
        energy,
        device,
        np.repeat(m.idle_power_w[None, :], len(keys), axis=0),
        is_pack,
        e["src"].to_numpy(np.int64),
        e["dst"].to_numpy(np.int64),
        e["from_start"].to_numpy(bool),
        lag,
        offset,
        keys,
        graph,
        compiled,
        anchors,
        iters,
    )


def load_pack_tables(pack_dir: str | Path, fit_dir: str | Path) -> PackTables:
    """pack_tables from a pack stage folder and a fit stage folder."""
    pack_dir, fit_dir = Path(pack_dir), Path(fit_dir)
    anchors = pd.read_parquet(pack_dir / "iterations.parquet") if (pack_dir / "iterations.parquet").exists() else None
    return pack_tables(
        Graph.load(pack_dir),
        pd.read_parquet(pack_dir / "packs.parquet"),
        pd.read_parquet(fit_dir / "model.parquet"),
        anchors,
    )


# --------------------------------------------------------------------------- clock timelines
def clock_timelines(
    t: PackTables,
    policy: FrequencyPolicy | None,
    iter_start_ns: np.ndarray,
    transition_ms: float | tuple[Any, Any],
    end_ns: float = np.inf,
    plans: IssuePlans | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU, the piecewise-constant clock (column index) in what-if time as CSR arrays
    (ptr [D+1], t [.], ci [.]: clock ci from t on). iter_start_ns [D, K]: each GPU's iteration marks.

    The requests are those of emo.policy's `issue_plan` (the applier's plan: relative to each mark, lead_ms
    early, wrapped by period_ms, repeated clocks dropped); one not yet issued when the next mark
    comes (or after the run's end) is dropped; each lands `transition_ms` after it is issued, or, for
    an (up, down) pair, `up` after for a request to a faster clock than the one requested before it
    and `down` after for a slower one (each a number, or an array over t.clocks_mhz: the latency of
    a request to that clock); the last one issued wins (a request that lands after a later
    one is dropped). The traced iterations follow a warm-up iteration under the same policy,
    taken to be as long as the first traced one. `plans`: the policy's issue_plans, when the caller
    has them (a policy predicted at several latencies reads its steps once)."""
    plans = issue_plans(t, policy) if plans is None else plans
    return timelines(plans, iter_start_ns, *latency_columns(t, transition_ms), t.default_index, end_ns)


def latency_columns(t: PackTables, transition_ms: float | tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(up, down): the latency (ms) of a request to each clock column, to a faster and to a slower
    clock than the one requested before it (clock_timelines' `transition_ms`)."""
    # np.isscalar is a TypeGuard (not TypeIs): numpy's stub leaves the else branch un-narrowed
    up_ms, down_ms = (transition_ms, transition_ms) if np.isscalar(transition_ms) else transition_ms  # type: ignore[misc]
    up_v, down_v = (np.broadcast_to(np.asarray(v, dtype=np.float64), t.clocks_mhz.shape) for v in (up_ms, down_ms))
    return up_v, down_v


@dataclass(frozen=True)
class Prediction:
    time_s: float  # per iteration
    energy_j: float  # per iteration, all GPUs
    makespan_ns: float  # of the whole graph (all traced iterations)
    idle_energy_j: float  # of the whole graph
    dynamic_energy_j: float  # of the whole graph
    iterations: int
    start_ns: np.ndarray = field(repr=False)
    finish_ns: np.ndarray = field(repr=False)
    # per GPU (dense index) of the whole graph: what idle_energy_j and dynamic_energy_j total
    idle_per_device_j: np.ndarray | None = field(default=None, repr=False)
    dynamic_per_device_j: np.ndarray | None = field(default=None, repr=False)
    # (start, finish) in the engine's order while start_ns and finish_ns are left empty
    # (predict_lanes' node_times=False; with_node_times fills them)
    engine_times: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)


def with_node_times(t: PackTables, p: Prediction) -> Prediction:
    """`p` with start_ns and finish_ns by node id, when predict_lanes left them to be gathered."""
    if p.engine_times is None:
        return p
    start, finish = p.engine_times
    return dataclasses.replace(p, start_ns=start[t.compiled.pos], finish_ns=finish[t.compiled.pos], engine_times=None)


def iteration_marks(t: PackTables, start: np.ndarray) -> np.ndarray:
    """[D, K] each GPU's iteration marks in what-if time (from its rank's anchors)."""
    if t.anchors is None or not len(t.anchors):
        return np.zeros((len(t.device_keys), t.iterations)) + start.min()
    node, offset = anchor_arrays(t)
    return start[node] + offset


def _engine_marks(t: PackTables, start: np.ndarray) -> np.ndarray:
    """iteration_marks from a pass's start times in the engine's order (only the anchors gathered)."""
    if t.anchors is None or not len(t.anchors):
        return np.zeros((len(t.device_keys), t.iterations)) + start.min()
    node, offset = anchor_arrays(t)
    return start[t.compiled.pos[node]] + offset


def engine_arrays(t: PackTables) -> tuple[np.ndarray, ...]:
    """The tables in the engine's topological order (dur, energy, device, scaled, lag, offset, the
    positions of GPU nodes and their GPUs), made once per PackTables: a prediction is asked for hundreds of
    times by the optimizer."""
    cached = getattr(t, "_engine_arrays", None)
    if cached is None:
        c = t.compiled
        cached = (
            t.dur_ns[c.order],
            t.energy_j[c.order],
            t.device[c.order].astype(np.int64),
            t.is_pack[c.order],
            c.lag.astype(np.float64),
            c.offset.astype(np.float64),
            np.flatnonzero(t.device[c.order] >= 0),
        )
        cached += (cached[2][cached[6]],)  # the GPU of each of those
        t._engine_arrays = cached
    return cached


def anchor_arrays(t: PackTables) -> tuple[np.ndarray, np.ndarray]:
    """(node [D, K], offset_ns [D, K]): the anchor node and offset of each GPU's iteration marks, its
    rank's own (else the lowest rank's), the last repeated where a rank has fewer; computed once."""
    cached = getattr(t, "_anchor_arrays", None)
    if cached is not None:
        return cached
    a, k = t.anchors, t.iterations
    assert a is not None  # iteration_marks: called only with anchors
    node = np.zeros((len(t.device_keys), k), np.int64)
    offset = np.zeros((len(t.device_keys), k))
    for g, (rank, _) in enumerate(t.device_keys):
        r = a[a["rank"] == rank].sort_values("iteration")
        if r.empty:
            r = a[a["rank"] == a["rank"].min()].sort_values("iteration")
        m = len(r)
        node[g, :m], offset[g, :m] = r["node"].to_numpy(np.int64), r["offset_ns"].to_numpy(np.float64)
        node[g, m:], offset[g, m:] = node[g, m - 1], offset[g, m - 1]
    t._anchor_arrays = (node, offset)
    return node, offset


def _forward(t: PackTables, tl: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
    """(start, finish, used) in the engine's order: one clocked forward pass under the timelines `tl`."""
    c = t.compiled
    dur, en, dev, scaled, lag, offset = engine_arrays(t)[:6]
    n = len(c.order)
    start, finish, used = np.empty(n), np.empty(n), np.empty(n)
    forward_clocked(
        c.indptr, c.src, c.from_start, lag, offset, dev, scaled, dur, en, t.default_index, *tl, start, finish, used
    )
    return start, finish, used


def default_pass(t: PackTables) -> tuple:
    """(timelines, start, finish, used) of every GPU at its default clock: the first pass of every
    prediction (the marks a policy is timed from), whatever the policy and latency; made once per
    PackTables and never written to."""
    cached = getattr(t, "_default_pass", None)
    if cached is None:
        tl = clock_timelines(t, None, np.zeros((len(t.device_keys), 0)), 0.0)
        cached = (tl, *_forward(t, tl))
        for a in cached[1:]:
            a.flags.writeable = False
        t._default_pass = cached
    return cached


def predict(
    t: PackTables,
    policy: FrequencyPolicy | None = None,
    *,
    transition_ms: float | tuple[Any, Any] | None = None,
    max_passes: int = 6,
    plans: IssuePlans | None = None,
) -> Prediction:
    """Time and energy per iteration of the traced workload under `policy` (None: default clocks).

    `transition_ms`: how long a clock request takes to land (the configured or measured latency,
    never assumed here), or an (up, down) pair of latencies for requests to a faster and to a slower
    clock (clock_timelines); required for a policy that changes a clock within the iteration.
    `plans`: the policy's issue_plans, when the caller predicts it more than once."""
    if transition_ms is None:
        if policy is not None and any(len({s.sm_mhz for s in ss}) > 1 for ss in policy.steps.values()):
            raise ValueError("predict: a policy that changes clocks needs transition_ms (the clock-request latency)")
        transition_ms = 0.0
    # the first pass, at the default clocks, gives the iteration marks the policy is timed from
    tl, start, finish, used = default_pass(t)
    marks, end = _engine_marks(t, start), float(finish.max())
    if policy is not None:
        plans = issue_plans(t, policy) if plans is None else plans
        for _ in range(max_passes - 1):
            tl = clock_timelines(t, policy, marks, transition_ms, end_ns=end, plans=plans)
            start, finish, used = _forward(t, tl)
            new = _engine_marks(t, start)
            end = float(finish.max())
            converged = np.max(np.abs(new - marks), initial=0.0) < 1e3
            marks = new
            if converged:
                break
    return _totals(t, tl, start, finish, used)


def predict_lanes(
    t: PackTables,
    policy: FrequencyPolicy | None,
    transitions: list,
    *,
    max_passes: int = 6,
    plans: IssuePlans | None = None,
    node_times: bool = True,
) -> list[Prediction]:
    """predict(t, policy, transition_ms=x) for each x of `transitions`, the same to the bit, with
    every pass's forward passes run together (forward_clocked_lanes: the graph read once for all of
    them); a latency whose marks have settled drops out of the later passes. `node_times=False`:
    start_ns and finish_ns are left empty (with_node_times gathers them for the lanes that need them)."""
    if policy is None:
        return [predict(t, None) for _ in transitions]
    plans = issue_plans(t, policy) if plans is None else plans
    tl, start, finish, used = default_pass(t)
    m0, e0 = _engine_marks(t, start), float(finish.max())
    state: list[tuple] = [(tl, start, finish, used)] * len(transitions)
    marks, end = [m0] * len(transitions), [e0] * len(transitions)
    active = list(range(len(transitions)))
    for _ in range(max_passes - 1):
        if not active:
            break
        tls = [clock_timelines(t, policy, marks[i], transitions[i], end_ns=end[i], plans=plans) for i in active]
        lanes = _forward_lanes(t, tls)
        for i, tl_i, run in zip(list(active), tls, lanes):
            new = _engine_marks(t, run[0])
            converged = np.max(np.abs(new - marks[i]), initial=0.0) < 1e3
            state[i], marks[i], end[i] = (tl_i, *run), new, float(run[1].max())
            if converged:
                active.remove(i)
    return [_totals(t, tl_i, s, f, u, node_times=node_times) for tl_i, s, f, u in state]


def _forward_lanes(t: PackTables, tls: list) -> list[tuple[np.ndarray, ...]]:
    """_forward under each of the timelines `tls`, in one pass over the graph: (start, finish, used) each."""
    c = t.compiled
    dur, en, dev, scaled, lag, offset = engine_arrays(t)[:6]
    n, lanes = len(c.order), len(tls)
    base = np.cumsum([0] + [len(x[1]) for x in tls])
    ptr = np.stack([x[0] + b for x, b in zip(tls, base[:-1])])
    ts, cis = np.concatenate([x[1] for x in tls]), np.concatenate([x[2] for x in tls])
    start, finish, used = np.empty((lanes, n)), np.empty((lanes, n)), np.empty((lanes, n))
    args = (c.indptr, c.src, c.from_start, lag, offset, dev, scaled, dur, en, t.default_index)
    forward_clocked_lanes(*args, ptr, ts, cis, start, finish, used)
    return [(start[j], finish[j], used[j]) for j in range(lanes)]


def _totals(t: PackTables, tl, start: np.ndarray, finish: np.ndarray, used: np.ndarray, node_times=True) -> Prediction:
    """The Prediction of one forward pass (engine order) under the timelines `tl`: each GPU's idle
    power at its clock over the makespan, plus the energy its nodes used above idle; the node times
    by node id, or (node_times=False) kept in the engine's order for with_node_times."""
    c = t.compiled
    t0, t1 = float(start.min()), float(finish.max())
    d = len(t.device_keys)
    idle_g = np.zeros(d)
    ptr, ts, cis = tl
    for g in range(d):
        tt = np.clip(np.append(ts[ptr[g] : ptr[g + 1]], np.inf), t0, t1)
        idle_g[g] = float(np.sum(np.diff(tt) * t.idle_power_w[g, cis[ptr[g] : ptr[g + 1]]])) * 1e-9
    on_gpu, dev_on = engine_arrays(t)[6:]  # host nodes and rendezvous add no energy above idle
    dyn_g = np.bincount(dev_on, weights=used[on_gpu], minlength=d)
    idle, dyn = float(idle_g.sum()), float(used.sum())
    k = max(t.iterations, 1)
    head = ((t1 - t0) * 1e-9 / k, (idle + dyn) / k, t1 - t0, idle, dyn, k)
    if node_times:
        return Prediction(*head, start[c.pos], finish[c.pos], idle_g, dyn_g)
    return Prediction(*head, np.empty(0), np.empty(0), idle_g, dyn_g, (start, finish))
