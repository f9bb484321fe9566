"""Pipeline stages: one module per Snakemake rule, each with `run(cfg, inputs, out) -> metrics`.

`run_stage` is what every workflow script calls: it builds the stage folder in a hidden temporary
folder beside it and moves the files in only when the stage succeeded (`config.json`, which says what
the folder's hash covers, last); its `metrics.json` goes to MLflow when the Snakemake run ends
(emo.tracking.log_sweep). An interrupted run therefore never leaves a stage folder that a later run
would trust.

A failure is one line (`emo.errors`): the traceback goes to the stage log, the line to `emo run`
(through EMO_ERRORS) or to stderr; `emo run` marks the job's MLflow run FAILED (KILLED when a
signal stopped it) with the line as a tag.
"""
from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
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
    "optimize": (("gpu", "optimizer", "budget"), ("pack", "fit", "calibrate")),  # calibrate: the clock latency
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
    # named with EMO's mark (emo.locks.STAGE_TMP): a later run removes it if this one is killed
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.emo-stage-", suffix=".tmp", dir=out.parent))
    log.info("%s %s: started", stage, params["hash"])
    try:
        t0 = time.perf_counter()
        metrics = run_in_place(stage, params["cfg"], inputs, tmp)
        metrics[f"{stage}_wall_s"] = round(time.perf_counter() - t0, 3)
        write_json(tmp / "metrics.json", metrics)
        # everything is written before anything moves (a full disk fails here, in the hidden folder);
        # config.json, which a later run trusts the folder by, moves in last
        write_json(tmp / "config.json", {"stage": stage, "hash": params["hash"], "covers": params["covers"]})
        for item in sorted(tmp.iterdir(), key=lambda p: (p.name == "config.json", p.name)):
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)
    except BaseException as e:
        _failed(stage, params, e, tmp, out, log_file)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: %s", stage, metrics)
    print(f"emo: {stage} done in {metrics[f'{stage}_wall_s']:.1f} s: {out}", file=sys.stderr)
    return metrics


def run_script(stage: str, params: dict, inputs: dict[str, str], out_dir: str | Path, log_file: str | None = None) -> int:
    """What the workflow script runs: `run_stage` with SIGTERM/SIGHUP stopping it as Ctrl-C does;
    the exit status (0, 1, or 128 + the signal), the failure already reported in one line."""
    from emo import errors

    try:
        with errors.signals_raise():
            run_stage(stage, params, inputs, out_dir, log_file)
        return 0
    except KeyboardInterrupt as e:
        return errors.exit_status(e)
    except Exception:
        return 1


def _failed(stage: str, params: dict, e: BaseException, tmp: Path, out: Path, log_file: str | None) -> None:
    """The error path: traceback to the log, the one line to whoever shows it (emo run records it in
    MLflow: one writer)."""
    from emo import errors

    log.error("%s %s failed", stage, params["hash"], exc_info=e)
    errors.report(stage, errors.one_line(e, {str(tmp): str(out)}), log_file, killed=errors.is_interrupt(e),
                  folder=str(out))


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = []
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    if not log_file or os.environ.get("EMO_VERBOSE"):
        handlers.append(logging.StreamHandler())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)
