from emo.stages import run_stage

run_stage("optimize", snakemake.params.emo, dict(snakemake.input), snakemake.output.config.rsplit("/", 1)[0], snakemake.log[0])
