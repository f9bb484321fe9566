"""Critical path with Holistic Trace Analysis's conventions, so EMO's numbers can be put beside HTA's.

HTA (facebookresearch/HolisticTraceAnalysis, `critical_path_analysis.py`) builds, per rank, a graph
of event start/end points: nested CPU operators linked in call-stack order, consecutive top-level
operators linked with weight 0, blocking runtime calls' ends with weight 0, kernels linked to their
launch (when the stream was idle) or to the previous kernel on the stream, and synchronisation
edges with weight 0. Its critical path is the longest path; its length is at most the window's span.
This module reproduces those rules on EMO's event table (timestamps in whole microseconds, as HTA
keeps them) — it is a comparison mode; EMO's own graph (emo.graph.build) is makespan-faithful.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd

from emo.graph.whatif import toposort
from emo.trace.schema import LAUNCH_CALLS

BLOCKING_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery",
                            "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync"})
HTA_LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                              "cudaMemcpyAsync", "cudaMemsetAsync"})
EDGE_TYPES = ("operator", "dependency", "launch_delay", "kernel_kernel_delay", "sync")


@dataclass(frozen=True)
class HtaPath:
    cp_us: int                 # sum of edge weights on the longest path
    path_nodes: int
    graph_nodes: int
    graph_edges: int
    breakdown_us: dict         # weight on the path by HTA edge type
    window_us: tuple[int, int]
    path_points: tuple = ()    # (event row of the rank, is_start, ts_us) along the path


def _rank_frame(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    e = events[events["rank"] == rank].reset_index(drop=True)
    ts = -(-e["start_ns"].to_numpy(np.int64) // 1000)
    end = (e["start_ns"].to_numpy(np.int64) + e["dur_ns"].to_numpy(np.int64)) // 1000
    kind = e["kind"].to_numpy(dtype=object)
    gpu_side = np.isin(kind, ("kernel", "memcpy", "memset", "sync", "gpu_annotation"))
    df = pd.DataFrame({
        "kind": kind, "name": e["name"].to_numpy(dtype=object),
        "pid": np.where(gpu_side, e["device"].to_numpy(np.int64), e["pid"].to_numpy(np.int64)),
        "tid": e["thread"].to_numpy(np.int64), "stream": e["stream"].to_numpy(np.int64),
        "ts": ts, "end": end, "dur": end - ts, "correlation": e["correlation"].to_numpy(np.int64),
        "sync_kind": e["sync_kind"].to_numpy(dtype=object),
        "wait_corr": e["wait_event_corr"].to_numpy(np.int64), "wait_stream": e["wait_stream"].to_numpy(np.int64),
    })
    df["gpu_side"] = gpu_side  # HTA's GPU filter: stream >= 0 or a cuda_sync event
    # index_correlation: host call <-> GPU event of the same correlation id (HTA's convention:
    # -1 no correlation, 0 correlated but partner absent)
    ic = np.minimum(df["correlation"].to_numpy(), 0)
    has = df["correlation"].to_numpy() != -1
    cpu = df[has & ~gpu_side].reset_index()[["index", "correlation"]]
    gpu = df[has & gpu_side].reset_index()[["index", "correlation"]]
    m = cpu.merge(gpu, on="correlation")
    ic[m["index_x"].to_numpy()] = m["index_y"].to_numpy()
    ic[m["index_y"].to_numpy()] = m["index_x"].to_numpy()
    df["ic"] = ic
    return df


def _window(df: pd.DataFrame, annotation: str, instance: int) -> tuple[int, int]:
    if not annotation:
        return int(df["ts"].min()), int(df["end"].max())
    hits = df[df["name"].map(lambda s: annotation in s)]
    if len(hits) <= instance:
        raise ValueError(f"annotation {annotation!r} instance {instance} not found ({len(hits)} instance(s))")
    return int(hits["ts"].iloc[instance]), int(hits["end"].iloc[instance])


def _queue_lengths(df: pd.DataFrame) -> dict[int, int]:
    """HTA's per-stream queue length: +1 at each launch call, -1 at each launched GPU op."""
    launch = df[df["kind"].eq("runtime") & df["name"].isin(HTA_LAUNCH_CALLS) & (df["ic"] > 0)]
    ops = df[df["stream"].ne(-1) & df["correlation"].isin(launch["correlation"])]
    stream_of = dict(zip(ops["correlation"], ops["stream"]))
    a = pd.DataFrame({"index": launch.index, "ts": launch["ts"], "q": 1,
                      "stream": launch["correlation"].map(stream_of)})
    b = pd.DataFrame({"index": ops.index, "ts": ops["ts"], "q": -1, "stream": ops["stream"]})
    m = pd.concat([a, b]).sort_values("ts", kind="stable")
    m["ql"] = m.groupby("stream")["q"].cumsum()
    return dict(zip(m["index"], m["ql"]))


