"""Pipeline stages: one module per Snakemake rule, each with `run(cfg, inputs, out) -> metrics`.

`run_stage` is what every workflow script calls: it builds the stage folder in a hidden temporary
folder beside it and moves the files in only when the stage succeeded (`config.json`, which says what
the folder's hash covers, last); its `metrics.json` goes to MLflow when the Snakemake run ends
(emo.tracking.log_sweep). An interrupted run therefore never leaves a stage folder that a later run
would trust.
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


def run_in_place(stage: str, cfg: dict, inputs: dict, out: str | Path) -> dict:
    """`stage`'s computation alone, writing straight into `out` (no temporary folder, config.json,
    metrics or tracking): for tests and benchmarks that chain stages in-process."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return importlib.import_module(f"emo.stages.{stage}").run(cfg, {k: Path(v) for k, v in inputs.items()}, out) or {}


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
    return metrics


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)
