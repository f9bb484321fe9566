"""Critical path with Holistic Trace Analysis's conventions, so EMO's numbers can be put beside HTA's.

HTA (facebookresearch/HolisticTraceAnalysis, `critical_path_analysis.py`) builds, per rank, a graph
of event start/end points: nested CPU operators linked in call-stack order, consecutive top-level
operators linked with weight 0, blocking runtime calls' ends with weight 0, kernels linked to their
launch (when the stream was idle) or to the previous kernel on the stream, and synchronisation
edges with weight 0. Its critical path is the longest path; its length is at most the window's span.
This module reproduces those rules on EMO's event table (timestamps in whole microseconds, as HTA
keeps them) — it is a comparison mode; EMO's own graph (emo.graph.build) is makespan-faithful.
HTA's two sequential walks (each thread's call stacks, the GPU events in time order) are numba
kernels over the event arrays that emit the same edges in the same order as HTA's rules, so the
longest path (ties broken by edge order) is the same to the microsecond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd

from emo.errors import InputError
from emo.graph.tables import codes, first_of, group_numbers, merge, new_group
from emo.graph.whatif import toposort
from emo.trace.kineto import no_gc

BLOCKING_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpyAsync",
    }
)
HTA_LAUNCH_CALLS = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync"}
)
EDGE_TYPES = ("operator", "dependency", "launch_delay", "kernel_kernel_delay", "sync")


@dataclass(frozen=True)
class HtaPath:
    cp_us: int  # sum of edge weights on the longest path
    path_nodes: int
    graph_nodes: int
    graph_edges: int
    breakdown_us: dict  # weight on the path by HTA edge type
    window_us: tuple[int, int]
    path_points: tuple = ()  # (event row of the rank, is_start, ts_us) along the path


def _rank_frame(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    rows = events["rank"].to_numpy() == rank
    e = events if rows.all() else events[rows].reset_index(drop=True)  # (no copy for a one-rank trace)
    ts = -(-e["start_ns"].to_numpy(np.int64) // 1000)
    end = (e["start_ns"].to_numpy(np.int64) + e["dur_ns"].to_numpy(np.int64)) // 1000
    gpu_side = e["kind"].isin(("kernel", "memcpy", "memset", "sync", "gpu_annotation")).to_numpy(bool)
    corr = e["correlation"].to_numpy(np.int64)
    df = pd.DataFrame(
        {
            "kind": _coded(e["kind"]),
            "name": _coded(e["name"]),
            "pid": np.where(gpu_side, e["device"].to_numpy(np.int64), e["pid"].to_numpy(np.int64)),
            "tid": e["thread"].to_numpy(np.int64),
            "stream": e["stream"].to_numpy(np.int64),
            "ts": ts,
            "end": end,
            "dur": end - ts,
            "correlation": corr,
            "sync_kind": _coded(e["sync_kind"]),
            "wait_corr": e["wait_event_corr"].to_numpy(np.int64),
            "wait_stream": e["wait_stream"].to_numpy(np.int64),
        }
    )
    df["gpu_side"] = gpu_side  # HTA's GPU filter: stream >= 0 or a cuda_sync event
    # index_correlation: host call <-> GPU event of the same correlation id (HTA's convention:
    # -1 no correlation, 0 correlated but partner absent)
    ic = np.minimum(corr, 0)
    has = corr != -1
    row = np.arange(len(df))
    m = merge(
        {"x": row[has & ~gpu_side], "correlation": corr[has & ~gpu_side]},
        {"y": row[has & gpu_side], "correlation": corr[has & gpu_side]},
        ["correlation"],
    )
    ic[m["x"]] = m["y"]
    ic[m["y"]] = m["x"]
    df["ic"] = ic
    return df


def _coded(col: pd.Series) -> pd.Categorical:
    """A text column coded by its distinct values (kept as Python strings): the row selections
    below then move integer codes, not strings."""
    codes, uniques = pd.factorize(col, use_na_sentinel=False)
    return pd.Categorical.from_codes(codes, pd.Index(np.asarray(uniques, dtype=object), dtype=object))


def _window(df: pd.DataFrame, annotation: str, instance: int) -> tuple[int, int]:
    if not annotation:
        return int(df["ts"].min()), int(df["end"].max())
    names = df["name"].cat
    has = names.categories.to_series().astype(str).str.contains(annotation, regex=False).to_numpy(bool)
    hits = df[has[names.codes.to_numpy()]]
    if len(hits) <= instance:
        raise InputError(f"annotation {annotation!r} instance {instance} not found ({len(hits)} instance(s))")
    return int(hits["ts"].iloc[instance]), int(hits["end"].iloc[instance])


def _queue_lengths(df: pd.DataFrame) -> np.ndarray:
    """HTA's per-stream queue length after each event (NaN where none): +1 at each launch call,
    -1 at each launched GPU op."""
    corr, stream, ts = (df[c].to_numpy(np.int64) for c in ("correlation", "stream", "ts"))
    launch = np.flatnonzero(
        (df["kind"].eq("runtime") & df["name"].isin(HTA_LAUNCH_CALLS)).to_numpy(bool) & (df["ic"].to_numpy() > 0)
    )
    ops = np.flatnonzero((stream != -1) & np.isin(corr, corr[launch]))
    # a launch's stream: that of the last op with its correlation (none: NaN, in no stream's count)
    last = first_of(corr[ops][::-1])
    known, at = np.unique(corr[ops][::-1][last], return_index=True)
    of = np.searchsorted(known, corr[launch])
    hit = (of < len(known)) & (known[np.minimum(of, len(known) - 1)] == corr[launch]) if len(known) else of < 0
    st = np.full(len(launch), np.nan)
    st[hit] = stream[ops][::-1][last][at[of[hit]]]
    rows = np.r_[launch, ops]
    o = np.argsort(np.r_[ts[launch], ts[ops]], kind="stable")
    q = np.r_[np.ones(len(launch), np.int64), -np.ones(len(ops), np.int64)][o]
    s = np.r_[st, stream[ops].astype(np.float64)][o]
    ok = ~np.isnan(s)
    ql = np.full(len(o), np.nan)
    if ok.any():  # the running sum per stream, in time order
        g = codes(s[ok])
        by = np.argsort(g, kind="stable")
        qs = q[ok][by]
        cs = np.cumsum(qs)
        pos = np.arange(len(qs))
        head = np.maximum.accumulate(np.where(new_group(g[by]), pos, 0))
        run = np.empty(len(qs), np.int64)
        run[by] = cs - cs[head] + qs[head]
        ql[ok] = run
    out = np.full(len(df), np.nan)
    out[rows[o]] = ql
    return out


def hta_critical_path(events: pd.DataFrame, rank: int = 0, annotation: str = "", instance: int = 0) -> HtaPath:
    with no_gc():  # (as build_graph: no cycles, and a full collection cost more than the small cases)
        return _hta_critical_path(events, rank, annotation, instance)


def _hta_critical_path(events: pd.DataFrame, rank: int, annotation: str, instance: int) -> HtaPath:
    df = _rank_frame(events, rank)
    if df.empty:
        raise InputError(f"no events on rank {rank}")
    lo, hi = _window(df, annotation, instance)
    n_ev = len(df)
    cpu_ev = df[df["stream"].eq(-1)]
    a = cpu_ev[(cpu_ev["ts"] >= lo) & (cpu_ev["ts"] <= hi) & (cpu_ev["dur"] > 0)].index
    gpu_ev = df[df["stream"].ne(-1)]
    rt_of_gpu = pd.Series(cpu_ev.index, index=cpu_ev["ic"].to_numpy())
    rt_of_gpu = rt_of_gpu[~rt_of_gpu.index.duplicated(keep="last")]
    r = rt_of_gpu.reindex(gpu_ev.index).to_numpy()
    ok = ~np.isnan(r)
    ri = np.where(ok, r, 0).astype(np.int64)
    in_win = ok & (df["ts"].to_numpy()[ri] >= lo) & (df["ts"].to_numpy()[ri] <= hi) & (df["dur"].to_numpy()[ri] > 0)
    b = gpu_ev.index[in_win | (gpu_ev["sync_kind"] == "Stream Wait Event").to_numpy()]
    clip = df.loc[a.union(b)]

    # ---- nodes: start and end of every operator / runtime call / correlated GPU event
    is_node = clip["kind"].isin(["cpu_op", "runtime"]) | (clip["stream"].ne(-1) & (clip["ic"] >= 0))
    ev_nodes = clip.index.to_numpy()[is_node.to_numpy(bool)]
    k = len(ev_nodes)
    pt_ev = np.r_[ev_nodes, ev_nodes]
    pt_ts = np.r_[df["ts"].to_numpy()[ev_nodes], df["end"].to_numpy()[ev_nodes]]
    pt_start = np.r_[np.ones(k, bool), np.zeros(k, bool)]
    o = np.argsort(pt_ts, kind="stable")
    pt_ev, node_ts, pt_start = pt_ev[o], pt_ts[o], pt_start[o]
    start_node = np.full(n_ev, -1, np.int64)  # event row -> its start point's node id (-1: none)
    end_node = np.full(n_ev, -1, np.int64)
    ids = np.arange(2 * k, dtype=np.int64)
    start_node[pt_ev[pt_start]] = ids[pt_start]
    end_node[pt_ev[~pt_start]] = ids[~pt_start]
    blocking = np.zeros(n_ev, bool)
    blocking[ev_nodes] = df["name"].iloc[ev_nodes].isin(BLOCKING_CALLS).to_numpy(bool)

    # ---- CPU: call stacks per thread (HTA's enter/exit callbacks), then GPU
    cpu = clip[clip["stream"].eq(-1)]
    parts = [
        _call_stack_edges(cpu, start_node, end_node, blocking, node_ts),
        _gpu_edges(df, clip, start_node, end_node, node_ts),
    ]
    s, d, w, t = (np.concatenate([p[i] for p in parts]) for i in range(4))

    n = 2 * k
    if (w < 0).any():
        raise InputError("negative edge weight in the HTA-compatible graph (events out of order)")
    length, path = _longest_path(n, s, d, w)
    # the weight and type of each path step: of the last edge added between its two points
    key = s * max(n, 1) + d
    by_key = np.argsort(key, kind="stable")
    path = np.asarray(path, np.int64)
    step = by_key[np.searchsorted(key[by_key], path[:-1] * max(n, 1) + path[1:], side="right") - 1]
    types, weights = t[step], w[step]
    first = {k: int(np.argmax(types == k)) for k in range(len(EDGE_TYPES)) if (types == k).any()}
    on_path = {
        EDGE_TYPES[k]: int(weights[types == k].sum()) for k in sorted(first, key=first.__getitem__)
    }  # in path order
    return HtaPath(
        cp_us=int(length),
        path_nodes=len(path),
        graph_nodes=len(_distinct(np.r_[s, d])),
        graph_edges=len(_distinct(key)),
        breakdown_us=on_path,
        window_us=(lo, hi),
        path_points=tuple(zip(pt_ev[path].tolist(), pt_start[path].tolist(), node_ts[path].tolist())),
    )


def _call_stack_edges(cpu: pd.DataFrame, start_node, end_node, blocking, node_ts) -> tuple:
    """Edges of every thread's call stacks, thread by thread in order of first appearance."""
    grp = group_numbers(cpu["pid"].to_numpy(np.int64), cpu["tid"].to_numpy(np.int64))
    idx = cpu.index.to_numpy(np.int64)
    ts, end, dur = cpu["ts"].to_numpy(np.int64), cpu["end"].to_numpy(np.int64), cpu["dur"].to_numpy(np.int64)
    # HTA's event order: by time; at equal time ends before starts; longer starts first, shorter ends first
    g2, t2 = np.r_[grp, grp], np.r_[ts, end]
    flag = np.r_[np.ones(len(idx), np.int64), np.zeros(len(idx), np.int64)]
    k3, k4 = np.r_[-dur, dur], np.r_[idx, -idx]
    o = np.lexsort((k4, k3, flag, t2, g2))
    return _stack_kernel(g2[o], flag[o].astype(np.bool_), np.r_[idx, idx][o], start_node, end_node, blocking, node_ts)


