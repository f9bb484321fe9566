"""`emo run [-m] KEY=VALUE ...`: compose the configuration and run the Snakemake pipeline on it.

With -m (multirun), comma lists sweep: `emo run -m budget=0.02,0.05 workload.tp=2,4,8` runs every
combination one after the other (parallel Snakemake runs in one folder would lock each other), each a
child of one MLflow parent run; the content-hashed stage folders make jobs share what they can.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from pathlib import Path

from emo.plan import ROOT, compose


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline (Snakemake) on a Hydra-composed configuration")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=pp workload.pp=4 budget=0.05")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    p.add_argument("-c", "--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. trace)")
    p.set_defaults(func=main)


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The jobs of a run: one without -m; the cartesian product of the sweep values with it."""
    if not multirun:
        return [list(overrides)]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = []
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*choices)]


def main(args: argparse.Namespace) -> int:
    jobs = expand(args.overrides, args.multirun)
    cfgs = [compose(job) for job in jobs]  # every job's configuration is checked before any runs
    from emo import tracking

    failed = 0
    with tracking.sweep_run(cfgs[0]["tracking"], "sweep " + " ".join(args.overrides)) if args.multirun and not args.dry_run else contextlib.nullcontext() as parent:
        for job, cfg in zip(jobs, cfgs):
            print(f"emo: job {' '.join(job) or '(defaults)'}", file=sys.stderr)
            if args.dry_run:
                ok = snakemake(job, args.cores, dry_run=True, until=args.until)
            else:
                with tracking.job_run(cfg, " ".join(job) or "defaults", parent) as run_id:
                    ok = snakemake(job, args.cores, run_id=run_id, until=args.until)
            failed += not ok
    return 1 if failed else 0


def snakemake(overrides: list[str], cores: int, *, dry_run: bool = False, run_id: str | None = None,
              until: str | None = None) -> bool:
    """Run the Snakefile through the Snakemake API; True when it succeeded."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings,
                                          ResourceSettings)
    from emo.tracking import RUN_ID_ENV

    if run_id:
        os.environ[RUN_ID_ENV] = run_id
    try:
        with SnakemakeApi(OutputSettings(dryrun=dry_run, quiet=None)) as api:
            workflow = api.workflow(
                resource_settings=ResourceSettings(cores=cores, resources={"gpu": 1}),
                config_settings=ConfigSettings(config={"overrides": list(overrides)}),
                snakefile=ROOT / "Snakefile",
                workdir=Path.cwd(),
            )
            dag = workflow.dag(DAGSettings(until=frozenset([until]) if until else frozenset(), force_incomplete=True))
            dag.execute_workflow(executor="dryrun" if dry_run else "local")
        return True
    except Exception as e:  # Snakemake has already printed the failing job and its log
        print(f"emo: error: pipeline failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return False
    finally:
        os.environ.pop(RUN_ID_ENV, None)
