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
the end) and the slack windows per GPU, at millions of nodes per second.

This module is EMO's one timing engine: the optimizer's passes (`forward`, `latest_finish`,
`free_finish`, `local_delays`: the end-to-end delay of changing one item's clock) and the
predictor's clocked forward pass (`forward_clocked`: durations follow a per-GPU clock timeline, a
node that spans a clock change runs at each clock in turn) all take the same CSR arrays with a lag
per edge and a start offset per node, and compare times with one tolerance (TOLERANCE_NS)."""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd

from emo.graph.graph import EDGE_KINDS, GPU_NODE_KINDS, Graph

# Kineto writes whole microseconds (older PyTorch) or ns decimals of rounded values: a recorded
# start may precede its constraint by up to this much through rounding alone. It is also the one
# tolerance every time comparison on a graph uses (on time, critical, a delay worth counting).
ROUNDING_TOLERANCE_NS = 1_000
TOLERANCE_NS = float(ROUNDING_TOLERANCE_NS)
SERIAL_WORK = 200_000  # node × clock visits below which local what-if passes run on one thread


@dataclass(frozen=True)
class Compiled:
    order: np.ndarray  # topological position -> node id
    pos: np.ndarray  # node id -> topological position
    indptr: np.ndarray  # CSR over in-edges, rows in topological order
    src: np.ndarray  # predecessor's topological position
    from_start: np.ndarray  # bool per edge
    edge_id: np.ndarray  # row of graph.edges per CSR entry
    dur: np.ndarray  # recorded duration, topological order
    lag: np.ndarray  # per CSR edge: gap after the constraint is met
    offset: np.ndarray  # per node, topological order: the recorded start of a source, else 0
    delay: np.ndarray  # per node, topological order: recorded start minus when its binding
    # constraint was met (the lag of its binding edge; a source's offset)
    t0: int  # recorded origin (ns)
    recorded_start: np.ndarray  # relative to t0, topological order
    is_gpu: np.ndarray  # bool, topological order
    device: np.ndarray  # (rank, device) key per node, -1 host; topological order
    stream: np.ndarray
    n: int


@dataclass(frozen=True)
class Result:
    makespan_ns: int
    start_ns: np.ndarray  # per node id, relative to the recorded origin
    finish_ns: np.ndarray
    critical_pred: np.ndarray  # node id of the in-edge that bound the start (-1: none)
    critical_edge: np.ndarray  # row of graph.edges that bound the start (-1: none)
    critical_path: np.ndarray  # node ids, first to last
    slack_ns: np.ndarray  # per node id
    replay_error_ns: int  # max |replayed - recorded| start over GPU nodes (recorded durations only)
    delay_ns: np.ndarray  # per node id: start minus the time its binding constraint was met
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
def forward(indptr, src, from_start, lag, offset, dur):
    """(start, finish, end, crit) of every node at durations `dur` (topological order): crit is the
    in-edge (CSR index) that bound the start, -1 for a source."""
    n = dur.shape[0]
    start = np.empty(n)
    finish = np.empty(n)
    crit = np.full(n, -1, np.int64)
    end = 0.0
    for v in range(n):
        best = 0.0
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            t = (start[u] if from_start[k] else finish[u]) + lag[k]
            if crit[v] < 0 or t > best:
                best = t
                crit[v] = k
        s = best + offset[v]
        start[v] = s
        finish[v] = s + dur[v]
        if finish[v] > end:
            end = finish[v]
    return start, finish, end, crit


@numba.njit(cache=True)
def latest_finish(indptr, src, from_start, lag, offset, dur, deadline):
    """Latest finish of every node that keeps the end within `deadline` (float64), as _backward: a
    successor that waits for a node's start bounds that start (so its predecessors), not its finish."""
    n = dur.shape[0]
    latest = np.empty(n)
    latest_start = np.empty(n)
    for v in range(n):
        latest[v] = deadline
        latest_start[v] = np.inf
    for v in range(n - 1, -1, -1):
        ls = latest[v] - dur[v]
        if latest_start[v] < ls:
            ls = latest_start[v]
        ls -= offset[v]
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            bound = ls - lag[k]
            if from_start[k]:
                if bound < latest_start[u]:
                    latest_start[u] = bound
            elif bound < latest[u]:
                latest[u] = bound
    return latest