@numba.njit(cache=True)
def _stack_kernel(grp, is_start, ev, start_node, end_node, blocking, node_ts):
    """HTA's depth-first walk of each thread's call tree, done in one pass over the ordered
    start/end points: a call's parent is the call on top of the stack when it starts, the walk
    enters calls in start order and leaves, before entering a call, every call on the way back
    up to that call's parent (so the edges come out in HTA's order)."""
    m = ev.shape[0]
    src = np.empty(2 * m, np.int64)
    dst = np.empty(2 * m, np.int64)
    wt = np.empty(2 * m, np.int64)
    typ = np.empty(2 * m, np.int64)
    ne = 0
    stack = np.empty(m, np.int64)  # the parse stack (the open calls)
    walk = np.empty(m, np.int64)  # the walk's path from the root to the call entered last
    i = 0
    while i < m:
        g = grp[i]
        j = i
        while j < m and grp[j] == g:
            j += 1
        ne = _thread_walk(
            i, j, is_start, ev, start_node, end_node, blocking, node_ts, stack, walk, src, dst, wt, typ, ne
        )
        i = j
    return src[:ne], dst[:ne], wt[:ne], typ[:ne]


# inlined into _stack_kernel (one compiled loop); the loop over a thread's points stays whole here:
# split further, into steps inlined once per point, it ran slower
@numba.njit(cache=True, inline="always")
def _thread_walk(i, j, is_start, ev, start_node, end_node, blocking, node_ts, stack, walk, src, dst, wt, typ, ne):
    """One thread's points i..j-1: its edges from edge `ne` on; the next edge's index."""
    sp = 0
    wp = 0
    last = -1  # the walk's last point inside the current top-level call (-1: none)
    last_top = -1  # the end of the last top-level call left
    depth = 0
    for q in range(i, j + 1):
        if q < j and not is_start[q]:
            if sp > 0:
                sp -= 1
            continue
        parent = stack[sp - 1] if (q < j and sp > 0) else -1
        # leave every call on the walk down to (not including) the new call's parent
        while wp > 0 and walk[wp - 1] != parent:
            e = walk[wp - 1]
            wp -= 1
            sn, en = start_node[e], end_node[e]
            if sn < 0 or en < 0:
                continue
            depth -= 1
            if last >= 0:
                src[ne] = last
                dst[ne] = en
                wt[ne] = 0 if blocking[e] else node_ts[en] - node_ts[last]
                typ[ne] = 0
                ne += 1
            if depth == 0:
                last = -1
                last_top = en
            else:
                last = en
        if q == j:
            break
        e = ev[q]
        stack[sp] = e
        sp += 1
        walk[wp] = e
        wp += 1
        sn, en = start_node[e], end_node[e]
        if sn < 0 or en < 0:
            continue
        if depth == 0 and last_top >= 0:
            src[ne] = last_top
            dst[ne] = sn
            wt[ne] = 0
            typ[ne] = 1
            ne += 1
        depth += 1
        if last >= 0:
            src[ne] = last
            dst[ne] = sn
            wt[ne] = node_ts[sn] - node_ts[last]
            typ[ne] = 0
            ne += 1
        last = sn
    return ne


