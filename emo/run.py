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
    p.add_argument("-c", "--cores", "-j", "--jobs", dest="cores", type=int, default=None,
                   help="jobs at once (default: every core; with --profile, the profile's jobs)")
    p.add_argument("--profile", metavar="NAME", help="a Snakemake workflow profile: profiles/NAME (default, slurm, "
                                                     "kubernetes, cluster-generic) or a folder; e.g. a cluster's executor")
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
    cores = args.cores if args.cores or args.profile else os.cpu_count() or 1
    gpus = None if args.profile else sweep.gpus_available(sw.jobs[0].cfg, cores)  # a scheduler places GPUs itself
    ok = snakemake(jobs, cores, dry_run=args.dry_run, until=args.until, gpus=gpus, profile=args.profile)
    if ok and args.report and not args.dry_run:
        ok = snakemake(jobs, cores, report=args.report, gpus=gpus, profile=args.profile)
    if not args.dry_run:
        sweep.finish(sw, name, args.overrides)  # MLflow and the result lines, also when nothing had to run
    return 0 if ok else 1


PROFILES = ROOT / "profiles"


def snakemake(jobs: list[list[str]], cores: int | None, *, dry_run: bool = False, until: str | None = None,
              gpus: int | None = 1, report: str | None = None, profile: str | None = None) -> bool:
    """Run the Snakefile on every job's targets at once (one DAG), as the `snakemake` command line
    would (so a workflow profile, its executor plugin and its settings apply unchanged); True when it
    succeeded. `gpus`: the `gpu` resource the GPU-touching rules share on this machine (None: the
    executor's scheduler decides); `profile`: a folder of profiles/ or a path."""
    import json

    from snakemake.cli import args_to_api, parse_args

    argv = ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(Path.cwd()),
            "--config", f"jobs={json.dumps([list(j) for j in jobs])}",
            # no hooks: the Snakefile's onsuccess/onerror log for plain `snakemake`; emo run logs itself
            "--no-hooks", "--rerun-incomplete"]
    if profile:
        path = PROFILES / profile if (PROFILES / profile).is_dir() else Path(profile)
        if not (path / "config.yaml").is_file():
            names = ", ".join(sorted(p.name for p in PROFILES.iterdir() if p.is_dir()))
            raise ValueError(f"--profile {profile}: no such workflow profile (profiles/: {names})")
        argv += ["--workflow-profile", str(path)]
    if cores is not None:
        argv += ["--jobs" if profile else "--cores", str(cores)]
    if gpus is not None:
        argv += ["--resources", f"gpu={gpus}"]
    if dry_run:
        argv += ["--dry-run"]
    if until:
        argv += ["--until", until]
    if report:
        argv += ["--report", str(report)]
    parser, args = parse_args(argv)
    ok = bool(args_to_api(args, parser))
    if not ok:
        print("emo: error: pipeline failed (Snakemake printed the failing job and its log above)", file=sys.stderr)
    elif report:
        print(f"emo: report {report}", file=sys.stderr)
    return ok
