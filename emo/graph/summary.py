"""The numbers `emo analyze --json` prints: critical path, its breakdown, slack per GPU, replay error,
collective matching and, for multi-rank traces, who waited for whom."""

from __future__ import annotations

import numpy as np
import pandas as pd

from emo.graph.graph import Graph
from emo.graph.whatif import Compiled, Result, compile_graph, slack_windows, take_edge, whatif
from emo.trace.schema import LAUNCH_CALLS

# What a node's own duration counts as on the critical path.
DUR_CATEGORY = {
    "cpu": "cpu",
    "sync": "sync",
    "kernel": "gpu_compute",
    "memset": "gpu_compute",
    "memcpy": "memcpy",
    "collective": "communication",
    "coll_wait": "communication",
    "rendezvous": "communication",
}
# What the fixed delay before a node counts as, by the kind of edge that bound its start.
DELAY_CATEGORY = {
    "launch": "launch",
    "stream": "queueing",
    "event": "queueing",
    "sync": "queueing",
    "collective": "queueing",
    "program": "cpu",
}
CATEGORIES = ("cpu", "launch", "queueing", "gpu_compute", "memcpy", "communication", "sync", "start_offset")


def _us(ns) -> float:
    return round(float(ns) / 1e3, 3)


def _sums(values: np.ndarray, *keys: np.ndarray) -> dict:
    """Sum of `values` per distinct key (one array: its values; several: tuples), in key order
    (as a groupby sum gives them)."""
    if not len(values):
        return {}
    k = np.stack(keys) if len(keys) > 1 else keys[0]
    uniq, inv = np.unique(k, axis=1 if len(keys) > 1 else None, return_inverse=True)
    out = np.zeros(uniq.shape[-1], np.int64)
    np.add.at(out, inv.ravel(), values)
    labels = (
        [tuple(int(x) for x in col) for col in uniq.T]
        if len(keys) > 1
        else [x.item() if hasattr(x, "item") else x for x in uniq]
    )
    return {lab: int(x) for lab, x in zip(labels, out)}


def path_breakdown(graph: Graph, result: Result) -> pd.DataFrame:
    """One row per critical-path node: the time it adds to the path and the category of that time."""
    nodes, edges = graph.nodes, graph.edges
    path = result.critical_path
    kind = nodes["kind"].to_numpy(dtype=object)[path]
    name = nodes["name"].to_numpy(dtype=object)[path]
    ce = result.critical_edge[path]
    ekind = take_edge(edges["kind"].to_numpy(dtype=object), ce, "")
    # a node's duration is on the path unless its successor on the path waits only for its start
    nxt_from_start = np.r_[take_edge(edges["from_start"].to_numpy(bool), ce[1:], False), False]
    dur = np.where(nxt_from_start, 0, (result.finish_ns - result.start_ns)[path])
    dcat = np.array([DUR_CATEGORY.get(k, "cpu") for k in kind], dtype=object)
    dcat[(kind == "runtime") & np.isin(name, list(LAUNCH_CALLS))] = "launch"
    lcat = np.array([DELAY_CATEGORY.get(k, "start_offset") if k else "start_offset" for k in ekind], dtype=object)
    return pd.DataFrame(
        {
            "node": path,
            "rank": nodes["rank"].to_numpy()[path],
            "kind": kind,
            "delay_ns": result.delay_ns[path],
            "delay_category": lcat,
            "dur_ns": dur,
            "dur_category": dcat,
        }
    )