def _gpu_edges(df, clip, start_node, end_node, node_ts) -> tuple:
    n_ev = len(df)
    ql = _queue_lengths(df)
    launch = df[df["kind"].eq("runtime") & df["name"].isin(HTA_LAUNCH_CALLS) & (df["ic"] > 0)]
    launch = launch.sort_values("ts", kind="stable")
    op_of = df["ic"].to_numpy(np.int64)
    launch = launch.assign(
        stream=df["stream"].to_numpy()[op_of[launch.index]],
        gpu=df["pid"].to_numpy()[op_of[launch.index]],
        launch_id=np.arange(len(launch)),
    )

    # cudaEventRecord -> last launch on the recorded (gpu, stream) before it (by record correlation)
    rec_corr, rec_prev = np.zeros(0, np.int64), np.zeros(0, np.int64)
    recs = df[df["name"].eq("cudaEventRecord")]
    waits = df[df["wait_stream"] > -1][["wait_corr", "wait_stream", "pid"]].drop_duplicates()
    if len(recs) and len(waits):
        r = recs.reset_index()[["index", "ts", "correlation", "pid"]].merge(
            waits.rename(columns={"wait_corr": "correlation"}), on="correlation", suffixes=("", "_w")
        )
        corr, prev = [], []
        for (gpu, stream), grp in r.groupby(["pid_w", "wait_stream"]):
            L = launch[(launch["gpu"] == gpu) & (launch["stream"] == stream)]
            pos = np.searchsorted(L["ts"].to_numpy(), grp["ts"].to_numpy(), side="left")
            corr.append(grp["correlation"].to_numpy(np.int64))
            prev.append(_at(L.index.to_numpy(np.int64), pos - 1))
        # a later group overwrites an earlier one for the same record, as a dict update would
        c = pd.Series(np.concatenate(prev), index=np.concatenate(corr))
        c = c[~c.index.duplicated(keep="last")].sort_index()
        rec_corr, rec_prev = c.index.to_numpy(np.int64), c.to_numpy(np.int64)
    # cudaStreamWaitEvent -> next launch on the same thread onto the waiting stream (by call row)
    next_launch = np.full(n_ev, -1, np.int64)
    swe = df[df["name"].eq("cudaStreamWaitEvent") & (df["ic"] > 0)]
    if len(swe) and (df["sync_kind"] == "Stream Wait Event").any():
        swe = swe.assign(stream=df["stream"].to_numpy()[op_of[swe.index]])
        for (pid, tid, stream), grp in swe.groupby(["pid", "tid", "stream"]):
            L = launch[(launch["pid"] == pid) & (launch["tid"] == tid) & (launch["stream"] == stream)]
            pos = np.searchsorted(L["ts"].to_numpy(), grp["ts"].to_numpy(), side="right")
            next_launch[grp.index.to_numpy(np.int64)] = _at(L.index.to_numpy(np.int64), pos)

    g = clip[((clip["stream"] != -1) | clip["sync_kind"].isin(["Event Sync", "Context Sync"])) & (clip["ic"] >= 0)]
    sort_by = np.where(g["kind"].eq("sync"), g["end"], g["ts"])
    g = g.iloc[np.argsort(sort_by, kind="stable")]
    sk = g["sync_kind"].to_numpy(dtype=object)
    code = np.select([sk == "Stream Wait Event", sk == "Event Sync", sk == "Context Sync"], [1, 2, 3], 4)
    code = np.where(g["kind"].eq("sync").to_numpy(bool), code, 0)  # 0: a GPU op
    wait_corr = g["wait_corr"].to_numpy(np.int64)
    # the launch before each waited-for record (-1: none known)
    pos = np.searchsorted(rec_corr, wait_corr)
    found = pos < len(rec_corr)
    found[found] = rec_corr[pos[found]] == wait_corr[found]
    prev_launch = np.where(found & (wait_corr != -1), _at(rec_prev, pos), -1)
    streams = g["stream"].to_numpy(np.int64)
    stream_id = np.searchsorted(_distinct(streams), streams)
    return _gpu_kernel(
        g.index.to_numpy(np.int64),
        code,
        stream_id.astype(np.int64),
        g["ic"].to_numpy(np.int64),
        prev_launch,
        next_launch,
        op_of,
        ql,
        df["ts"].to_numpy(np.int64),
        start_node,
        end_node,
        node_ts,
    )


