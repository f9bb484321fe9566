"""How faithful is the pack graph? The what-if makespan of the pack graph against the kernel graph's
under the same per-kernel durations, for random per-pack clock assignments (stretch factors)."""

from __future__ import annotations

import numpy as np

from emo.graph import Graph
from emo.graph.whatif import compile_graph, whatif
from emo.pack.packgraph import PackGraph, pack_graph_durations


def makespan_gaps(graph: Graph, pg: PackGraph, trials: int = 20, max_stretch: float = 2.0, seed: int = 0) -> np.ndarray:
    """Relative gap (pack - kernel) / kernel of the what-if makespan, one per trial; trial 0 is the
    recorded durations. Each pack gets one random stretch in [1, max_stretch] (a clock between
    1/max_stretch of the default and the default) applied to all its member kernels."""
    rng = np.random.default_rng(seed)
    ck, cp = compile_graph(graph), compile_graph(pg.graph)
    dur = graph.nodes["dur_ns"].to_numpy(np.int64)
    packed = pg.pack_of >= 0
    gaps = np.empty(trials)
    for t in range(trials):
        f = np.ones(len(pg.packs)) if t == 0 else rng.uniform(1.0, max_stretch, len(pg.packs))
        kd = dur.copy()
        kd[packed] = np.round(dur[packed] * f[pg.pack_of[packed]]).astype(np.int64)
        mk = whatif(ck, kd, slack=False).makespan_ns
        mp = whatif(cp, pack_graph_durations(pg, kd), slack=False).makespan_ns
        gaps[t] = (mp - mk) / max(mk, 1)
    return gaps
