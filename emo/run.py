"""`emo run [-m] KEY=VALUE ...`: compose the configuration and run the Snakemake pipeline on it.

With -m (multirun), comma lists sweep: `emo run -m budget=0.02,0.05 workload.tp=2,4,8` puts every
combination's targets into one Snakemake run (emo.sweep), so independent jobs run at once (`-j N`) and
stage folders the jobs share run once; MLflow gets one parent run and a child per job when it ends.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from emo.plan import ROOT


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline (Snakemake) on a Hydra-composed configuration")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. workload=pp workload.pp=4 budget=0.05")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    p.add_argument("-c", "--cores", "-j", "--jobs", dest="cores", type=int, default=os.cpu_count() or 1,
                   help="jobs at once (cores; on the virtual GPU one job per core)")
    p.add_argument("-n", "--dry-run", action="store_true", help="show what would run")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. trace)")
    p.add_argument("--report", metavar="FILE", help="then write Snakemake's HTML report of the run (table, plots)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from emo import sweep

    jobs = sweep.expand(args.overrides, args.multirun)
    sw = sweep.build(jobs)  # every job's configuration is checked before any runs
    name = "sweep " + " ".join(args.overrides) if args.multirun else None
    if len(jobs) > 1:
        print(f"emo: {len(jobs)} jobs in one Snakemake run", file=sys.stderr)
    ok = snakemake(jobs, args.cores, dry_run=args.dry_run, until=args.until,
                   gpus=sweep.gpus_available(sw.jobs[0].cfg, args.cores))
    if ok and args.report and not args.dry_run:
        ok = snakemake(jobs, args.cores, report=args.report)
    if not args.dry_run:
        sweep.finish(sw, name, args.overrides)  # MLflow and the result lines, also when nothing had to run
    return 0 if ok else 1


def snakemake(jobs: list[list[str]], cores: int, *, dry_run: bool = False, until: str | None = None,
              gpus: int = 1, report: str | None = None) -> bool:
    """Run the Snakefile on every job's targets at once (one DAG) through the Snakemake API; True when
    it succeeded. `gpus`: the `gpu` resource the GPU-touching rules share."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings,
                                          ResourceSettings)
    try:
        with SnakemakeApi(OutputSettings(dryrun=dry_run, quiet=None)) as api:
            workflow = api.workflow(
                resource_settings=ResourceSettings(cores=cores, resources={"gpu": gpus}),
                config_settings=ConfigSettings(config={"jobs": [list(j) for j in jobs]}),
                snakefile=ROOT / "Snakefile",
                workdir=Path.cwd(),
            )
            dag = workflow.dag(DAGSettings(until=frozenset([until]) if until else frozenset(), force_incomplete=True))
            if report:
                from snakemake.report.html_reporter import ReportSettings

                dag.create_report(reporter="html", report_settings=ReportSettings(path=Path(report)))
                print(f"emo: report {report}", file=sys.stderr)
                return True
            # no hooks: the Snakefile's onsuccess/onerror log for plain `snakemake`; emo run logs itself
            dag.execute_workflow(executor="dryrun" if dry_run else "local",
                                 execution_settings=ExecutionSettings(no_hooks=True))
        return True
    except Exception as e:  # Snakemake has already printed the failing job and its log
        print(f"emo: error: pipeline failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return False
