# Helpers the rules share: every rule is generic over its stage folder's {hash}; SWEEP (the Snakefile)
# says which job planned that folder, hence its inputs, params and GPUs (emo/workflow/sweep.py).


def out(stage, name):
    """An output of `stage` in the folder its {hash} names (emo.workflow.plan: results/<stage>/<hash>/)."""
    return str(SWEEP.results / stage / "{hash}" / name)


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


# Each rule's inputs and outputs come from its stage's declaration (emo/stages/<stage>.py: STAGE),
# as its folder's hash and the in-process chaining do: a stage's contract is written once.
from emo.stages import declaration


def stage_inputs(stage):
    """Input function: the upstream files `stage` declares (Stage.inputs), named as the stage reads
    them, in the folders the job that planned this {hash} computed them in."""

    def inputs(w):
        job = SWEEP.job(stage, w.hash)
        return {name: job.plans[up].out(file) for name, (up, file) in declaration(stage).inputs_for(job.cfg).items()}

    return inputs


def outside_files(stage):
    """Input function: the files outside results/ `stage` declares (Stage.outside: a recorded trace,
    its sidecars), so Snakemake sees them too; their content is in the stage's hash."""
    return lambda w: list(declaration(stage).outside_for(SWEEP.job(stage, w.hash).cfg).values())


def stage_outputs(stage):
    """The files `stage` declares it writes (Stage.outputs, a folder as directory()), named by their
    stem, and config.json, written last, which a later run trusts the folder by."""
    files = {
        name: directory(out(stage, f)) if folder else out(stage, f)
        for name, (f, folder) in declaration(stage).named_outputs().items()
    }
    return {**files, "config": out(stage, "config.json")}


def share_of_cores(wildcards):
    """threads of a stage that computes in parallel (optimize: numba threads): the cores over the
    sweep's jobs, so jobs that run at once do not each start a thread per core (which on a busy
    core spin-wait and slow every other job); one job alone gets every core. 1 when the executor
    has no core count (a cluster: --jobs)."""
    cores = workflow.resource_settings.cores
    return max(1, int(cores) // len(SWEEP.jobs)) if isinstance(cores, int) else 1
