"""What-if analysis over the execution graph (the paper's Algorithm 1).

`compile_graph` turns the graph once into CSR arrays in topological order. The timing model is
max-plus with a lag per edge: a node starts when its last constraint is met,

    start[v] = max over in-edges e = (u -> v) of (start[u] if from_start else start[u] + dur[u]) + lag[e]

(a source starts at its recorded offset). Lags are measured once from the recorded timeline: the
edge that bound a node's start keeps its recorded gap (launch latency, queueing), so replaying the
recorded durations reproduces the trace; every other edge gets the smaller of its recorded gap and
the typical gap of its kind when binding (e.g. the usual kernel-to-kernel gap), so when a
predecessor grows, its successors follow it as hardware would rather than after a latency that
belonged to another edge. A gap that would have to be negative means the trace contradicts an edge
(clock skew, a wrong dependency): it is clamped to 0 and shows up as replay error.
`whatif(compiled, dur_ns)` then gives the makespan, each node's start and finish, its critical
predecessor, the critical path, each node's slack (how much it may stretch alone without moving
the end) and the slack windows per GPU, at millions of nodes per second."""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd

from emo.graph.graph import EDGE_KINDS, GPU_NODE_KINDS, Graph


# Kineto writes whole microseconds (older PyTorch) or ns decimals of rounded values: a recorded
# start may precede its constraint by up to this much through rounding alone.
ROUNDING_TOLERANCE_NS = 1_000


@dataclass(frozen=True)
class Compiled:
    order: np.ndarray       # topological position -> node id
    pos: np.ndarray         # node id -> topological position
    indptr: np.ndarray      # CSR over in-edges, rows in topological order
    src: np.ndarray         # predecessor's topological position
    from_start: np.ndarray  # bool per edge
    edge_id: np.ndarray     # row of graph.edges per CSR entry
    dur: np.ndarray         # recorded duration, topological order
    lag: np.ndarray         # per CSR edge: gap after the constraint is met
    offset: np.ndarray      # per node, topological order: the recorded start of a source, else 0
    delay: np.ndarray       # per node, topological order: recorded start minus when its binding
                            # constraint was met (the lag of its binding edge; a source's offset)
    t0: int                 # recorded origin (ns)
    recorded_start: np.ndarray  # relative to t0, topological order
    is_gpu: np.ndarray      # bool, topological order
    device: np.ndarray      # (rank, device) key per node, -1 host; topological order
    stream: np.ndarray
    n: int


@dataclass(frozen=True)
class Result:
    makespan_ns: int
    start_ns: np.ndarray          # per node id, relative to the recorded origin
    finish_ns: np.ndarray
    critical_pred: np.ndarray     # node id of the in-edge that bound the start (-1: none)
    critical_edge: np.ndarray     # row of graph.edges that bound the start (-1: none)
    critical_path: np.ndarray     # node ids, first to last
    slack_ns: np.ndarray          # per node id
    replay_error_ns: int          # max |replayed - recorded| start over GPU nodes (recorded durations only)
    delay_ns: np.ndarray          # per node id: start minus the time its binding constraint was met
    energy_j: float | None = None  # sum of the per-node energies passed in, if any


@numba.njit(cache=True)
def _topo_order(n, indptr_out, dst_out, indeg):
    order = np.empty(n, np.int64)
    head = 0
    tail = 0
    deg = indeg.copy()
    for v in range(n):
        if deg[v] == 0:
            order[tail] = v
            tail += 1
    while head < tail:
        u = order[head]
        head += 1
        for k in range(indptr_out[u], indptr_out[u + 1]):
            w = dst_out[k]
            deg[w] -= 1
            if deg[w] == 0:
                order[tail] = w
                tail += 1
    return order[:tail]


@numba.njit(cache=True)
def _forward(indptr, src, from_start, lag, dur, offset, start, finish, crit):
    n = dur.shape[0]
    for v in range(n):
        best = 0
        arg = -1
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            t = (start[u] if from_start[k] else finish[u]) + lag[k]
            if arg == -1 or t > best:
                best = t
                arg = k
        s = best + offset[v]
        start[v] = s
        finish[v] = s + dur[v]
        crit[v] = arg


