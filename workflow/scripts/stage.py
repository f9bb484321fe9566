# The one adapter every rule runs: the rule's name is the stage (emo/stages/<rule>.py), the {hash}
# wildcard its folder; a GPU-touching rule runs on the GPU(s) it holds (emo.workflow.sweep.gpu_for_stage), and
# numba uses the threads Snakemake gave the rule; the stage stops when the run that started it dies.
import os
import signal
import sys
from pathlib import Path

# Ctrl-C reaches the stage with the whole terminal: before run_script handles it, end quietly (no
# KeyboardInterrupt traceback from an import it cut short); 130, as for Ctrl-C
signal.signal(signal.SIGINT, lambda *_: sys.exit(128 + signal.SIGINT))
from emo.workflow.locks import stop_with_parent

stop_with_parent()
os.environ["NUMBA_NUM_THREADS"] = str(snakemake.threads)  # the rule's threads, before numba is imported
from emo.stages import run_script
from emo.workflow.sweep import gpu_for_stage

cfg = snakemake.config["resolved"][snakemake.rule][snakemake.wildcards.hash]
out = Path(snakemake.output.config).parent
with gpu_for_stage(cfg, int(snakemake.resources.get("gpu", 0)), out.parents[1]):
    status = run_script(
        snakemake.rule, {"cfg": cfg, **snakemake.params.emo}, dict(snakemake.input), out, snakemake.log[0]
    )
sys.exit(status)
