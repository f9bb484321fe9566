# The one adapter every rule runs: the rule's name is the stage (emo/stages/<rule>.py).
import sys
from pathlib import Path

from emo.stages import run_script

sys.exit(run_script(
    snakemake.rule,
    {"cfg": snakemake.config["resolved"], **snakemake.params.emo},
    dict(snakemake.input),
    Path(snakemake.output.config).parent,
    snakemake.log[0],
))
