"""Where each iteration starts in the execution graph: a frequency policy's t = 0 is the host's
`ProfilerStep#i` mark on each rank (where torch.profiler's step() and a runtime applier see it), so
the predictor needs that instant in what-if time. It is anchored to the host node whose recorded
interval holds it (the last host node of the rank starting at or before it) plus the offset into
that node; host nodes have fixed durations, so the anchor moves with the node."""

from __future__ import annotations

import numpy as np
import pandas as pd

ANCHOR_COLUMNS = {"rank": "int32", "iteration": "int64", "node": "int64", "offset_ns": "int64"}


def iteration_anchors(events: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, iteration): the anchoring node (of `nodes`) and the offset into it."""
    steps = events[(events["kind"] == "annotation") & events["name"].str.startswith("ProfilerStep#")]
    host = nodes[(nodes["device"] < 0) & (nodes["rank"] >= 0)]
    rows = []
    for rank, s in steps.groupby("rank"):
        h = host[host["rank"] == rank].sort_values("start_ns", kind="stable")
        if h.empty:
            continue
        t = np.sort(s["start_ns"].to_numpy(np.int64))
        hs = h["start_ns"].to_numpy(np.int64)
        i = np.maximum(np.searchsorted(hs, t, side="right") - 1, 0)
        node = h.index.to_numpy()[i]
        for k, (n, off) in enumerate(zip(node, t - hs[i])):
            rows.append((int(rank), k, int(n), int(off)))
    return pd.DataFrame(rows, columns=list(ANCHOR_COLUMNS)).astype(ANCHOR_COLUMNS)
