"""Kernel packing (docs/design.md §6): group consecutive compute kernels of a stream into packs of at most
Δmax at the default clock, so that the clock controller and the model work at the granularity a
clock change can act on, and each distinct pack (signature) is profiled once.

    pg = pack(graph, delta_max_ms=5.0)   # -> PackGraph: .packs table, .graph (pack level), .node_map
"""

from __future__ import annotations

from emo.graph import Graph
from emo.graph.whatif import compile_graph, whatif
from emo.pack.greedy import PACK_COLUMNS, members_of, pack_kernels, pack_table, signature
from emo.pack.packgraph import PackGraph, build_pack_graph, pack_durations, pack_graph_durations


def pack(graph: Graph, delta_max_ms: float = 5.0) -> PackGraph:
    """Pack `graph`'s compute kernels (emo.pack.greedy) and build the pack-level graph."""
    if not delta_max_ms > 0:
        raise ValueError(f"packing.delta_max_ms: want > 0, got {delta_max_ms}")
    compiled = compile_graph(graph)
    replay = whatif(compiled, slack=False)
    pack_of = pack_kernels(graph, compiled, replay, int(round(delta_max_ms * 1e6)))
    packs = pack_table(graph, replay, pack_of)
    return build_pack_graph(graph, compiled, replay, pack_of, packs)


__all__ = [
    "pack",
    "PackGraph",
    "PACK_COLUMNS",
    "signature",
    "members_of",
    "pack_durations",
    "pack_graph_durations",
    "pack_kernels",
    "pack_table",
    "build_pack_graph",
]