@numba.njit(cache=True)
def free_finish(indptr, src, from_start, lag, offset, dur, start, deadline):
    """Latest finish of every node that delays none of its successors (free slack): delays measured
    against it add up along any path, so their sum bounds the end-to-end delay."""
    n = dur.shape[0]
    lf = np.full(n, deadline)
    for v in range(n):
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            x = start[v] - offset[v] - lag[k] + (dur[u] if from_start[k] else 0.0)
            if x < lf[u]:
                lf[u] = x
    return lf


@numba.njit(cache=True)
def _local_chunk(
    indptr,
    src,
    from_start,
    lag,
    offset,
    cur_dur,
    start,
    finish,
    slack,
    dur_table,
    item_of,
    lo,
    hi,
    todo,
    useful,
    limit,
    out,
    first,
    last,
):
    n = len(cur_dur)
    C = dur_table.shape[1]
    stamp = np.full(n, -1, np.int64)
    ns = np.zeros(n)
    nf = np.zeros(n)
    tag = 0
    for kk in range(first, last):
        k = todo[kk]
        if lo[k] < 0:
            continue
        over = False
        for c in range(C - 1, -1, -1):  # fastest first: once past the limit, slower clocks are too
            if over or not useful[k, c]:
                out[k, c] = np.inf
                continue
            tag += 1
            worst = 0.0
            for v in range(lo[k], hi[k] + 1):
                mine = item_of[v] == k
                touched = mine
                s = 0.0
                first_edge = True
                for e in range(indptr[v], indptr[v + 1]):
                    u = src[e]
                    if stamp[u] == tag:
                        touched = True
                        x = ns[u] if from_start[e] else nf[u]
                    else:
                        x = start[u] if from_start[e] else finish[u]
                    x += lag[e]
                    if first_edge or x > s:
                        s = x
                        first_edge = False
                if not touched:
                    continue
                s += offset[v]
                f = s + (dur_table[v, c] if mine else cur_dur[v])
                if s != start[v] or f != finish[v]:
                    stamp[v] = tag
                    ns[v] = s
                    nf[v] = f
                    late = f - finish[v] - slack[v]
                    if late > worst:
                        worst = late
            out[k, c] = worst
            if worst > limit:
                over = True


@numba.njit(cache=True, parallel=True)
def _local_all(
    indptr,
    src,
    from_start,
    lag,
    offset,
    cur_dur,
    start,
    finish,
    slack,
    dur_table,
    item_of,
    lo,
    hi,
    todo,
    useful,
    limit,
    out,
    chunks,
):
    for j in numba.prange(chunks):  # items split across threads, each chunk with its own scratch
        _local_chunk(
            indptr,
            src,
            from_start,
            lag,
            offset,
            cur_dur,
            start,
            finish,
            slack,
            dur_table,
            item_of,
            lo,
            hi,
            todo,
            useful,
            limit,
            out,
            j * len(todo) // chunks,
            (j + 1) * len(todo) // chunks,
        )


def local_delays(
    indptr, src, from_start, lag, offset, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo, useful, limit
):
    """delay[k, c]: how far past its deadline the end would move if only item k ran at clock c
    (inf: not evaluated, because the clock is not useful for the item or a faster one is already
    past `limit`). Nodes must be in a topological order in which each item's nodes lie in
    [lo[k], hi[k]]; `slack` = latest finish - finish.

    A what-if pass over the item's span of the order only: nodes it touches get new times, and a
    touched node x ends the iteration at its new finish + its tail, i.e. late by
    (new finish - finish) - slack; the tail past the span holds no node of the item, so this is exact.
    """
    out = np.zeros((len(lo), dur_table.shape[1]))
    t = todo[lo[todo] >= 0]
    args = (
        indptr,
        src,
        from_start,
        lag,
        offset,
        cur_dur,
        start,
        finish,
        slack,
        dur_table,
        item_of,
        lo,
        hi,
        todo,
        useful,
        float(limit),
        out,
    )
    if (np.sum(hi[t] - lo[t] + 1) * dur_table.shape[1]) < SERIAL_WORK:
        # small: a parallel region costs more than it saves, and far more on a busy machine
        _local_chunk(*args, 0, len(todo))
    else:
        _local_all(*args, max(1, min(len(todo), 4 * numba.get_num_threads())))
    return out