@numba.njit(cache=True)
def _backward(indptr, src, from_start, lag, dur, offset, end, latest):
    """latest[v]: the latest v may finish without moving the end. A successor that waits only for
    v's start (from_start) bounds v's start, not its finish, so it limits v's predecessors only."""
    n = dur.shape[0]
    big = np.iinfo(np.int64).max
    latest_start = np.empty(n, np.int64)
    for v in range(n):
        latest[v] = end
        latest_start[v] = big
    for v in range(n - 1, -1, -1):
        ls = latest[v] - dur[v]
        if latest_start[v] < ls:
            ls = latest_start[v]
        ls -= offset[v]
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            bound = ls - lag[k]  # latest this constraint of v may be met
            if from_start[k]:
                if bound < latest_start[u]:
                    latest_start[u] = bound
            elif bound < latest[u]:
                latest[u] = bound


@numba.njit(cache=True)
def _backtrack(last, crit, src):
    """Topological positions on the critical path ending at `last`, first to last."""
    path = np.empty(crit.shape[0], np.int64)
    m = 0
    v = last
    while v >= 0:
        path[m] = v
        m += 1
        v = src[crit[v]] if crit[v] >= 0 else -1
    return path[:m][::-1].copy()


def _recorded_lags(indptr, src, fs, ekind, dur, rec, tol):
    """Per-edge lags and per-node source offsets from the recorded timeline (see module doc)."""
    n = len(dur)
    deg = np.diff(indptr)
    dst = np.repeat(np.arange(n), deg)
    t = np.where(fs, rec[src], rec[src] + dur[src])
    gap = rec[dst] - t
    has = deg > 0
    tmax = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(tmax, dst, t)
    binding = t == tmax[dst]
    # a constraint missed by no more than the trace's timestamp rounding is rounding, not a
    # contradiction: keep the (slightly negative) gap so the replay stays exact
    gap = np.where(gap < -tol, 0, gap)
    typical = np.zeros(len(EDGE_KINDS), np.int64)
    for code in range(len(EDGE_KINDS)):
        g = gap[binding & (ekind == code) & (gap >= 0)]
        typical[code] = int(np.median(g)) if len(g) else 0
    # the edge that bound a start is the one met latest once its kind's typical latency (at most
    # its own recorded gap) is added: a kernel launched early but whose stream event came late
    # waits on the event, and vice versa
    tt = t + np.minimum(typical[ekind], np.maximum(gap, 0))
    ttmax = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(ttmax, dst, tt)
    binding = tt == ttmax[dst]
    lag = np.where(binding, gap, np.minimum(gap, typical[ekind])).astype(np.int64)
    offset = np.where(has, 0, rec).astype(np.int64)
    delay = offset.copy()
    np.maximum.at(delay, dst, np.where(binding, lag, np.iinfo(np.int64).min))
    return lag, offset, delay


