"""Format dispatch and the checks every trace must pass before a graph is built from it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from emo.trace.kineto import read_kineto
from emo.trace.nsys import SQLITE_MAGIC, read_nsys

TRACE_SUFFIXES = (".json", ".json.gz")
# Kineto rounds GPU timestamps to whole microseconds; allow that much overlap on one stream.
STREAM_OVERLAP_TOLERANCE_NS = 1_000


def read_trace(path: str | Path) -> pd.DataFrame:
    """Read a trace file or a folder of per-rank Kineto files into the normalised event table."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
        if not files:
            raise ValueError(f"{path}: folder holds no Kineto trace files (*.json, *.json.gz)")
        parts = [read_kineto(f, rank=i) for i, f in enumerate(files)]
        ranks = [int(p["rank"].iloc[0]) for p in parts if len(p)]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{path}: several files claim the same rank ({sorted(ranks)})")
        events = pd.concat(parts, ignore_index=True)
        events = events.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    else:
        with path.open("rb") as f:
            head = f.read(16)
        events = read_nsys(path) if head == SQLITE_MAGIC else read_kineto(path)
    validate_events(events, path)
    return events


def validate_events(events: pd.DataFrame, path) -> None:
    """Refuse tables a graph cannot be built from: no GPU work, or GPU work out of order."""
    if events.empty:
        raise ValueError(f"{path}: no trace events")
    kind = events["kind"].to_numpy()
    gpu = np.isin(kind, ("kernel", "memcpy", "memset"))
    if not gpu.any():
        raise ValueError(f"{path}: no GPU activity (no kernel, memcpy or memset events): nothing to analyse")
    ops = events.loc[gpu, ["rank", "device", "stream", "start_ns", "dur_ns", "name"]]
    ops = ops.sort_values(["rank", "device", "stream", "start_ns"], kind="stable")
    same = (ops[["rank", "device", "stream"]].diff().abs().sum(axis=1) == 0).to_numpy()
    end = (ops["start_ns"] + ops["dur_ns"]).to_numpy()
    overlap = same[1:] & (ops["start_ns"].to_numpy()[1:] < end[:-1] - STREAM_OVERLAP_TOLERANCE_NS)
    if overlap.any():
        i = int(np.flatnonzero(overlap)[0]) + 1
        row = ops.iloc[i]
        raise ValueError(
            f"{path}: events out of order: {row['name'][:60]!r} starts before the previous op on "
            f"rank {row['rank']} stream {row['stream']} ends")
    # A GPU op cannot start before the host call that launched it.
    launch = events.loc[(events["kind"] == "runtime") & (events["correlation"] >= 0),
                        ["rank", "correlation", "start_ns"]].drop_duplicates(["rank", "correlation"])
    gops = events.loc[gpu & (events["correlation"].to_numpy() >= 0), ["rank", "correlation", "start_ns", "name"]]
    j = gops.merge(launch, on=["rank", "correlation"], suffixes=("", "_launch"))
    early = j["start_ns"] < j["start_ns_launch"] - STREAM_OVERLAP_TOLERANCE_NS
    if early.any():
        row = j[early].iloc[0]
        raise ValueError(f"{path}: events out of order: {row['name'][:60]!r} starts before the call "
                         f"that launched it (correlation {row['correlation']})")
