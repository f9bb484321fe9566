# The sweep's summary: the compare table, ES/PL per job and the plots (emo.cli.compare.write_summary).
# A failure is one line to `emo run` (as a stage's is), the traceback in the rule's log; like a stage,
# it stops when the run that started it dies.
import logging
import sys
from pathlib import Path

from emo import errors
from emo.workflow.locks import stop_with_parent

stop_with_parent()
from emo.cli.compare import write_summary

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, force=True)
cfgs = snakemake.config["resolved"]["validate"]
folder = Path(snakemake.input[0]).parents[1]
try:
    write_summary(
        [(name, cfgs[h], str(folder / h)) for name, h in snakemake.params.jobs], Path(snakemake.output.index).parent
    )
except Exception as e:
    logging.getLogger("emo").error("summary failed", exc_info=e)
    errors.report("summary", errors.one_line(e), snakemake.log[0])
    sys.exit(1)
