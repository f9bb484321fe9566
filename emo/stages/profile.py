"""profile: the counters of the workload's pack signatures and its measured iterations at the
default clock and a few static clocks (emo.model.profiling, whose docstring says where each comes
from), into metrics.parquet and baseline.json. A recorded trace is not re-run: its counters and
baseline come from the sidecars beside it (counters/, metrics.parquet, emo-capture/), declared as
outside files so that rewriting one re-runs this stage."""

from __future__ import annotations

from pathlib import Path

from emo.stages import Stage


def sidecars(cfg: dict) -> dict[str, Path]:
    """The outside files the stage reads: a recorded trace's sidecars (emo.model.profiling.sidecar_paths)."""
    from emo.workloads import kind_of

    wl = cfg["workload"]
    if not kind_of(wl).recorded:
        return {}
    from emo.model.profiling import sidecar_paths

    return sidecar_paths(Path(wl["path"]))


STAGE = Stage(
    reads=("gpu", "workload", "trace", "model"),
    inputs={
        "packs": ("pack", "packs.parquet"),
        "events": ("trace", "events.parquet"),
        "measured": ("trace", "measured.json"),
        "graph_nodes": ("graph", "nodes.parquet"),
        "graph_edges": ("graph", "edges.parquet"),
    },
    outputs=("metrics.parquet", "baseline.json"),
    outside=sidecars,
    discovers=("emo.workloads",),  # the workload's kind runs the measured iterations
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    import json

    import pandas as pd

    from emo.device.backends import open_device
    from emo.graph import Graph
    from emo.io import write_json, write_parquet
    from emo.model.profiling import profile_workload
    from emo.sections import Config, typed
    from emo.workloads import kind_of

    metrics, baseline, summary = profile_workload(
        typed(Config, cfg),
        pd.read_parquet(inputs["packs"]),
        pd.read_parquet(inputs["events"]),
        Graph.load(inputs["graph_nodes"].parent).nodes,
        json.loads(inputs["measured"].read_text()),
        lambda: open_device(cfg["gpu"]),
        recorded=kind_of(cfg["workload"]).recorded,
    )
    write_parquet(out / "metrics.parquet", metrics)
    write_json(out / "baseline.json", baseline)
    return summary
