"""The pack-level graph: every pack becomes one node, every other node stays, with emo.graph's schema.

Edges are the kernel graph's, mapped onto packs: edges inside a pack disappear (its members run
back to back), an edge into a member waits for the pack's start, and an edge out of a member leaves
from the pack's end (a `from_start` edge keeps its meaning only from the pack's first member). Every
constraint of the kernel graph is thereby kept or made later, so the what-if pass over the pack
graph is never shorter than over the kernel graph, and equals it at the recorded durations
(emo.pack.greedy's conditions (4) and (5)).

A pack's duration is its members' durations plus the fixed delays between them (launch queueing);
`pack_durations` computes it for any per-kernel durations, so the same stretch can be applied to
both graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from emo.graph.graph import EDGE_COLUMNS, NODE_COLUMNS, Graph, typed
from emo.graph.whatif import Compiled, Result


@dataclass
class PackGraph:
    graph: Graph  # the pack-level graph (packs are `kernel` nodes named "pack:<signature>")
    packs: pd.DataFrame  # emo.pack.greedy.PACK_COLUMNS, `node` = the pack's node in `graph`
    node_map: np.ndarray  # kernel-graph node id -> pack-graph node id
    pack_of: np.ndarray  # kernel-graph node id -> pack id (-1: not packed)
    inner_delay_ns: np.ndarray  # per pack: fixed delays between its members (recorded)


def build_pack_graph(
    graph: Graph, compiled: Compiled, replay: Result, pack_of: np.ndarray, packs: pd.DataFrame
) -> PackGraph:
    nodes, edges = graph.nodes, graph.edges
    n = len(nodes)
    packed = pack_of >= 0
    # pack-graph node order: original order, each pack at its first member's place
    is_first = np.zeros(n, bool)
    is_first[packs["first_node"].to_numpy(np.int64)] = True
    keep = ~packed | is_first
    new_id = np.cumsum(keep) - 1
    node_of_pack = np.empty(len(packs), np.int64)
    node_of_pack[packs["pack"].to_numpy(np.int64)] = new_id[packs["first_node"].to_numpy(np.int64)]
    node_map = np.where(packed, node_of_pack[np.maximum(pack_of, 0)], new_id)

    # the gap before each non-first member, as replayed (its stream edge's lag: launch queueing;
    # a few ns negative where the trace's rounding made it so)
    inner = np.zeros(len(packs), np.int64)
    nonfirst = packed & ~is_first
    gap = np.zeros(n, np.int64)
    gap[nonfirst] = replay.start_ns[nonfirst] - replay.finish_ns[replay.critical_pred[nonfirst]]
    np.add.at(inner, pack_of[nonfirst], gap[nonfirst])

    kept = np.flatnonzero(keep)
    out = nodes.iloc[kept].copy()
    # replayed times: the pack graph derives its fixed delays from them (see module docstring)
    out["start_ns"] = compiled.t0 + replay.start_ns[kept]
    out["dur_ns"] = replay.finish_ns[kept] - replay.start_ns[kept]
    p = packs.set_index("pack")
    rows = new_id[p["first_node"].to_numpy(np.int64)]
    out = out.reset_index(drop=True)
    out.loc[rows, "dur_ns"] = p["dur_ns"].to_numpy()
    out.loc[rows, "name"] = ("pack:" + p["signature"].astype(str)).to_numpy()
    out.loc[rows, "event"] = -1

    s = edges["src"].to_numpy(np.int64)
    d = edges["dst"].to_numpy(np.int64)
    ns, nd = node_map[s], node_map[d]
    fs = edges["from_start"].to_numpy(bool) & (~packed[s] | is_first[s])
    e = pd.DataFrame({"src": ns, "dst": nd, "kind": edges["kind"].to_numpy(), "from_start": fs})
    e = e[ns != nd].drop_duplicates(["src", "dst", "from_start"]).reset_index(drop=True)
    packs = packs.copy()
    packs["node"] = node_of_pack[packs["pack"].to_numpy(np.int64)]
    return PackGraph(
        Graph(typed(out, NODE_COLUMNS), typed(e, EDGE_COLUMNS), dict(graph.meta, packs=len(packs))),
        packs,
        node_map,
        pack_of,
        inner,
    )


def pack_durations(pg: PackGraph, kernel_dur_ns: np.ndarray) -> np.ndarray:
    """Per pack: sum of its members' durations (kernel-graph node ids index `kernel_dur_ns`) plus
    the fixed delays between them."""
    m = pg.pack_of >= 0
    total = np.zeros(len(pg.packs), np.int64)
    np.add.at(total, pg.pack_of[m], np.asarray(kernel_dur_ns, np.int64)[m])
    return total + pg.inner_delay_ns


def pack_graph_durations(pg: PackGraph, kernel_dur_ns: np.ndarray) -> np.ndarray:
    """Durations for every pack-graph node from per-kernel-graph-node durations."""
    kernel_dur_ns = np.asarray(kernel_dur_ns, np.int64)
    dur = np.zeros(len(pg.graph.nodes), np.int64)
    unpacked = pg.pack_of < 0
    dur[pg.node_map[unpacked]] = kernel_dur_ns[unpacked]
    dur[pg.packs["node"].to_numpy(np.int64)] = pack_durations(pg, kernel_dur_ns)[pg.packs["pack"].to_numpy(np.int64)]
    return dur
