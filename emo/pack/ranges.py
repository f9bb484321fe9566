"""Name a pack's kernels the way a profiler can find them again: (rank, ordinal of the kernel launch
within its iteration), from the trace alone. The ordinal counts every kernel the rank launched in
that iteration in host launch order (correlation order), NCCL kernels included, copies not; the
iteration is the `ProfilerStep#i` annotation the launching call falls in (the whole trace is one
iteration when there are none)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from emo.device import KernelRange


def kernel_ordinals(events: pd.DataFrame) -> pd.DataFrame:
    """Per kernel row of the event table (index = event row): rank, iteration, ordinal."""
    ev = events.reset_index(drop=True)
    k = ev[ev["kind"] == "kernel"]
    calls = ev[(ev["kind"] == "runtime") & (ev["correlation"] >= 0)].drop_duplicates(["rank", "correlation"])
    j = k.reset_index(names="row").merge(
        calls[["rank", "correlation", "start_ns"]], on=["rank", "correlation"], how="left", suffixes=("", "_call")
    )
    j["t"] = j["start_ns_call"].fillna(j["start_ns"]).astype(np.int64)
    steps = ev[(ev["kind"] == "annotation") & ev["name"].str.startswith("ProfilerStep#")]
    j["iteration"] = 0
    for rank, idx in j.groupby("rank").groups.items():
        s = np.sort(steps.loc[steps["rank"] == rank, "start_ns"].to_numpy())
        if len(s):
            j.loc[idx, "iteration"] = np.maximum(np.searchsorted(s, j.loc[idx, "t"].to_numpy(), side="right") - 1, 0)
    key = np.where(j["correlation"].to_numpy() >= 0, j["correlation"].to_numpy(), j["t"].to_numpy())
    j = j.assign(key=key).sort_values(["rank", "iteration", "key", "t"], kind="stable")
    j["ordinal"] = j.groupby(["rank", "iteration"]).cumcount()
    return j.set_index("row")[["rank", "iteration", "ordinal"]].sort_index()


def pack_ranges(packs: pd.DataFrame, node_event: np.ndarray, ordinals: pd.DataFrame) -> list[KernelRange]:
    """The range of each row of `packs` (which needs a `members` column of kernel-graph node ids);
    node_event maps a node id to its event-table row."""
    out = []
    for rank, members in zip(packs["rank"].to_numpy(), packs["members"]):
        rows = node_event[np.asarray(members, np.int64)]
        if (rows < 0).any():
            raise ValueError("pack members without a trace event: cannot name them for the profiler")
        o = ordinals.loc[rows]
        if o["iteration"].nunique() != 1:
            raise ValueError(f"a pack of rank {rank} spans iterations {sorted(o['iteration'].unique())}")
        out.append(KernelRange(int(rank), tuple(int(x) for x in o["ordinal"])))
    return out