@numba.njit(cache=True)
def forward_clocked(
    indptr, src, from_start, lag, offset, dev, scaled, dur, energy, ref, tl_ptr, tl_t, tl_ci, start, finish, used
):
    """The forward pass under per-GPU clock timelines (CSR tl_ptr [D+1], tl_t, tl_ci: clock column
    tl_ci from tl_t on): a scaled node of GPU g runs at the clock in force on g while it runs, each
    part of it at its clock's rate (dur[v, c], energy[v, c]); other nodes take column `ref`.
    Writes start, finish and the energy used per node."""
    n = dur.shape[0]
    for v in range(n):
        s = 0.0
        first = True
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            tt = (start[u] if from_start[k] else finish[u]) + lag[k]
            if first or tt > s:
                s = tt
                first = False
        s += offset[v]
        start[v] = s
        g = dev[v]
        if g < 0 or not scaled[v]:
            finish[v] = s + dur[v, ref]
            used[v] = energy[v, ref]
            continue
        lo = tl_ptr[g]
        hi = tl_ptr[g + 1]
        k = lo
        while k + 1 < hi and tl_t[k + 1] <= s:
            k += 1
        rem = 1.0
        t = s
        e = 0.0
        while True:
            ci = tl_ci[k]
            d = dur[v, ci]
            seg_end = tl_t[k + 1] if k + 1 < hi else np.inf
            need = rem * d
            if d <= 0.0 or t + need <= seg_end:
                e += rem * energy[v, ci]
                t += need
                break
            frac = (seg_end - t) / d
            e += frac * energy[v, ci]
            rem -= frac
            t = seg_end
            k += 1
        finish[v] = t
        used[v] = e


@numba.njit(cache=True)
def critical_path(indptr, src, from_start, lag, start, finish):
    """Topological positions on the binding chain that ends at the last-finishing node of a timeline
    (start, finish: topological order), last first: each step goes to the predecessor whose
    constraint was met last, while that constraint binds within TOLERANCE_NS."""
    v = int(np.argmax(finish))
    out = [v]
    while True:
        best, bu = -np.inf, -1
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            tt = (start[u] if from_start[k] else finish[u]) + lag[k]
            if tt > best:
                best, bu = tt, u
        if bu < 0 or best < start[v] - TOLERANCE_NS:
            break
        v = bu
        out.append(v)
    return np.array(out, dtype=np.int64)


@numba.njit(cache=True)
def _monotone_key(indptr, src, key):
    """key[v] raised to the largest key of its predecessors: sorting by it (ties by topological
    position) is a topological order."""
    out = key.copy()
    for v in range(len(key)):
        for k in range(indptr[v], indptr[v + 1]):
            if out[src[k]] > out[v]:
                out[v] = out[src[k]]
    return out


def reorder_by_start(
    indptr, src, from_start, lag, offset, start
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same graph in a topological order sorted by `start` (per node, current order): returns
    (order, indptr, src, from_start, lag, offset) with order[new] = old. The optimizer wants each
    time window's nodes contiguous (local_delays' spans)."""
    n = len(offset)
    key = _monotone_key(indptr, src, np.asarray(start, np.float64))
    order = np.lexsort((np.arange(n), key))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    dst = np.repeat(np.arange(n), np.diff(indptr))
    return (order, *csr_in_edges(n, pos[src], pos[dst], from_start, lag), np.asarray(offset)[order])


def csr_in_edges(
    n: int, src: np.ndarray, dst: np.ndarray, from_start: np.ndarray, lag: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CSR of in-edges (indptr [n+1], src, from_start, lag), rows by dst, each row's edges by src."""
    o = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return (indptr, np.asarray(src, np.int64)[o], np.asarray(from_start, np.bool_)[o], np.asarray(lag, np.float64)[o])


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
        raise ValueError(
            f"dependency cycle among {len(stuck)} nodes, e.g. node {int(stuck[0])} "
            f"({row['kind']} {str(row['name'])[:60]!r})"
        )
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
    codes, kinds = pd.factorize(edges["kind"])  # coded once per distinct kind, not mapped per row
    to_kind = np.array([EDGE_KINDS.index(k) if k in EDGE_KINDS else 0 for k in kinds] + [0], np.int64)
    ekind = to_kind[codes][e_order]  # an unknown or missing kind (code -1: the last entry) reads as "program"
    lag, offset, delay = _recorded_lags(indptr, src, fs, ekind, dur, rec, ROUNDING_TOLERANCE_NS)
    kind = nodes["kind"].to_numpy(dtype=object)[order]
    dev = np.where(
        nodes["device"].to_numpy() >= 0,
        nodes["rank"].to_numpy(np.int64) * 1_000 + nodes["device"].to_numpy(np.int64),
        -1,
    )[order]
    return Compiled(
        order=order,
        pos=pos,
        indptr=indptr,
        src=src,
        from_start=fs,
        edge_id=e_order,
        dur=dur,
        lag=lag,
        offset=offset,
        delay=delay,
        t0=t0,
        recorded_start=rec,
        is_gpu=np.isin(kind, GPU_NODE_KINDS),
        device=dev,
        stream=nodes["stream"].to_numpy(np.int64)[order],
        n=n,
    )


