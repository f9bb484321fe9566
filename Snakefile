# EMO's pipeline: calibrate -> trace -> graph -> pack -> profile -> fit -> optimize -> validate.
# Configuration is composed from conf/ with Hydra: `snakemake -c 2 --config 'overrides=["workload=pp"]'`
# or, more simply, `emo run workload=pp`. A sweep (`emo run -m ...`) passes every job's overrides in
# a config file, `{"jobs": [[...], [...]]}` (`--configfile`; `--config 'jobs=...'` works too), and runs
# as this one DAG. Every stage writes results/<stage>/<hash>/,
# the hash covering the configuration it depends on, its inputs and its code (emo/workflow/plan.py); the rules
# are generic over that hash, and SWEEP says which job planned each folder (emo/workflow/sweep.py).
from snakemake.utils import min_version

from emo.workflow import sweep

min_version("8.20")

SWEEP = sweep.from_snakemake_config(config)
# what each stage reads (workflow/scripts/stage.py): the configuration of the job that planned the folder
config["resolved"] = {s: {h: j.cfg for h, j in by_hash.items()} for s, by_hash in SWEEP.by_stage.items()}


wildcard_constraints:
    hash="[0-9a-f]+",


include: "workflow/rules/common.smk"
include: "workflow/rules/summary.smk"


report: "workflow/report/workflow.rst"


rule all:
    input:
        # every job's result (offline methods pull trace -> ... -> optimize; online ones only validate)
        # and the sweep's summary (the compare table and plots, what `snakemake --report` shows)
        [job.result for job in SWEEP.jobs],
        rules.summary.output.index,


# plain `snakemake`: its main process is MLflow's one writer when the run ends (`emo run` runs
# without these hooks and does the same itself, also when nothing had to run)
onsuccess:
    sweep.finish(SWEEP, config.get("sweep"))


onerror:  # no job shows a result: which failed is not known here, and an earlier run's result is not this run's
    sweep.finish(SWEEP, config.get("sweep"), error="pipeline failed (see Snakemake's log)")


include: "workflow/rules/trace.smk"
include: "workflow/rules/graph.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/pack.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/optimize.smk"
include: "workflow/rules/validate.smk"
