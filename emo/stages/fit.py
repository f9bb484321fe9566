"""fit: the workload's model table (emo.model.levels: the microbenchmark mix per pack signature and
clock, with time and energy levels matched to the measured iterations) and its check against them."""

from __future__ import annotations

from pathlib import Path

from emo.stages import Stage

STAGE = Stage(
    reads=("gpu",),
    inputs={
        "bench": ("calibrate", "bench.parquet"),
        "metrics": ("profile", "metrics.parquet"),
        "baseline": ("profile", "baseline.json"),
        "packs": ("pack", "packs.parquet"),
        "pack_nodes": ("pack", "nodes.parquet"),
        "pack_edges": ("pack", "edges.parquet"),
        "iterations": ("pack", "iterations.parquet"),
    },
    outputs=("model.parquet", "check.json"),
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    import json

    import pandas as pd

    from emo.graph import Graph
    from emo.io import write_json, write_parquet
    from emo.model.levels import fit_workload
    from emo.sections import GpuConfig, typed

    model, check, metrics = fit_workload(
        typed(GpuConfig, cfg["gpu"]),
        pd.read_parquet(inputs["bench"]),
        pd.read_parquet(inputs["metrics"]),
        Graph.load(inputs["packs"].parent),
        pd.read_parquet(inputs["packs"]),
        pd.read_parquet(inputs["iterations"]),
        json.loads(inputs["baseline"].read_text()),
    )
    write_parquet(out / "model.parquet", model)
    write_json(out / "check.json", check)
    return metrics