def take_edge(per_edge: np.ndarray, edge: np.ndarray, none) -> np.ndarray:
    """per_edge[edge] where a node has a binding edge (edge >= 0), `none` where it has none (a graph
    without edges included)."""
    out = np.full(edge.shape, none, dtype=per_edge.dtype)
    ok = edge >= 0
    out[ok] = per_edge[edge[ok]]
    return out


def whatif(
    compiled: Compiled, dur_ns: np.ndarray | None = None, *, slack: bool = True, energy_j: np.ndarray | None = None
) -> Result:
    """Replay the graph with new per-node durations (indexed by node id; None = as recorded).

    `energy_j` (per node id, optional) is summed into Result.energy_j, so a caller trying clocks
    gets the time and the energy of a candidate from one call."""
    c = compiled
    dur = c.dur if dur_ns is None else np.asarray(dur_ns, np.int64)[c.order]
    graph = (c.indptr, c.src, c.from_start, c.lag.astype(np.float64), c.offset.astype(np.float64))
    s, f, _, crit = forward(*graph, dur.astype(np.float64))
    start, finish = s.astype(np.int64), f.astype(np.int64)  # integer ns in, integer ns out (exact below 2**53)
    end = int(finish.max()) if c.n else 0
    latest = latest_finish(*graph, dur.astype(np.float64), float(end)).astype(np.int64) if slack else None
    # critical path: from the node that finishes last, follow the binding predecessors
    path_ids = c.order[_backtrack(int(np.argmax(finish)), crit, c.src)] if c.n else np.zeros(0, np.int64)
    replay = 0
    if dur_ns is None and c.is_gpu.any():
        replay = int(np.abs(start[c.is_gpu] - c.recorded_start[c.is_gpu]).max())
    to_id = c.pos
    crit_ids = take_edge(c.order[c.src], crit, -1)
    crit_edge = take_edge(c.edge_id, crit, -1)
    return Result(
        makespan_ns=end - int(start.min()) if c.n else 0,
        start_ns=start[to_id],
        finish_ns=finish[to_id],
        critical_pred=crit_ids[to_id],
        critical_edge=crit_edge[to_id],
        critical_path=path_ids,
        slack_ns=(latest - finish)[to_id] if slack else np.zeros(c.n, np.int64),
        replay_error_ns=replay,
        delay_ns=(c.offset + take_edge(c.lag, crit, 0))[to_id],
        energy_j=None if energy_j is None else float(np.sum(energy_j)),
    )


def replay_error_ns(compiled: Compiled) -> int:
    """Largest |replayed - recorded| start over GPU nodes when the recorded durations are replayed."""
    return whatif(compiled, slack=False).replay_error_ns


