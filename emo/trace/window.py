"""Restrict an event table to one annotation instance (e.g. one `ProfilerStep`), per rank."""

from __future__ import annotations

import numpy as np
import pandas as pd

from emo.errors import InputError


def annotation_window(events: pd.DataFrame, rank: int, name: str, instance: int) -> tuple[int, int]:
    """[start, end] ns of the instance-th host event whose name contains `name` on `rank`."""
    host = events[(events["rank"] == rank) & events["kind"].isin(["annotation", "cpu_op", "runtime"])]
    hits = host[host["name"].str.contains(name, regex=False)].sort_values("start_ns", kind="stable")
    if len(hits) <= instance:
        raise InputError(f"annotation {name!r} instance {instance} not found on rank {rank} ({len(hits)} instance(s))")
    row = hits.iloc[instance]
    return int(row["start_ns"]), int(row["start_ns"] + row["dur_ns"])


def clip_window(events: pd.DataFrame, name: str, instance: int = 0) -> pd.DataFrame:
    """Host events starting inside the window, and the GPU work those host calls launched."""
    keep = np.zeros(len(events), bool)
    for rank in np.unique(events["rank"].to_numpy()):
        lo, hi = annotation_window(events, int(rank), name, instance)
        r = (events["rank"] == rank).to_numpy()
        host = r & (events["device"].to_numpy() < 0)
        inside = host & (events["start_ns"].to_numpy() >= lo) & (events["start_ns"].to_numpy() <= hi)
        corr = set(events.loc[inside & (events["correlation"].to_numpy() >= 0), "correlation"].tolist())
        gpu = r & ~host & events["correlation"].isin(corr).to_numpy()
        keep |= inside | gpu
    return events[keep].reset_index(drop=True)
