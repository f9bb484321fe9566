# The sweep's summary: the compare table, ES/PL per job and the plots (emo.compare.write_summary).
import logging
from pathlib import Path

from emo.compare import write_summary

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, force=True)
cfgs = snakemake.config["resolved"]["validate"]
folder = Path(snakemake.input[0]).parents[1]
write_summary([(name, cfgs[h], str(folder / h)) for name, h in snakemake.params.jobs], Path(snakemake.output.index).parent)