def toposort(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Node ids in a topological order of the edges src -> dst (Kahn); fewer than n back: a cycle."""
    by_src = np.argsort(src, kind="stable")
    indptr_out = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr_out[1:])
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    return _topo_order(n, indptr_out, dst[by_src], indeg)


def compile_graph(graph: Graph) -> Compiled:
    """CSR arrays in topological order; raises ValueError on a dependency cycle."""
    nodes, edges = graph.nodes, graph.edges
    n = len(nodes)
    s = edges["src"].to_numpy(np.int64)
    d = edges["dst"].to_numpy(np.int64)
    order = toposort(n, s, d)
    if len(order) < n:
        stuck = np.setdiff1d(np.arange(n), order)
        row = nodes.iloc[int(stuck[0])]
        raise ValueError(f"dependency cycle among {len(stuck)} nodes, e.g. node {int(stuck[0])} "
                         f"({row['kind']} {str(row['name'])[:60]!r})")
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    ps, pd_ = pos[s], pos[d]
    e_order = np.lexsort((ps, pd_))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(pd_, minlength=n), out=indptr[1:])
    src = ps[e_order]
    fs = edges["from_start"].to_numpy(bool)[e_order]
    dur = nodes["dur_ns"].to_numpy(np.int64)[order]
    start_abs = nodes["start_ns"].to_numpy(np.int64)
    t0 = int(start_abs.min()) if n else 0
    rec = (start_abs - t0)[order]
    codes = {k: i for i, k in enumerate(EDGE_KINDS)}
    ekind = edges["kind"].map(codes).fillna(0).to_numpy(np.int64)[e_order]
    lag, offset, delay = _recorded_lags(indptr, src, fs, ekind, dur, rec, ROUNDING_TOLERANCE_NS)
    kind = nodes["kind"].to_numpy(dtype=object)[order]
    dev = np.where(nodes["device"].to_numpy() >= 0,
                   nodes["rank"].to_numpy(np.int64) * 1_000 + nodes["device"].to_numpy(np.int64), -1)[order]
    return Compiled(order=order, pos=pos, indptr=indptr, src=src, from_start=fs, edge_id=e_order, dur=dur,
                    lag=lag, offset=offset, delay=delay, t0=t0, recorded_start=rec, is_gpu=np.isin(kind, GPU_NODE_KINDS),
                    device=dev, stream=nodes["stream"].to_numpy(np.int64)[order], n=n)


def whatif(compiled: Compiled, dur_ns: np.ndarray | None = None, *, slack: bool = True,
           energy_j: np.ndarray | None = None) -> Result:
    """Replay the graph with new per-node durations (indexed by node id; None = as recorded).

    `energy_j` (per node id, optional) is summed into Result.energy_j, so a caller trying clocks
    gets the time and the energy of a candidate from one call."""
    c = compiled
    dur = c.dur if dur_ns is None else np.asarray(dur_ns, np.int64)[c.order]
    start = np.empty(c.n, np.int64)
    finish = np.empty(c.n, np.int64)
    crit = np.empty(c.n, np.int64)
    _forward(c.indptr, c.src, c.from_start, c.lag, dur, c.offset, start, finish, crit)
    end = int(finish.max()) if c.n else 0
    latest = np.empty(c.n, np.int64)
    if slack:
        _backward(c.indptr, c.src, c.from_start, c.lag, dur, c.offset, end, latest)
    # critical path: from the node that finishes last, follow the binding predecessors
    path_ids = c.order[_backtrack(int(np.argmax(finish)), crit, c.src)] if c.n else np.zeros(0, np.int64)
    replay = 0
    if dur_ns is None and c.is_gpu.any():
        replay = int(np.abs(start[c.is_gpu] - c.recorded_start[c.is_gpu]).max())
    to_id = c.pos
    crit_ids = np.where(crit >= 0, c.order[c.src[np.maximum(crit, 0)]], -1)
    crit_edge = np.where(crit >= 0, c.edge_id[np.maximum(crit, 0)], -1)
    return Result(makespan_ns=end - int(start.min()) if c.n else 0, start_ns=start[to_id], finish_ns=finish[to_id],
                  critical_pred=crit_ids[to_id], critical_edge=crit_edge[to_id], critical_path=path_ids,
                  slack_ns=(latest - finish)[to_id] if slack else np.zeros(c.n, np.int64),
                  replay_error_ns=replay, delay_ns=(c.offset + np.where(crit >= 0, c.lag[np.maximum(crit, 0)], 0))[to_id],
                  energy_j=None if energy_j is None else float(np.sum(energy_j)))


def replay_error_ns(compiled: Compiled) -> int:
    """Largest |replayed - recorded| start over GPU nodes when the recorded durations are replayed."""
    return whatif(compiled, slack=False).replay_error_ns


def slack_windows(graph: Graph, result: Result) -> pd.DataFrame:
    """Per GPU stream, maximal runs of consecutive ops with slack > 0 (critical ops separate them).

    A window may stretch as a whole by its smallest member slack: stretching the run pushes each
    member by at most the stretch so far. Columns: rank, device, stream, start_ns, end_ns, slack_ns, nodes."""
    n = graph.nodes
    gpu = n["kind"].isin(GPU_NODE_KINDS).to_numpy()
    df = pd.DataFrame({"rank": n["rank"].to_numpy()[gpu], "device": n["device"].to_numpy()[gpu],
                       "stream": n["stream"].to_numpy()[gpu], "start": result.start_ns[gpu],
                       "end": result.finish_ns[gpu], "slack": result.slack_ns[gpu]})
    df = df.sort_values(["rank", "device", "stream", "start"], kind="stable")
    pos = (df["slack"] > 0).to_numpy()
    key = df[["rank", "device", "stream"]].to_numpy()
    newgrp = np.r_[True, (key[1:] != key[:-1]).any(axis=1)]
    brk = newgrp | ~pos | np.r_[True, ~pos[:-1]]
    run = np.cumsum(brk)
    w = df[pos].assign(run=run[pos]).groupby("run").agg(
        rank=("rank", "first"), device=("device", "first"), stream=("stream", "first"),
        start_ns=("start", "min"), end_ns=("end", "max"), slack_ns=("slack", "min"), nodes=("slack", "size"))
    return w.reset_index(drop=True)
