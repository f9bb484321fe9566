"""graph: the execution graph of the traced run, its timing corrected to the run measured without
the profiler (emo.graph.untraced; a recorded trace has no such measurement and keeps its own), its
iteration anchors and its slack summary."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from emo.stages import Stage

log = logging.getLogger("emo")

STAGE = Stage(
    inputs={"events": ("trace", "events.parquet"), "measured": ("trace", "measured.json")},
    outputs=("nodes.parquet", "edges.parquet", "iterations.parquet", "summary.json"),
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    import pandas as pd

    from emo.graph import build_graph, summary
    from emo.graph.iterations import iteration_anchors
    from emo.graph.untraced import untrace
    from emo.io import write_json, write_parquet

    events = pd.read_parquet(inputs["events"])
    graph = build_graph(events)
    anchors = iteration_anchors(events, graph.nodes)
    measured = json.loads(inputs["measured"].read_text())
    plain = measured.get("untraced", {}).get("iteration_times_s")
    if plain:
        graph, anchors, info = untrace(graph, events, anchors, plain, measured["iteration_times_s"])
    else:
        info = {"corrected": False, "why": "no untraced measurement (a recorded trace, or trace.untraced_iterations=0)"}
    if "traced_iteration_ms" in info:
        log.info(
            "graph: traced %.3f ms an iteration, untraced %.3f ms (x%.3f): %.3f µs of host time per record "
            "taken off, the corrected graph replays %.3f ms (%+.2f %%)",
            info["traced_iteration_ms"],
            info["untraced_iteration_ms"],
            info["traced_over_untraced"],
            info["host_overhead_us_per_record"],
            info["corrected_iteration_ms"],
            info["corrected_error_pct"],
        )
    graph.save(out)
    write_parquet(out / "iterations.parquet", anchors)
    s = {**summary(graph), "untraced": info}
    for w in s["warnings"]:  # what the trace's readers were unsure of: the slack may be wrong
        log.warning("graph: %s", w)
    write_json(out / "summary.json", s)
    metrics = {k: v for k, v in s.items() if isinstance(v, (int, float))}
    metrics.update({f"untraced_{k}": v for k, v in info.items() if isinstance(v, (int, float)) and k != "corrected"})
    return metrics
