"""Random execution graphs for the packing tests: host threads launching kernels on a few streams,
CPU gaps, event edges between streams, stream synchronisations and cross-rank collectives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from emo.graph.graph import EDGE_COLUMNS, NODE_COLUMNS, Graph, typed
from emo.graph.whatif import compile_graph, whatif


def random_graph(seed: int, ranks: int = 2, launches: int = 300, streams: int = 3) -> Graph:
    rng = np.random.default_rng(seed)
    nodes: list[dict] = []
    edges: list[tuple[int, int, str, bool]] = []

    def node(kind, rank, dur, name, device=-1, stream=-1, thread=-1):
        nodes.append(
            dict(
                kind=kind,
                rank=rank,
                device=device,
                stream=stream,
                thread=thread,
                start_ns=0,
                dur_ns=int(dur),
                name=name,
                event=-1,
            )
        )
        return len(nodes) - 1

    names = [f"k{i}" for i in range(12)]
    colls = rng.integers(3, 8)
    coll_at = set(rng.choice(np.arange(20, launches - 5), colls, replace=False).tolist())
    rendezvous: dict[int, int] = {}
    for r in range(ranks):
        last_host = -1
        last_on = {s: -1 for s in range(streams + 1)}
        cur = 0
        ci = 0
        for i in range(launches):
            if rng.random() < 0.5:  # CPU work between calls
                c = node("cpu", r, rng.integers(1_000, 80_000 if rng.random() < 0.9 else 3_000_000), "cpu", thread=1)
                if last_host >= 0:
                    edges.append((last_host, c, "program", False))
                last_host = c
            call = node("runtime", r, rng.integers(3_000, 7_000), "cudaLaunchKernel", thread=1)
            if last_host >= 0:
                edges.append((last_host, call, "program", False))
            last_host = call
            if i in coll_at:  # a collective on the comm stream, waiting for the compute stream
                s = streams
                w = node("coll_wait", r, 0, "ncclAllReduce", device=0, stream=100)
                x = node(
                    "collective",
                    r,
                    rng.integers(50_000, 2_000_000) if r == 0 else 0,
                    "ncclAllReduce",
                    device=0,
                    stream=100,
                )
                rv = rendezvous.setdefault(ci, node("rendezvous", -1, 0, "pg0"))
                ci += 1
                edges += [(call, w, "launch", True), (w, rv, "collective", False), (rv, x, "collective", False)]
                if last_on[cur] >= 0:
                    edges.append((last_on[cur], w, "event", False))
                if last_on[s] >= 0:
                    edges.append((last_on[s], w, "stream", False))
                last_on[s] = x
                continue
            if rng.random() < 0.08:
                cur = int(rng.integers(0, streams))
            dur = np.exp(rng.uniform(np.log(3_000), np.log(2_500_000)))
            k = node("kernel", r, dur, names[int(rng.integers(0, len(names)))], device=0, stream=7 + cur)
            edges.append((call, k, "launch", True))
            if last_on[cur] >= 0:
                edges.append((last_on[cur], k, "stream", False))
            if rng.random() < 0.1:  # event record on another stream -> this kernel waits
                other = int(rng.integers(0, streams))
                if other != cur and last_on[other] >= 0:
                    edges.append((last_on[other], k, "event", False))
            last_on[cur] = k
            if rng.random() < 0.03:  # stream synchronize: the host blocks until k is done
                sy = node("sync", r, rng.integers(1_000, 3_000), "cudaStreamSynchronize", thread=1)
                edges += [(k, sy, "sync", False), (last_host, sy, "program", False)]
                last_host = sy
    g = Graph(
        typed(pd.DataFrame(nodes), NODE_COLUMNS), typed(pd.DataFrame(edges, columns=list(EDGE_COLUMNS)), EDGE_COLUMNS)
    )
    # record the timeline the graph implies, with a 1 us launch latency before every GPU op
    c = compile_graph(g)
    lat = np.where(g.nodes["kind"].isin(["kernel", "coll_wait"]).to_numpy(), 1_000, 0)
    res = whatif(dataclasses.replace(c, delay=lat[c.order]), slack=False)
    g.nodes["start_ns"] = res.start_ns
    return g
