"""The runs a comparison reads and the stage folders behind them: the newest run of each seed, the
folder of a stage (and of the stages it was computed from), and the static clocks' measured curve.
Shared by `emo compare`'s table (emo.cli.compare) and its figures (emo.report.plots), which import it and not
each other."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def latest(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (gpu, workload, method, budget, seed): the newest (runs come newest first)."""
    if "seed" not in runs:
        runs = runs.assign(seed=0)
    return runs.drop_duplicates(["gpu", "workload", "method", "budget", "seed"], keep="first").reset_index(drop=True)


def stage_dir(results: Path, stage: str, stage_hash: str) -> Path:
    return results / stage / stage_hash


def upstream(results: Path, stage: str, stage_hash: str, want: str) -> Path | None:
    """The folder of stage `want` that the given stage folder was computed from (following the
    `covers.inputs` hashes of each folder's config.json), or None when it is not in the chain."""
    if stage == want:
        return stage_dir(results, stage, stage_hash)
    cfg = stage_dir(results, stage, stage_hash) / "config.json"
    if not cfg.exists():
        return None
    for up, h in json.loads(cfg.read_text())["covers"]["inputs"].items():
        found = upstream(results, up, h, want)
        if found is not None:
            return found
    return None


def static_curve(results: Path, validate_hashes: list[str]) -> pd.DataFrame | None:
    """The static clocks' measured curve for these jobs' GPU x workload: validate measures it for
    optimizer=static; when the sweep had none, any static validate folder of the same trace (and so
    the same GPU and workload) in the results folder serves."""
    traces = {upstream(results, "validate", h, "trace") for h in validate_hashes if h} - {None}
    candidates = [stage_dir(results, "validate", h) for h in validate_hashes if h]
    candidates += sorted(p.parent for p in results.glob("validate/*/pareto.parquet"))
    for vdir in candidates:
        if (vdir / "pareto.parquet").exists() and upstream(results, "validate", vdir.name, "trace") in traces:
            return pd.read_parquet(vdir / "pareto.parquet").sort_values("sm_mhz")
    return None


def read_result(path: str | Path) -> dict:
    """Validate's result.json; a file that is not one (cut short, edited) is one line naming it."""
    try:
        res = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: not a complete result ({e.msg} at line {e.lineno}); "
            f"delete {Path(path).parent} to measure it again"
        ) from None
    if not isinstance(res, dict) or not ("metrics" in res or "skipped" in res):
        raise ValueError(f"{path}: not a validate result (no metrics); delete {Path(path).parent} to measure it again")
    return res
