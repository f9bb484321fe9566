"""What a command line says, as you would type it (`torchrun --nproc-per-node 8 train.py`): whether it
is Python, whether a launcher starts its ranks, and how many it asks for on this node. Plain text,
no EMO imports: the workload kinds (how many GPUs a job holds) and the capture runner (how it starts
the job) read it alike."""

from __future__ import annotations

import re
import sys
from pathlib import Path

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Commands that start their own ranks: workload.nproc must stay 1 for them.
LAUNCHERS = (
    "torchrun",
    "deepspeed",
    "accelerate",
    "mpirun",
    "srun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher.runner",
    "accelerate.commands.launch",
)


def is_python(command: list[str]) -> bool:
    """`python ...`, `python3.11 ...`, this interpreter, or a bare `train.py`."""
    return bool(command) and (
        bool(_PYTHON.match(Path(command[0]).name)) or command[0] == sys.executable or command[0].endswith(".py")
    )


def starts_ranks(command: list[str]) -> bool:
    """Whether the command is a launcher that starts its own ranks (torchrun, `python -m
    torch.distributed.run`, deepspeed, accelerate launch, mpirun, srun)."""
    if Path(command[0]).name in LAUNCHERS:
        return True
    if is_python(command) and "-m" in command[1:]:
        module = command[command.index("-m") + 1 :][:1]
        return bool(module) and module[0] in LAUNCHERS
    return False


# A launcher's own count of the ranks it starts on this node (torchrun, deepspeed, accelerate launch)
_RANK_FLAGS = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus", "--num_processes", "--num-processes")


def ranks_asked(command: list[str]) -> int | None:
    """The ranks a launcher command asks for on this node, when its options say a number (None for a
    plain program, a script, or `--nproc-per-node gpu`): what a rank that wrote nothing leaves unsaid."""
    if not starts_ranks(command):
        return None
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        if flag in _RANK_FLAGS:
            value = value if eq else (command[i + 1] if i + 1 < len(command) else "")
            return int(value) if value.isdigit() else None
    return None
