"""graph: the execution graph of the traced run and its slack summary."""

from __future__ import annotations

from pathlib import Path

from emo.stages import Stage

STAGE = Stage(
    inputs={"events": ("trace", "events.parquet")}, outputs=("nodes.parquet", "edges.parquet", "summary.json")
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    import pandas as pd

    from emo.graph import build_graph, summary
    from emo.io import write_json

    graph = build_graph(pd.read_parquet(inputs["events"]))
    graph.save(out)
    s = summary(graph)
    write_json(out / "summary.json", s)
    return {k: v for k, v in s.items() if isinstance(v, (int, float))}
