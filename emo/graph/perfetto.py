"""Write the analysis back into the trace as extra tracks Perfetto (ui.perfetto.dev) shows beside the
original ones: one process "EMO critical path" (a track per rank, one slice per path node, coloured
by category) and one process "EMO slack" (a track per GPU stream, one slice per slack window)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from emo.graph.graph import Graph
from emo.graph.summary import path_breakdown
from emo.graph.whatif import Result, slack_windows
from emo.io import write_json
from emo.trace.kineto import load_json

CP_PID = "EMO critical path"
SLACK_PID = "EMO slack"
# Chrome trace reserved colour names per category, so the path reads at a glance
COLOUR = {
    "cpu": "thread_state_running",
    "launch": "yellow",
    "queueing": "grey",
    "gpu_compute": "good",
    "memcpy": "olive",
    "communication": "bad",
    "sync": "terrible",
    "start_offset": "white",
}


def analysis_tracks(graph: Graph, result: Result, t0_ns: int) -> list[dict]:
    """Chrome-trace events for the critical path and the slack windows (absolute µs timestamps)."""
    nodes = graph.nodes
    bd = path_breakdown(graph, result)
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": CP_PID, "tid": 0, "args": {"name": CP_PID}},
        {"ph": "M", "name": "process_name", "pid": SLACK_PID, "tid": 0, "args": {"name": SLACK_PID}},
    ]
    start = result.start_ns[bd["node"].to_numpy()] + t0_ns
    names = nodes["name"].to_numpy(dtype=object)[bd["node"].to_numpy()]
    for (node, rank, kind, delay, dcat, dur, cat), s, name in zip(bd.itertuples(index=False), start, names):
        tid = f"rank {rank}" if rank >= 0 else "cross-rank"
        if delay > 0:
            out.append(
                {
                    "ph": "X",
                    "pid": CP_PID,
                    "tid": tid,
                    "ts": (s - delay) / 1e3,
                    "dur": delay / 1e3,
                    "name": dcat,
                    "cat": "emo_critical_path",
                    "cname": COLOUR.get(dcat, "generic_work"),
                    "args": {"before_node": int(node), "category": dcat},
                }
            )
        if dur > 0 or kind in ("rendezvous", "coll_wait"):
            out.append(
                {
                    "ph": "X",
                    "pid": CP_PID,
                    "tid": tid,
                    "ts": s / 1e3,
                    "dur": dur / 1e3,
                    "name": str(name)[:120],
                    "cat": "emo_critical_path",
                    "cname": COLOUR.get(cat, "generic_work"),
                    "args": {
                        "node": int(node),
                        "kind": kind,
                        "category": cat,
                        "slack_us": float(result.slack_ns[node]) / 1e3,
                    },
                }
            )
    win = slack_windows(graph, result)
    for w in win.itertuples(index=False):
        out.append(
            {
                "ph": "X",
                "pid": SLACK_PID,
                "tid": f"rank {w.rank} gpu {w.device} stream {w.stream}",
                "ts": (w.start_ns + t0_ns) / 1e3,
                "dur": (w.end_ns - w.start_ns) / 1e3,
                "name": f"slack {w.slack_ns / 1e3:.1f} us",
                "cat": "emo_slack",
                "args": {"slack_us": w.slack_ns / 1e3, "nodes": int(w.nodes)},
            }
        )
    return out


def original_events(source: Path, events: pd.DataFrame) -> tuple[list[dict], dict]:
    """The source trace's own events (Kineto JSON: as written; nsys: rebuilt from the event table)."""
    files = (
        sorted(p for p in source.iterdir() if p.name.endswith((".json", ".json.gz"))) if source.is_dir() else [source]
    )
    if all(p.name.endswith((".json", ".json.gz")) for p in files) and files:
        out: list[dict] = []
        meta: dict = {}
        for p in files:
            doc = load_json(p)
            out.extend(doc["traceEvents"])
            meta = meta or {k: v for k, v in doc.items() if k != "traceEvents"}
        return out, meta
    ev = events
    pid = np.where(ev["device"] >= 0, "GPU " + ev["device"].astype(str), "host " + ev["pid"].astype(str))
    tid = np.where(ev["device"] >= 0, "stream " + ev["stream"].astype(str), "thread " + ev["thread"].astype(str))
    rows = [
        {
            "ph": "X",
            "pid": p,
            "tid": t,
            "ts": s / 1e3,
            "dur": d / 1e3,
            "name": n,
            "cat": k,
            "args": {"correlation": int(c)},
        }
        for p, t, s, d, n, k, c in zip(
            pid, tid, ev["start_ns"], ev["dur_ns"], ev["name"], ev["kind"], ev["correlation"]
        )
    ]
    return rows, {}


def write_perfetto(
    out: str | Path, source: str | Path, events: pd.DataFrame, graph: Graph, result: Result, t0_ns: int
) -> None:
    """The original trace plus EMO's tracks, written atomically (gzip when OUT ends in .gz)."""
    base, meta = original_events(Path(source), events)
    doc = dict(meta)
    doc["traceEvents"] = base + analysis_tracks(graph, result, t0_ns)
    write_json(out, doc, gz=str(out).endswith(".gz"))
