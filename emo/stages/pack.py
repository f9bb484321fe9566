"""pack: pack the execution graph's compute kernels (emo.pack) into packs of at most Δmax and write
the packs table and the pack-level graph (same schema as the execution graph)."""

from __future__ import annotations

import logging
from pathlib import Path

from emo.stages import Stage

log = logging.getLogger("emo")

STAGE = Stage(
    reads=("packing",),
    inputs={
        "nodes": ("graph", "nodes.parquet"),
        "edges": ("graph", "edges.parquet"),
        "iterations": ("graph", "iterations.parquet"),
    },
    outputs=("packs.parquet", "nodes.parquet", "edges.parquet", "node_map.parquet", "iterations.parquet"),
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    import numpy as np
    import pandas as pd

    from emo.graph import Graph
    from emo.io import write_parquet
    from emo.pack import members_of, pack

    graph = Graph.load(inputs["nodes"].parent)
    pg = pack(graph, float(cfg["packing"]["delta_max_ms"]))
    packs = pg.packs.copy()
    start = np.zeros(len(graph.nodes), np.int64)
    m = pg.pack_of >= 0
    start[m] = graph.nodes["start_ns"].to_numpy()[m]
    packs["members"] = [a.tolist() for a in members_of(pg.pack_of, start)] if len(packs) else []
    write_parquet(out / "packs.parquet", packs)
    pg.graph.save(out)  # nodes.parquet, edges.parquet: the pack-level graph
    write_parquet(out / "node_map.parquet", _node_map(pg))
    anchors = pd.read_parquet(inputs["iterations"])
    anchors["node"] = pg.node_map[anchors["node"].to_numpy()]  # host nodes keep their place in the pack graph
    write_parquet(out / "iterations.parquet", anchors)
    from emo.pack.greedy import HOST_MARGIN_MS

    kernels = int(m.sum())
    late = launched_late(graph)
    if kernels and late > kernels // 2:
        log.warning(
            "pack: %d of %d kernels start less than %.1f ms after their launch: the host barely runs ahead of "
            "the GPU, so packs stay small (%.2f kernels a pack); a trace whose profiler made the run host-bound "
            "does this (the graph stage's summary.json `untraced`)",
            late,
            kernels,
            HOST_MARGIN_MS,
            kernels / max(len(packs), 1),
        )
    return {
        "kernels_launched_late": late,
        "kernels": kernels,
        "packs": len(packs),
        "signatures": int(packs["signature"].nunique()),
        "kernels_per_pack": round(kernels / max(len(packs), 1), 3),
        "max_pack_ms": round(float(packs["dur_ns"].max()) / 1e6, 3) if len(packs) else 0.0,
        "pack_graph_nodes": len(pg.graph.nodes),
    }


def launched_late(graph) -> int:
    """Kernels launched too shortly before they start to join a pack (emo.pack.greedy rule 4)."""

    from emo.graph.whatif import compile_graph, whatif
    from emo.pack.greedy import HOST_MARGIN_MS, launch_lead_ns

    lead = launch_lead_ns(graph, whatif(compile_graph(graph), slack=False))
    return int((lead < HOST_MARGIN_MS * 1e6).sum())


def _node_map(pg):
    import numpy as np
    import pandas as pd

    return pd.DataFrame(
        {"node": np.arange(len(pg.node_map), dtype=np.int64), "pack_node": pg.node_map, "pack": pg.pack_of}
    )