def _distinct(x: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an int array (np.unique, by a plain sort: numpy 2.4's
    hash-based np.unique took 0.5 s on the 1M edge keys of a 500k-event trace, a sort 10 ms)."""
    x = np.sort(x)
    return x[np.r_[True, x[1:] != x[:-1]]] if len(x) else x


def _at(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """a[pos] where 0 <= pos < len(a), else -1."""
    ok = (pos >= 0) & (pos < len(a))
    out = np.full(len(pos), -1, np.int64)
    out[ok] = a[pos[ok]]
    return out


@numba.njit(cache=True)
def _gpu_kernel(eid, code, stream, ic, prev_launch, next_launch, op_of, ql, full_ts, start_node, end_node, node_ts):
    """HTA's walk over GPU events in time order: each op after its stream's previous op or, when
    the stream was idle, after its launch; synchronisations to the ops they wait for."""
    m = eid.shape[0]
    n_streams = stream.max() + 1 if m else 0
    cap = 2 * m + 1
    src = np.empty(cap, np.int64)
    dst = np.empty(cap, np.int64)
    wt = np.empty(cap, np.int64)
    typ = np.empty(cap, np.int64)
    ne = 0
    last = np.full(n_streams, -1, np.int64)  # the stream's last op's end point
    first_set = np.empty(n_streams, np.int64)  # streams in the order they got a last op
    n_set = 0
    kernel_sync = np.full(full_ts.shape[0], -1, np.int64)
    for q in range(m):
        c = code[q]
        if c != 0:
            if ne + n_set + 1 > cap:  # room for a context sync's edges
                cap = 2 * cap + n_set
                src, dst, wt, typ = _grow(src, cap), _grow(dst, cap), _grow(wt, cap), _grow(typ, cap)
            ne = _sync_edges(
                q,
                c,
                stream,
                ic,
                prev_launch,
                next_launch,
                op_of,
                end_node,
                kernel_sync,
                last,
                first_set,
                n_set,
                src,
                dst,
                wt,
                typ,
                ne,
            )
            continue
        if ne + 3 > cap:
            cap = 2 * cap
            src, dst, wt, typ = _grow(src, cap), _grow(dst, cap), _grow(wt, cap), _grow(typ, cap)
        e = eid[q]
        sn, en = start_node[e], end_node[e]
        src[ne], dst[ne], wt[ne], typ[ne] = sn, en, node_ts[en] - node_ts[sn], 0
        ne += 1
        runtime = ic[q]
        sync_src = kernel_sync[e]
        kernel_sync[e] = -1
        sync_end = end_node[sync_src] if sync_src >= 0 else -1
        if sync_end >= 0:
            src[ne], dst[ne], wt[ne], typ[ne] = sync_end, sn, 0, 4
            ne += 1
        prev = last[stream[q]]
        if (
            ql[runtime] == 1
            and ql[e] == 0
            and (prev < 0 or node_ts[prev] < full_ts[runtime])
            and (sync_end < 0 or node_ts[sync_end] < full_ts[runtime])
        ):
            rs = start_node[runtime]
            if rs >= 0:
                src[ne], dst[ne], wt[ne], typ[ne] = rs, sn, node_ts[sn] - node_ts[rs], 2
                ne += 1
        elif prev >= 0 and (sync_end < 0 or node_ts[sync_end] < node_ts[prev]):
            src[ne], dst[ne], wt[ne], typ[ne] = prev, sn, node_ts[sn] - node_ts[prev], 3
            ne += 1
        if last[stream[q]] < 0:
            first_set[n_set] = stream[q]
            n_set += 1
        last[stream[q]] = en
    return src[:ne], dst[:ne], wt[:ne], typ[:ne]


@numba.njit(cache=True)
def _edge(src, dst, wt, typ, ne, a, b, w, t):
    """Edge `ne`: a -> b, weight w, type t; the next edge's index."""
    src[ne], dst[ne], wt[ne], typ[ne] = a, b, w, t
    return ne + 1


@numba.njit(cache=True)
def _sync_edges(
    q,
    c,
    stream,
    ic,
    prev_launch,
    next_launch,
    op_of,
    end_node,
    kernel_sync,
    last,
    first_set,
    n_set,
    src,
    dst,
    wt,
    typ,
    ne,
):
    """A synchronisation's edges (c: 1 stream wait event, 2 event sync, 3 context sync, 4 stream
    sync): a stream wait marks the next launch's kernel to wait for the recorded one; the others end
    their runtime call after the ops they wait for (every stream's last, for a context sync)."""
    if c == 1 or c == 2:
        prev = prev_launch[q]
        if prev < 0:
            return ne
        src_kernel = op_of[prev]
        if c == 1:
            nxt = next_launch[ic[q]] if ic[q] >= 0 else -1
            if nxt >= 0:
                kernel_sync[op_of[nxt]] = src_kernel
            return ne
        en, rt_end = end_node[src_kernel], end_node[ic[q]]
        return _edge(src, dst, wt, typ, ne, en, rt_end, 0, 4) if en >= 0 and rt_end >= 0 else ne
    rt_end = end_node[ic[q]]
    if rt_end < 0:
        return ne
    if c == 3:
        for j in range(n_set):
            ne = _edge(src, dst, wt, typ, ne, last[first_set[j]], rt_end, 0, 4)
    elif last[stream[q]] >= 0:
        ne = _edge(src, dst, wt, typ, ne, last[stream[q]], rt_end, 0, 4)
    return ne


@numba.njit(cache=True)
def _grow(a, cap):
    out = np.empty(cap, a.dtype)
    out[: a.shape[0]] = a
    return out


@numba.njit(cache=True)
def _longest_path_kernel(n, order, s, d, w):
    """Longest path in topological order; ties keep the first predecessor found (as HTA does)."""
    order_e = np.argsort(s, kind="mergesort")
    indptr = np.zeros(n + 1, np.int64)
    for k in range(s.shape[0]):
        indptr[s[k] + 1] += 1
    for i in range(n):
        indptr[i + 1] += indptr[i]
    dist = np.zeros(n, np.int64)
    pred = np.full(n, -1, np.int64)
    for u in order:
        for j in range(indptr[u], indptr[u + 1]):
            k = order_e[j]
            v = d[k]
            if dist[u] + w[k] > dist[v] or (pred[v] == -1 and dist[u] + w[k] >= dist[v]):
                dist[v] = dist[u] + w[k]
                pred[v] = u
    return dist, pred


def _longest_path(n, s, d, w) -> tuple[int, np.ndarray]:
    if n == 0:
        return 0, np.zeros(0, np.int64)
    order = toposort(n, s, d)
    if len(order) < n:
        raise InputError("dependency cycle in the HTA-compatible graph")
    dist, pred = _longest_path_kernel(n, order, s, d, w)
    return int(dist.max()), _backtrack(pred, np.argmax(dist))


@numba.njit(cache=True)
def _backtrack(pred, v):
    """The path ending at v, first node first."""
    m = 1
    u = v
    while pred[u] >= 0:
        u = pred[u]
        m += 1
    path = np.empty(m, np.int64)
    for i in range(m - 1, -1, -1):
        path[i] = v
        v = pred[v]
    return path
