"""fit: per pack signature x calibrated clock, predicted time and energy (emo.model: NNLS mix of the
microbenchmarks, anchored at each signature's measured default-clock time), with the energy level
calibrated against a measured whole iteration at the default clock, then the default-clock
prediction of the whole workload through the pack-graph what-if (emo.model.predict) as a check."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from emo.device import COUNTERS
from emo.io import write_json, write_parquet
from emo.model import calibrate_energy_level, fit_signatures
from emo.model.predict import load_pack_tables, predict


def fit_model(bench: pd.DataFrame, metrics: pd.DataFrame, packs: pd.DataFrame, baseline: dict,
              iterations: int, devices: int, default_mhz: int) -> tuple[pd.DataFrame, float]:
    """The model table (emo.model.MODEL_COLUMNS) with its energy level, and the level."""
    time_default = packs.groupby("signature")["dur_ns"].median() * 1e-9
    model = fit_signatures(bench, metrics.set_index("signature")[list(COUNTERS)], time_default,
                           default_mhz=default_mhz)
    occurrences = packs.groupby("signature")["dur_ns"].sum() / (time_default * 1e9) / iterations
    return calibrate_energy_level(model, occurrences, float(baseline["iteration_energy_j"]),
                                  float(baseline["iteration_time_s"]), devices=devices)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    bench = pd.read_parquet(inputs["bench"])
    metrics = pd.read_parquet(inputs["metrics"])
    packs = pd.read_parquet(inputs["packs"])
    baseline = json.loads(Path(inputs["baseline"]).read_text())
    anchors = pd.read_parquet(inputs["iterations"])
    iterations = int(anchors.groupby("rank").size().max()) if len(anchors) else 1
    devices = int(packs[["rank", "device"]].drop_duplicates().shape[0])
    model, level = fit_model(bench, metrics, packs, baseline, iterations, devices, int(cfg["gpu"]["default_mhz"]))
    write_parquet(out / "model.parquet", model)
    pred = predict(load_pack_tables(inputs["packs"].parent, out))
    check = {"predicted_iteration_s": pred.time_s, "predicted_energy_j": pred.energy_j,
             "measured_iteration_s": baseline["iteration_time_s"], "measured_energy_j": baseline["iteration_energy_j"],
             "time_error_pct": 100 * (pred.time_s / baseline["iteration_time_s"] - 1),
             "energy_error_pct": 100 * (pred.energy_j / baseline["iteration_energy_j"] - 1)}
    write_json(out / "check.json", check)
    return {"signatures": int(model["signature"].nunique()), "clocks": int(model["sm_mhz"].nunique()),
            "energy_level": level, "fit_residual_max": float(model["fit_residual"].max()),
            "default_time_error_pct": check["time_error_pct"], "default_energy_error_pct": check["energy_error_pct"]}