def slack_windows(graph: Graph, result: Result) -> pd.DataFrame:
    """Per GPU stream, maximal runs of consecutive ops with slack > 0 (critical ops separate them).

    A window may stretch as a whole by its smallest member slack: stretching the run pushes each
    member by at most the stretch so far. Columns: rank, device, stream, start_ns, end_ns, slack_ns, nodes."""
    n = graph.nodes
    gpu = n["kind"].isin(GPU_NODE_KINDS).to_numpy()
    df = {
        "rank": n["rank"].to_numpy()[gpu],
        "device": n["device"].to_numpy()[gpu],
        "stream": n["stream"].to_numpy()[gpu],
        "start": result.start_ns[gpu],
        "end": result.finish_ns[gpu],
        "slack": result.slack_ns[gpu],
    }
    o = np.lexsort((df["start"], df["stream"], df["device"], df["rank"]))  # (stable)
    df = {c: v[o] for c, v in df.items()}
    pos = df["slack"] > 0
    key = np.stack([df["rank"], df["device"], df["stream"]], axis=1)
    newgrp = np.r_[True, (key[1:] != key[:-1]).any(axis=1)][: len(pos)]
    brk = newgrp | ~pos | np.r_[True, ~pos[:-1]][: len(pos)]
    run = np.cumsum(brk)[pos]  # a run's ops are adjacent in this order: reduce each run at its head
    heads = np.flatnonzero(np.r_[True, run[1:] != run[:-1]]) if len(run) else np.zeros(0, np.int64)
    col = {c: v[pos] for c, v in df.items()}

    def reduce(f, c):
        return f.reduceat(col[c], heads) if len(heads) else col[c][:0]

    return pd.DataFrame(
        {
            "rank": col["rank"][heads],
            "device": col["device"][heads],
            "stream": col["stream"][heads],
            "start_ns": reduce(np.minimum, "start"),
            "end_ns": reduce(np.maximum, "end"),
            "slack_ns": reduce(np.minimum, "slack"),
            "nodes": np.diff(np.r_[heads, len(run)]).astype(np.int64),
        }
    )


@numba.njit(cache=True)
def forward_clocked_lanes(
    indptr, src, from_start, lag, offset, dev, scaled, dur, energy, ref, tl_ptr, tl_t, tl_ci, start, finish, used
):
    """forward_clocked for L clock timelines at once, node by node (the graph is read once for all
    of them): tl_ptr [L, D+1] indexes tl_t, tl_ci (every lane's timelines, one after the other);
    writes start, finish, used [L, n]. Each lane's times are forward_clocked's under its
    timelines, to the bit: the same operations in the same order."""
    n = dur.shape[0]
    lanes = tl_ptr.shape[0]
    s = np.empty(lanes)
    # the lanes side by side while the pass runs: a predecessor's times are one cache line
    s_all, f_all = np.empty((n, lanes)), np.empty((n, lanes))
    for v in range(n):
        for j in range(lanes):
            s[j] = 0.0
        first = True
        for k in range(indptr[v], indptr[v + 1]):
            u = src[k]
            for j in range(lanes):
                tt = (s_all[u, j] if from_start[k] else f_all[u, j]) + lag[k]
                if first or tt > s[j]:
                    s[j] = tt
            first = False
        g = dev[v]
        for j in range(lanes):
            sv = s[j] + offset[v]
            if g < 0 or not scaled[v]:
                f, e = sv + dur[v, ref], energy[v, ref]
            else:
                f, e = _clocked_node(dur[v], energy[v], tl_ptr[j, g], tl_ptr[j, g + 1], tl_t, tl_ci, sv)
            s_all[v, j], f_all[v, j] = sv, f
            start[j, v], finish[j, v], used[j, v] = sv, f, e


@numba.njit(cache=True)
def _clocked_node(dur, energy, lo, hi, tl_t, tl_ci, s):
    """(finish, energy used) of a node starting at s under the timeline tl_t[lo:hi], tl_ci[lo:hi]:
    each part of it at the rate of the clock in force (forward_clocked)."""
    k = lo
    while k + 1 < hi and tl_t[k + 1] <= s:
        k += 1
    rem = 1.0
    t = s
    e = 0.0
    done = False
    while not done:
        ci = tl_ci[k]
        d = dur[ci]
        seg_end = tl_t[k + 1] if k + 1 < hi else np.inf
        need = rem * d
        if d <= 0.0 or t + need <= seg_end:
            e += rem * energy[ci]
            t += need
            done = True
        else:
            frac = (seg_end - t) / d
            e += frac * energy[ci]
            rem -= frac
            t = seg_end
            k += 1
    return t, e