def collective_waits(graph: Graph, result: Result) -> dict:
    """Per matched collective, how long each rank waited for the last one to arrive."""
    n = graph.nodes
    waits = n[n["kind"] == "coll_wait"]
    if waits.empty:
        return {"wait_us_by_rank": {}, "waited_for_us_by_rank": {}, "per_collective": []}
    e = graph.edges
    to_rv = e[(e["kind"] == "collective") & e["src"].isin(waits.index)]
    w = pd.DataFrame({"rv": to_rv["dst"].to_numpy(), "node": to_rv["src"].to_numpy()})
    w["rank"] = n["rank"].to_numpy()[w["node"]]
    w["arrive"] = n["start_ns"].to_numpy()[w["node"]]
    w["last"] = w.groupby("rv")["arrive"].transform("max")
    w["wait"] = w["last"] - w["arrive"]
    last_rank = w.sort_values("arrive").groupby("rv")["rank"].last()
    w["waited_for"] = w["rv"].map(last_rank)
    per = []
    for rv, g in w.groupby("rv", sort=True):
        per.append(
            {
                "name": str(n["name"].iat[rv])[:80],
                "last_rank": int(last_rank[rv]),
                "wait_us": {int(r): _us(x) for r, x in zip(g["rank"], g["wait"])},
            }
        )
    return {
        "wait_us_by_rank": {int(r): _us(x) for r, x in w.groupby("rank")["wait"].sum().items()},
        "waited_for_us_by_rank": {int(r): _us(x) for r, x in w.groupby("waited_for")["wait"].sum().items()},
        "per_collective": per,
    }


def summary(graph: Graph, result: Result | None = None, compiled: Compiled | None = None) -> dict:
    """The analysis of one graph as a JSON-ready dict (the keys `emo analyze --json` prints)."""
    compiled = compiled or compile_graph(graph)
    result = result or whatif(compiled)
    bd = path_breakdown(graph, result)
    dur, delay, rank = (bd[c].to_numpy(np.int64) for c in ("dur_ns", "delay_ns", "rank"))
    breakdown = dict.fromkeys(CATEGORIES, 0)
    for cats, ns in ((bd["dur_category"].to_numpy(), dur), (bd["delay_category"].to_numpy(), delay)):
        for cat, x in _sums(ns, cats.astype(str)).items():
            breakdown[cat] += x
    cp_ns = int(dur.sum() + delay.sum())
    per_rank = _sums(dur + delay, rank)
    win = slack_windows(graph, result)
    wr, wd = win["rank"].to_numpy(np.int64), win["device"].to_numpy(np.int64)
    slack = {f"rank{r}/gpu{d}": _us(x) for (r, d), x in _sums(win["slack_ns"].to_numpy(np.int64), wr, wd).items()}
    n = graph.nodes
    dev = n["device"].to_numpy()
    for r, d in _sums(np.zeros(int((dev >= 0).sum()), np.int64), n["rank"].to_numpy()[dev >= 0], dev[dev >= 0]):
        slack.setdefault(f"rank{r}/gpu{d}", 0.0)
    ranks_on_path = sorted(int(r) for r in np.unique(rank) if r >= 0)
    return {
        "critical_path_us": _us(cp_ns),
        "makespan_us": _us(result.makespan_ns),
        "breakdown_us": {k: _us(v) for k, v in breakdown.items()},
        "replay_error_us": _us(result.replay_error_ns),
        "ranks": [int(r) for r in graph.meta.get("ranks", sorted(n.loc[n["rank"] >= 0, "rank"].unique()))],
        # a graph loaded from Parquet has no meta: the rendezvous nodes are the matched collectives
        "collectives": int(graph.meta.get("collectives", (n["kind"] == "rendezvous").sum())),
        "collectives_matched": int(graph.meta.get("collectives_matched", (n["kind"] == "rendezvous").sum())),
        # collectives left unmatched, and why (members absent from the trace, members not named)
        "collectives_unmatched": graph.meta.get("collectives_unmatched", []),
        # what the trace's readers were unsure of (damaged events, ranks absent): the numbers may be wrong
        "warnings": list(graph.meta.get("warnings", [])),
        "slack_us": dict(sorted(slack.items())),
        "nodes": int(len(n)),
        "edges": int(len(graph.edges)),
        "critical_path_nodes": int(len(result.critical_path)),
        "critical_path_ranks": ranks_on_path,
        "critical_path_us_by_rank": {r: _us(x) for r, x in per_rank.items() if r >= 0},
        "collective_waits": collective_waits(graph, result),
    }
