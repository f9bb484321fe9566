"""Pipeline stages: one module per Snakemake rule, each with `run(cfg, inputs, out) -> metrics`.

`run_stage` is what every workflow script calls: it builds the stage folder in a hidden temporary
folder beside it and moves the files in only when the stage succeeded (`config.json`, which says what
the folder's hash covers, last), then logs the metrics to MLflow. An interrupted run therefore never
leaves a stage folder that a later run would trust.
"""
from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from emo.io import write_json

log = logging.getLogger("emo")

# stage -> (config sections it reads, upstream stages). A stage is handed exactly these sections
# (run_in_place), so it cannot read a key its hash does not cover; its code is whatever
# emo.stages.<stage> imports (emo.plan.code_digest), and the files it reads are hashed by content (emo.plan.read_files).
STAGES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "trace": (("gpu", "workload", "trace"), ()),
    "graph": ((), ("trace",)),
    "calibrate": (("gpu", "model"), ()),
    "pack": (("packing",), ("trace", "graph")),
    "profile": (("gpu", "workload", "trace", "model"), ("trace", "pack")),
    "fit": (("gpu",), ("calibrate", "trace", "pack", "profile")),
    "optimize": (("gpu", "optimizer", "budget"), ("pack", "fit")),
    "validate": (("gpu", "workload", "optimizer", "budget", "validate"), ("optimize",)),
}


def run_in_place(stage: str, cfg: dict, inputs: dict, out: str | Path) -> dict:
    """`stage`'s computation alone, writing straight into `out` (no temporary folder, config.json,
    metrics or tracking): for tests and benchmarks that chain stages in-process. The stage is handed
    only the config sections its hash covers (STAGES), so it cannot depend on another."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seen = {k: cfg[k] for k in STAGES[stage][0]}
    return importlib.import_module(f"emo.stages.{stage}").run(seen, {k: Path(v) for k, v in inputs.items()}, out) or {}


def run_stage(stage: str, params: dict, inputs: dict[str, str], out_dir: str | Path, log_file: str | None = None) -> dict:
    """Run `stage` with params {"cfg": resolved config, "covers": what the hash covers, "hash": ...}."""
    out = Path(out_dir)
    _setup_logging(log_file)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        t0 = time.perf_counter()
        metrics = run_in_place(stage, params["cfg"], inputs, tmp)
        metrics[f"{stage}_wall_s"] = round(time.perf_counter() - t0, 3)
        write_json(tmp / "metrics.json", metrics)
        for item in sorted(tmp.iterdir()):
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)
        write_json(out / "config.json", {"stage": stage, "hash": params["hash"], "covers": params["covers"]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: %s", stage, metrics)
    from emo import tracking

    tracking.log_stage(params["cfg"], stage, params["hash"], metrics, [out / "config.json", out / "metrics.json"])
    return metrics


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)