def hta_critical_path(events: pd.DataFrame, rank: int = 0, annotation: str = "", instance: int = 0) -> HtaPath:
    df = _rank_frame(events, rank)
    if df.empty:
        raise ValueError(f"no events on rank {rank}")
    lo, hi = _window(df, annotation, instance)
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
    ev_nodes = clip[is_node]
    pts = pd.DataFrame({"ev": np.r_[ev_nodes.index, ev_nodes.index],
                        "ts": np.r_[ev_nodes["ts"], ev_nodes["end"]],
                        "is_start": np.r_[np.ones(len(ev_nodes), bool), np.zeros(len(ev_nodes), bool)]})
    pts = pts.sort_values("ts", kind="stable").reset_index(drop=True)
    start_node = dict(zip(pts["ev"][pts["is_start"]], pts.index[pts["is_start"]]))
    end_node = dict(zip(pts["ev"][~pts["is_start"]], pts.index[~pts["is_start"]]))
    node_ts = pts["ts"].to_numpy()
    blocking = set(ev_nodes.index[ev_nodes["name"].isin(BLOCKING_CALLS)])
    src, dst, wt, typ = [], [], [], []

    def edge(u, v, kind, zero=False):
        src.append(u)
        dst.append(v)
        wt.append(0 if (zero or kind in ("dependency", "sync")) else int(node_ts[v] - node_ts[u]))
        typ.append(EDGE_TYPES.index(kind))

    # ---- CPU: call stacks per thread, depth-first (HTA's enter/exit callbacks)
    cpu = clip[clip["stream"].eq(-1)]
    for _, th in cpu.groupby(["pid", "tid"], sort=False):
        _call_stack_edges(th, start_node, end_node, blocking, edge)

    # ---- GPU
    _gpu_edges(df, clip, start_node, end_node, node_ts, edge)

    n = len(pts)
    s, d, w = np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(wt, np.int64)
    if (w < 0).any():
        raise ValueError("negative edge weight in the HTA-compatible graph (events out of order)")
    length, path = _longest_path(n, s, d, w)
    t = np.asarray(typ, np.int64)
    on_path = {}
    key = dict(zip(zip(s.tolist(), d.tolist()), zip(w.tolist(), t.tolist())))
    for u, v in zip(path[:-1], path[1:]):
        ww, tt = key[(u, v)]
        on_path[EDGE_TYPES[tt]] = on_path.get(EDGE_TYPES[tt], 0) + ww
    return HtaPath(cp_us=int(length), path_nodes=len(path), graph_nodes=int(len(np.unique(np.r_[s, d]))),
                   graph_edges=len(set(zip(s.tolist(), d.tolist()))), breakdown_us=on_path, window_us=(lo, hi),
                   path_points=tuple((int(pts["ev"].iat[v]), bool(pts["is_start"].iat[v]), int(node_ts[v])) for v in path))


def _call_stack_edges(th: pd.DataFrame, start_node, end_node, blocking, edge) -> None:
    idx = th.index.to_numpy()
    ts, end, dur = th["ts"].to_numpy(), th["end"].to_numpy(), th["dur"].to_numpy()
    # HTA's event order: by time; at equal time ends before starts; longer starts first, shorter ends first
    keys = np.r_[np.c_[ts, np.ones_like(ts), -dur, idx], np.c_[end, np.zeros_like(end), dur, -idx]]
    typ = np.r_[np.ones(len(idx), bool), np.zeros(len(idx), bool)]
    ev = np.r_[idx, idx]
    o = np.lexsort((keys[:, 3], keys[:, 2], keys[:, 1], keys[:, 0]))
    children: dict[int, list] = {-1: []}
    stack: list[int] = []
    for k in o:
        if typ[k]:
            parent = stack[-1] if stack else -1
            children.setdefault(parent, []).append(int(ev[k]))
            children.setdefault(int(ev[k]), [])
            stack.append(int(ev[k]))
        elif stack:
            stack.pop()
    state = {"last": None, "last_top": None, "depth": 0}

    def enter(e):
        sn, en = start_node.get(e), end_node.get(e)
        if sn is None or en is None:
            return
        if state["depth"] == 0 and state["last_top"] is not None:
            edge(state["last_top"], sn, "dependency")
        state["depth"] += 1
        if state["last"] is not None:
            edge(state["last"], sn, "operator")
        state["last"] = sn

    def leave(e):
        sn, en = start_node.get(e), end_node.get(e)
        if sn is None or en is None:
            return
        state["depth"] -= 1
        if state["last"] is not None:
            edge(state["last"], en, "operator", zero=e in blocking)
        if state["depth"] == 0:
            state["last"] = None
            state["last_top"] = en
        else:
            state["last"] = en

    # iterative DFS from the root (-1), calling enter on the way down and leave on the way up
    todo = [(c, False) for c in reversed(children[-1])]
    while todo:
        e, done = todo.pop()
        if done:
            leave(e)
            continue
        enter(e)
        todo.append((e, True))
        todo.extend((c, False) for c in reversed(children.get(e, [])))


