# EMO's pipeline: calibrate -> trace -> graph -> pack -> profile -> fit -> optimize -> validate.
# Configuration is composed from conf/ with Hydra: `snakemake -c 2 --config 'overrides=["workload=pp"]'`
# or, more simply, `emo run workload=pp`. Every stage writes results/<stage>/<hash>/, the hash
# covering the configuration it depends on, its inputs and its code (emo/plan.py).
from emo.plan import compose, plan

EMO = compose(config.get("overrides", []))
P = plan(EMO)
config["resolved"] = EMO  # what the stages read (workflow/scripts/stage.py)


rule all:
    input:
        P["validate"].out("result.json"),  # offline methods pull trace -> ... -> optimize; online ones only validate


include: "workflow/rules/trace.smk"
include: "workflow/rules/graph.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/pack.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/optimize.smk"
include: "workflow/rules/validate.smk"
