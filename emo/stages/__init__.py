"""Pipeline stages: one module per Snakemake rule, each with `STAGE = Stage(...)` (what it reads and
writes) and `run(cfg, inputs, out) -> metrics`.

The declaration is the stage's contract, written once: the folder hash (emo.workflow.plan), the Snakemake
rules' inputs and outputs (workflow/rules/common.smk) and the in-process chaining (run_in_place) are
derived from it, and run_in_place holds the stage to it: the stage is handed its config sections
only, its inputs as links in a folder that holds nothing else, and reading an undeclared file in an
upstream folder or beside a declared outside file fails (an audit hook, emo.stages.guard).

`run_stage` is what every workflow script calls: it builds the stage folder in a hidden temporary
folder beside it and moves the files in only when the stage succeeded (`config.json`, which says what
the folder's hash covers, last); its `metrics.json` goes to MLflow when the Snakemake run ends
(emo.workflow.tracking.log_sweep). An interrupted run therefore never leaves a stage folder that a later run
would trust.

A failure is one line (`emo.errors`): the traceback goes to the stage log, the line to `emo run`
(through EMO_ERRORS) or to stderr; `emo run` marks the job's MLflow run FAILED (KILLED when a
signal stopped it) with the line as a tag.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from emo.io import write_json

log = logging.getLogger("emo")


@dataclass(frozen=True)
class Stage:
    """What a stage reads and writes.

    reads    the config sections it is handed (its hash covers them);
    inputs   name -> (upstream stage, file in its folder), or a function of the config sections
             giving that (validate: an online method brings no policy);
    outputs  the files it always writes into its folder (config.json and metrics.json come with
             every stage); a name ending in "/" is a folder;
    outside  a function of the config sections: name -> a path outside results/ it reads (a
             recorded trace and its sidecars), hashed by content (emo.workflow.plan.content_digest);
    code     paths under the repository its code reads (the microbenchmarks' sources), hashed
             with its code (emo.workflow.plan.code_digest);
    discovers  packages it loads modules of by name at run time (a workload's kind, a method): every
             module in them is hashed with its code, as if it imported each.
    """

    reads: tuple[str, ...] = ()
    inputs: Mapping[str, tuple[str, str]] | Callable[[dict], Mapping[str, tuple[str, str]]] = field(
        default_factory=dict
    )
    outputs: tuple[str, ...] = ()
    outside: Callable[[dict], Mapping[str, str | Path]] | None = None
    code: tuple[str, ...] = ()
    discovers: tuple[str, ...] = ()

    def seen(self, cfg: dict) -> dict:
        """The config sections this stage reads (all it is handed; all the functions below see)."""
        return {k: cfg[k] for k in self.reads}

    def inputs_for(self, cfg: dict) -> dict[str, tuple[str, str]]:
        return dict(self.inputs(self.seen(cfg)) if callable(self.inputs) else self.inputs)

    def outside_for(self, cfg: dict) -> dict[str, str]:
        return {k: str(v) for k, v in self.outside(self.seen(cfg)).items()} if self.outside else {}

    def named_outputs(self) -> dict[str, tuple[str, bool]]:
        """Each declared output by its stem: (file, whether it is a folder), for the Snakemake rule."""
        return {f.rstrip("/").split(".")[0]: (f.rstrip("/"), f.endswith("/")) for f in self.outputs}

    def upstream(self, cfg: dict) -> tuple[str, ...]:
        """The stages whose folders it reads, in the order its inputs name them."""
        return tuple(dict.fromkeys(up for up, _ in self.inputs_for(cfg).values()))


# the pipeline's stages in an order where each follows those it reads (emo.stages.<name>.STAGE)
STAGES: tuple[str, ...] = ("trace", "graph", "calibrate", "pack", "profile", "fit", "optimize", "validate")


@functools.cache
def declaration(stage: str) -> Stage:
    """emo.stages.<stage>.STAGE (a stage module imports its libraries inside run(): declarations are cheap)."""
    if stage not in STAGES:
        raise ValueError(f"{stage}: not a stage (one of {', '.join(STAGES)})")
    return importlib.import_module(f"emo.stages.{stage}").STAGE


def run_in_place(stage: str, cfg: dict, inputs: dict, out: str | Path) -> dict:
    """`stage`'s computation alone, writing straight into `out` (no temporary folder, config.json,
    metrics or tracking): what run_stage runs, and what tests and benchmarks chain in-process.

    The stage is handed only the config sections its hash covers, and its declared inputs as links
    in a folder of their own: a declared input left out of `inputs` is found beside a given one of
    the same upstream stage; an undeclared one is an error. While it runs, opening an undeclared
    file in an upstream folder or beside a declared outside file fails (emo.stages.guard)."""
    from emo.stages import guard

    decl = declaration(stage)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = decl.inputs_for(cfg)
    extra = sorted(set(inputs) - set(wanted))
    if extra:
        raise ValueError(
            f"{stage}: {', '.join(extra)}: not an input emo.stages.{stage}.STAGE declares "
            f"({', '.join(wanted) or 'none'})"
        )
    given = {k: Path(v).absolute() for k, v in inputs.items()}
    folders = {wanted[k][0]: p.parent for k, p in given.items()}  # each upstream stage's folder
    with tempfile.TemporaryDirectory(prefix=f"emo-{stage}-inputs-") as tmp:
        view = Path(tmp)
        handed = {}
        for name, (up, file) in wanted.items():
            target = given.get(name, folders[up] / file if up in folders else None)
            if target is None:
                continue
            link = view / up / file
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
            handed[name] = link
        try:
            with guard.only(stage, folders.values(), decl.outside_for(cfg).values(), out):
                return importlib.import_module(f"emo.stages.{stage}").run(decl.seen(cfg), handed, out) or {}
        except BaseException as e:  # its message names the upstream files, not their links
            _rename(e, {str(view / up): str(folder) for up, folder in folders.items()})
            if isinstance(e, FileNotFoundError) and e.filename and Path(e.filename).exists():
                raise guard.undeclared(stage, e.filename) from e  # there, but not declared: not in the view
            raise


def _rename(e: BaseException, paths: dict[str, str]) -> None:
    """Replace `paths` (old -> new) in the strings an exception shows."""

    def new(text):
        if not isinstance(text, str):
            return text
        for old, real in paths.items():
            text = text.replace(old, real)
        return text

    e.args = tuple(new(a) for a in e.args)
    if isinstance(e, OSError) and e.filename is not None:  # setting None would change what it shows
        e.filename = new(e.filename)
    if isinstance(e, OSError) and e.filename2 is not None:
        e.filename2 = new(e.filename2)


def run_chain(cfg: dict, root: str | Path, until: str) -> dict[str, Path]:
    """Every stage up to `until` in-process, each in `root/<stage>` with the inputs its declaration
    names from the folders before it: the pipeline without Snakemake, for tests and benchmarks."""
    root = Path(root)
    done: dict[str, Path] = {}
    for stage in STAGES[: STAGES.index(until) + 1]:
        wanted = declaration(stage).inputs_for(cfg)
        run_in_place(stage, cfg, {k: root / up / f for k, (up, f) in wanted.items()}, root / stage)
        done[stage] = root / stage
    return done


def run_stage(
    stage: str, params: dict, inputs: dict[str, str], out_dir: str | Path, log_file: str | None = None
) -> dict:
    """Run `stage` with params {"cfg": resolved config, "covers": what the hash covers, "hash": ...}."""
    out = Path(out_dir)
    _setup_logging(log_file)
    out.mkdir(parents=True, exist_ok=True)
    # named with EMO's mark (emo.workflow.locks.STAGE_TMP): a later run removes it if this one is killed
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


def run_script(
    stage: str, params: dict, inputs: dict[str, str], out_dir: str | Path, log_file: str | None = None
) -> int:
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
    errors.report(
        stage,
        errors.one_line(e, {str(tmp): str(out)}),
        log_file,
        killed=errors.is_interrupt(e),
        folder=str(out),
        status=errors.stage_status(e),
    )


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = []
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    if not log_file or os.environ.get("EMO_VERBOSE"):
        handlers.append(logging.StreamHandler())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)
