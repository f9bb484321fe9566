# Helpers the rules share: every rule is generic over its stage folder's {hash}; SWEEP (the Snakefile)
# says which job planned that folder, hence its inputs, params and GPUs (emo/sweep.py).


def out(stage, name):
    """An output of `stage` in the folder its {hash} names (emo.plan: results/<stage>/<hash>/)."""
    return str(SWEEP.results / stage / "{hash}" / name)


def up(stage, upstream, name):
    """Input function: file `name` of the `upstream` folder that this `stage` folder is computed from."""
    return lambda w: SWEEP.upstream(stage, w.hash, upstream, name)


def params(stage):
    return lambda w: SWEEP.plan(stage, w.hash).params


def log_of(stage):
    return str(SWEEP.results / stage / "logs" / "{hash}.log")


def gpus(stage):
    """GPUs a job of this stage holds (resources: gpu): its workload's ranks on real GPUs, 1 on the virtual GPU."""
    return lambda w: sweep.gpus_needed(SWEEP.job(stage, w.hash).cfg)


def gpu_model(stage):
    """The GPU model it needs (resources: gpu_model, what the slurm and kubernetes executors ask for)."""
    return lambda w: SWEEP.job(stage, w.hash).cfg["gpu"]["name"]


# validate: offline methods (emo, static, the ablations) bring optimize's policy; online baselines tune while it runs
from emo.methods import ONLINE


def validate_inputs(w):
    job = SWEEP.job("validate", w.hash)
    return {} if job.cfg["optimizer"]["name"] in ONLINE else {"policy": job.plans["optimize"].out("policy.json")}


def read_files(stage):
    """Input function: the files outside results/ that `stage` reads (emo.plan.read_files: a recorded
    workload.path), declared so Snakemake sees them too; their content is in the stage's hash."""
    from emo.plan import read_files as files

    return lambda w: {key.replace(".", "_"): path for key, path in files(stage, SWEEP.job(stage, w.hash).cfg).items()}


def share_of_cores(wildcards):
    """threads of a stage that computes in parallel (optimize: numba threads): the cores over the
    sweep's jobs, so jobs that run at once do not each start a thread per core (which on a busy
    core spin-wait and slow every other job); one job alone gets every core. 1 when the executor
    has no core count (a cluster: --jobs)."""
    cores = workflow.resource_settings.cores
    return max(1, int(cores) // len(SWEEP.jobs)) if isinstance(cores, int) else 1
