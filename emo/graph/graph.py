"""The execution graph: a node table and an edge table with integer node ids, saved as Parquet.

Nodes (`Graph.nodes`, index = node id 0..N-1):

| column   | dtype | meaning                                                                   |
|----------|-------|---------------------------------------------------------------------------|
| kind     | str   | NODE_KINDS: kernel, memcpy, memset, collective, coll_wait, rendezvous,    |
|          |       | runtime, sync, cpu                                                        |
| rank     | int32 | rank (-1 for a cross-rank rendezvous)                                     |
| device   | int32 | GPU index for GPU nodes, -1 for host nodes                                |
| stream   | int64 | CUDA stream for GPU nodes, else -1                                        |
| thread   | int64 | host thread for host nodes, else -1                                       |
| start_ns | int64 | recorded start                                                            |
| dur_ns   | int64 | recorded duration (the what-if pass may replace it)                       |
| name     | str   | kernel / call name; cpu nodes: "cpu"                                      |
| event    | int64 | row of the event table the node comes from (-1: synthetic)                |

Edges (`Graph.edges`): src, dst (int64 node ids), kind (EDGE_KINDS), from_start (bool: the
constraint is "dst starts after src STARTS", e.g. a kernel after the start of its launch call;
otherwise after src finishes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from emo.io import write_parquet

NODE_KINDS = ("kernel", "memcpy", "memset", "collective", "coll_wait", "rendezvous", "runtime", "sync", "cpu")
GPU_NODE_KINDS = ("kernel", "memcpy", "memset", "collective", "coll_wait")
EDGE_KINDS = ("program", "launch", "stream", "event", "sync", "collective")

NODE_COLUMNS = {
    "kind": "str",
    "rank": "int32",
    "device": "int32",
    "stream": "int64",
    "thread": "int64",
    "start_ns": "int64",
    "dur_ns": "int64",
    "name": "str",
    "event": "int64",
}
EDGE_COLUMNS = {"src": "int64", "dst": "int64", "kind": "str", "from_start": "bool"}


@dataclass
class Graph:
    nodes: pd.DataFrame
    edges: pd.DataFrame
    meta: dict = field(default_factory=dict)  # e.g. collectives matched, ranks

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        write_parquet(folder / "nodes.parquet", self.nodes)
        write_parquet(folder / "edges.parquet", self.edges)

    @classmethod
    def load(cls, folder: str | Path) -> Graph:
        folder = Path(folder)
        nodes = pd.read_parquet(folder / "nodes.parquet")
        edges = pd.read_parquet(folder / "edges.parquet")
        return cls(typed(nodes, NODE_COLUMNS), typed(edges, EDGE_COLUMNS))


def typed(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    out = pd.DataFrame({c: df[c].astype(t) for c, t in columns.items()})
    return out.reset_index(drop=True)
