"""Merak's 1F1B pipeline order, as the Perseus artifact runs it (ml-energy/zeus, branch kronos,
merak/Merak/runtime/schedule.py): `TrainSchedule._step_to_micro_batch` decides which micro-batch a
stage computes at each step, and `MergeP2PTrainSchedule.steps` (Merak's `train_schedule='1f1b'`)
the commands around it. Perseus's client sets one power state per command (pipe_engine.py
`_exec_schedule`), and its server fills a command's state from the compute instruction it belongs to.

Pure functions; no I/O.
"""

from __future__ import annotations

# Merak's command classes as Perseus names them (merak/Merak/merak_trainer.py's `inst_map`,
# perseus/perseus/models.py `PipeInstruction`).
LOAD, FORWARD, BACKWARD, P2P, CC, STEP = "load", "forward", "backward", "p2p", "cc", "step"


def _check(stage: int, n_stages: int, n_microbatches: int) -> None:
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"merak: need at least one stage and one microbatch (got {n_stages}, {n_microbatches})")
    if not 0 <= stage < n_stages:
        raise ValueError(f"merak: stage {stage} is outside 0..{n_stages - 1}")


def _step(step: int, stage: int, n_stages: int) -> tuple[int, bool]:
    """(micro-batch, is_forward) that `stage` computes at `step`: TrainSchedule._step_to_micro_batch.
    The micro-batch may be out of range (the stage idles that step)."""
    if step % 2 == stage % 2:  # even step on an even stage, odd on odd: a forward
        return (step - stage % 2) // 2 - stage // 2, True
    if step % 2 == 0:  # even step, odd stage: a backward
        return step // 2 - n_stages + (stage + 1) // 2, False
    return (step - 1) // 2 - n_stages + 1 + stage // 2, False


def _steps(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[int, bool]]:
    return [_step(s, stage, n_stages) for s in range(2 * (n_microbatches + n_stages - 1))]


def instruction_order(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """("forward" | "backward", micro-batch) in the order Merak computes them on `stage`."""
    _check(stage, n_stages, n_microbatches)
    return [
        (FORWARD if fwd else BACKWARD, mb)
        for mb, fwd in _steps(stage, n_stages, n_microbatches)
        if 0 <= mb < n_microbatches
    ]


def pipe_schedule(stage: int, n_stages: int, n_microbatches: int) -> list[str]:
    """The commands `MergeP2PTrainSchedule` runs on `stage` in one iteration, each as the
    PipeInstruction Merak reports to Perseus's server (its `RankInfo.pipe_schedule`); Perseus's
    `power_states` has one entry per command."""
    _check(stage, n_stages, n_microbatches)
    first, last = stage == 0, stage == n_stages - 1
    steps = _steps(stage, n_stages, n_microbatches)
    out: list[str] = []
    prev = -1
    for i, (mb, fwd) in enumerate(steps):
        valid, valid_prev = 0 <= mb < n_microbatches, 0 <= prev < n_microbatches
        # Exchange with the neighbour: the send of the previous step and the receive of this one
        # are merged into one command where both exist.
        if fwd and not first and (valid or valid_prev):
            out.append(P2P)
        if not fwd and not last and (valid or valid_prev):
            out.append(P2P)
        if (first or last) and fwd and valid:
            out.append(LOAD)
        if valid:
            out.append(FORWARD if fwd else BACKWARD)
        if i == len(steps) - 1:
            out += [CC, CC, STEP]  # ReduceTiedGrads, ReduceGrads, OptimizerStep
        prev = mb
    return out