def _gpu_edges(df, clip, start_node, end_node, node_ts, edge) -> None:
    q = _queue_lengths(df)
    launch = df[df["kind"].eq("runtime") & df["name"].isin(HTA_LAUNCH_CALLS) & (df["ic"] > 0)]
    launch = launch.sort_values("ts", kind="stable")
    op_of = df["ic"].to_numpy()
    launch = launch.assign(stream=df["stream"].to_numpy()[op_of[launch.index]],
                           gpu=df["pid"].to_numpy()[op_of[launch.index]], launch_id=np.arange(len(launch)))

    # cudaEventRecord -> last launch on the recorded (gpu, stream) before it
    prev_launch_of_record: dict[int, int] = {}
    recs = df[df["name"].eq("cudaEventRecord")]
    waits = df[df["wait_stream"] > -1][["wait_corr", "wait_stream", "pid"]].drop_duplicates()
    if len(recs) and len(waits):
        r = recs.reset_index()[["index", "ts", "correlation", "pid"]].merge(waits.rename(columns={"wait_corr": "correlation"}), on="correlation",
                                     suffixes=("", "_w"))
        for (gpu, stream), grp in r.groupby(["pid_w", "wait_stream"]):
            L = launch[(launch["gpu"] == gpu) & (launch["stream"] == stream)]
            pos = np.searchsorted(L["ts"].to_numpy(), grp["ts"].to_numpy(), side="left")
            for corr, p in zip(grp["correlation"], pos):
                prev_launch_of_record[int(corr)] = int(L.index[p - 1]) if p > 0 else -1
    # cudaStreamWaitEvent -> next launch on the same thread onto the waiting stream
    next_launch_of_wait: dict[int, int] = {}
    swe = df[df["name"].eq("cudaStreamWaitEvent") & (df["ic"] > 0)]
    if len(swe) and (df["sync_kind"] == "Stream Wait Event").any():
        swe = swe.assign(stream=df["stream"].to_numpy()[op_of[swe.index]])
        for (pid, tid, stream), grp in swe.groupby(["pid", "tid", "stream"]):
            L = launch[(launch["pid"] == pid) & (launch["tid"] == tid) & (launch["stream"] == stream)]
            pos = np.searchsorted(L["ts"].to_numpy(), grp["ts"].to_numpy(), side="right")
            for i, p in zip(grp.index, pos):
                next_launch_of_wait[int(i)] = int(L.index[p]) if p < len(L) else -1

    g = clip[((clip["stream"] != -1) | clip["sync_kind"].isin(["Event Sync", "Context Sync"])) & (clip["ic"] >= 0)]
    sort_by = np.where(g["kind"].eq("sync"), g["end"], g["ts"])
    g = g.iloc[np.argsort(sort_by, kind="stable")]
    last: dict[int, int] = {}
    kernel_sync: dict[int, int] = {}
    full_ts = df["ts"].to_numpy()
    for eid, row in zip(g.index, g.itertuples(index=False)):
        if row.kind == "sync":
            sk = row.sync_kind
            if sk in ("Stream Wait Event", "Event Sync"):
                prev = prev_launch_of_record.get(int(row.wait_corr), -1) if row.wait_corr != -1 else -1
                if prev < 0:
                    continue
                src_kernel = int(op_of[prev])
                if sk == "Stream Wait Event":
                    nxt = next_launch_of_wait.get(int(row.ic), -1)
                    if nxt < 0:
                        continue
                    kernel_sync[int(op_of[nxt])] = src_kernel
                else:
                    en = end_node.get(src_kernel)
                    rt_end = end_node.get(int(row.ic))
                    if en is not None and rt_end is not None:
                        edge(en, rt_end, "sync")
                continue
            targets = list(last.values()) if sk == "Context Sync" else [last.get(row.stream)]
            rt_end = end_node.get(int(row.ic))
            for gn in targets:
                if gn is not None and rt_end is not None:
                    edge(gn, rt_end, "sync")
            continue
        sn, en = start_node[eid], end_node[eid]
        edge(sn, en, "operator")
        runtime = int(row.ic)
        added = False
        sync_src = kernel_sync.pop(eid, None)
        sync_end = end_node.get(sync_src) if sync_src is not None else None
        if sync_src is not None and sync_end is None:
            sync_src = None
        if sync_end is not None:
            edge(sync_end, sn, "sync")
            added = True
        prev = last.get(row.stream)
        if (q.get(runtime) == 1 and q.get(eid) == 0
                and (prev is None or node_ts[prev] < full_ts[runtime])
                and (sync_end is None or node_ts[sync_end] < full_ts[runtime])):
            rs = start_node.get(runtime)
            if rs is not None:
                edge(rs, sn, "launch_delay")
                added = True
        elif prev is not None and (sync_end is None or node_ts[sync_end] < node_ts[prev]):
            edge(prev, sn, "kernel_kernel_delay")
            added = True
        last[row.stream] = en


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


def _longest_path(n, s, d, w) -> tuple[int, list[int]]:
    if n == 0:
        return 0, []
    order = toposort(n, s, d)
    if len(order) < n:
        raise ValueError("dependency cycle in the HTA-compatible graph")
    dist, pred = _longest_path_kernel(n, order, s, d, w)
    v = int(np.argmax(dist))
    path = [v]
    while pred[v] >= 0:
        v = int(pred[v])
        path.append(v)
    return int(dist.max()), path[::-1]
