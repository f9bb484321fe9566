"""A program of yours, given as you run it (`[torchrun, --nproc-per-node, 8, train.py]`): EMO starts
it on a GPU box (gpu.backend=nvml), or on the CPU with the virtual GPU standing in for its kernels
(emo.device.sim.command), and reaches its ranks through the environment (docs/gpu.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from emo.launchers import ranks_asked, starts_ranks
from emo.schema import WorkloadConfig, at_least

SOURCE = "command"  # emo.workloads: EMO starts it, builds no program


@dataclass
class CommandWorkload(WorkloadConfig):
    kind: str = "command"
    command: list[str] = field(default_factory=list)  # e.g. ["python", "train.py"]
    nproc: int = field(
        default=1, metadata=at_least(1)
    )  # > 1: a plain `python script.py` is started under torchrun; 1 for a launcher command
    wait: int = field(default=5, metadata=at_least(0))  # profiler schedule: iterations skipped before warmup
    warmup: int = field(default=2, metadata=at_least(0))
    active: int = field(default=3, metadata=at_least(1))


SCHEMA = CommandWorkload


def gpus(w: dict) -> int | None:
    """GPUs your command runs on: the ranks its launcher asks for on this node (`--nproc-per-node 8`),
    or `nproc`; None (every GPU it can see) for a launcher that does not say a number
    (`--nproc-per-node gpu`, deepspeed without --num_gpus)."""
    command = list(w["command"])
    asked = ranks_asked(command) if command else None
    if asked is None and command and starts_ranks(command):
        return None
    return max(asked or 1, w["nproc"])


def label(params: dict) -> str:
    """`command ['python', 'train.py']`."""
    return f"command {params.get('command', '?')}"
