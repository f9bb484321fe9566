# The one adapter every rule runs: the rule's name is the stage (emo/stages/<rule>.py).
from pathlib import Path

from emo.stages import run_stage

run_stage(
    snakemake.rule,
    {"cfg": snakemake.config["resolved"], **snakemake.params.emo},
    dict(snakemake.input),
    Path(snakemake.output.config).parent,
    snakemake.log[0],
)
