"""One timing engine: the optimizer's Problem times a graph exactly as the graph's what-if does
(per-edge lags, not one delay per node), and its passes agree with the what-if's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from emo.graph import Graph
from emo.graph.graph import EDGE_COLUMNS, NODE_COLUMNS, typed
from emo.graph.whatif import compile_graph, whatif
from emo.optimize.problem import build_problem

US = 1_000


def _launch_bound_graph() -> Graph:
    """Host: launch L1 (0-5 µs), launch L2 (40-45 µs). GPU stream: K1 (10-30 µs), K2 (60-80 µs), and a
    kernel K0 before K1. K2 waits on its launch (60 µs = L2 + 20 µs) more than on K1 (30 µs): its
    launch edge binds with a 20 µs lag, its stream edge keeps the typical kernel-to-kernel gap."""
    kinds = ["kernel", "runtime", "kernel", "runtime", "kernel", "kernel"]
    starts = [0, 0, 10, 40, 60, 85]
    durs = [5, 5, 20, 5, 20, 5]
    nodes = typed(
        pd.DataFrame(
            {
                "kind": kinds,
                "rank": 0,
                "device": [0, -1, 0, -1, 0, 0],
                "stream": [7, -1, 7, -1, 7, 7],
                "thread": [-1, 1, -1, 1, -1, -1],
                "start_ns": np.array(starts) * US,
                "dur_ns": np.array(durs) * US,
                "name": ["K0", "L1", "K1", "L2", "K2", "K3"],
                "event": -1,
            }
        ),
        NODE_COLUMNS,
    )
    edges = [
        (1, 2, "launch", True),
        (3, 4, "launch", True),
        (0, 2, "stream", False),
        (2, 4, "stream", False),
        (4, 5, "stream", False),
        (1, 3, "host", False),
    ]
    e = typed(pd.DataFrame(edges, columns=["src", "dst", "kind", "from_start"]), EDGE_COLUMNS)
    return Graph(nodes, e)


def _problem(graph: Graph, c):
    lag = np.empty(len(graph.edges))
    lag[c.edge_id] = c.lag
    offset = np.empty(c.n)
    offset[c.order] = c.offset
    dev = np.where(graph.nodes["device"].to_numpy() >= 0, 0, -1)
    dur = graph.nodes["dur_ns"].to_numpy(np.float64)
    e = graph.edges
    return build_problem(
        e["src"],
        e["dst"],
        dev,
        dur,
        np.zeros_like(dur),
        [[10.0]],
        [1410],
        from_start=e["from_start"].to_numpy(bool),
        lag_ns=lag,
        offset_ns=offset,
    )


def test_a_launch_bound_kernel_follows_its_slowed_predecessor_the_same_way_in_both():
    g = _launch_bound_graph()
    c = compile_graph(g)
    p = _problem(g, c)
    slowed = g.nodes["dur_ns"].to_numpy().copy()
    slowed[2] = 70 * US  # K1 now ends at 80 µs, past K2's launch-bound start at 60 µs
    ref = whatif(c, slowed)
    start, _, end = p.forward(slowed[p.perm])
    mine = np.empty(p.n)
    mine[p.perm] = start
    np.testing.assert_allclose(mine, ref.start_ns)
    assert end == pytest.approx(ref.makespan_ns)
    # K2 follows K1 by the stream gap, not by the launch latency it had when the launch bound it
    assert ref.start_ns[4] < 80 * US + 20 * US


@pytest.mark.parametrize("seed", range(5))
def test_forward_and_latest_finish_equal_the_whatif_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    n = 60
    starts = np.sort(rng.integers(0, 500, n)) * US
    durs = rng.integers(1, 40, n) * US
    edges = sorted({(int(u), int(v)) for v in range(1, n) for u in rng.choice(v, size=min(v, 2), replace=False)})
    nodes = typed(
        pd.DataFrame(
            {
                "kind": "kernel",
                "rank": 0,
                "device": 0,
                "stream": 7,
                "thread": -1,
                "start_ns": starts,
                "dur_ns": durs,
                "name": [f"n{i}" for i in range(n)],
                "event": -1,
            }
        ),
        NODE_COLUMNS,
    )
    fs = rng.random(len(edges)) < 0.3
    e = typed(
        pd.DataFrame({"src": [a for a, _ in edges], "dst": [b for _, b in edges], "kind": "stream", "from_start": fs}),
        EDGE_COLUMNS,
    )
    g = Graph(nodes, e)
    c = compile_graph(g)
    p = _problem(g, c)
    new = durs * rng.uniform(0.5, 2.0, n)
    ref = whatif(c, new.astype(np.int64))
    start, finish, end = p.forward(new.astype(np.int64)[p.perm].astype(float))
    mine = np.empty(n)
    mine[p.perm] = start
    np.testing.assert_allclose(mine, ref.start_ns)
    latest = np.empty(n)
    latest[p.perm] = p.latest_finish(new.astype(np.int64)[p.perm].astype(float), end)
    np.testing.assert_allclose(latest - (mine + new.astype(np.int64)), ref.slack_ns)
    # the internal order is topological and sorted by baseline start
    assert np.all(np.diff(p.base_start) >= -1e-9) or np.all(p.src < p.dst)
    assert np.all(p.src < p.dst)
