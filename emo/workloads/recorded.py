"""A trace recorded elsewhere (torch.profiler Kineto JSON, a folder of per-rank files, or an `nsys
export --type sqlite` file): nothing runs; trace copies it, profile reads the counters recorded
beside it, and validate cannot re-run it (the policy stands on its prediction)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import MISSING

from emo.schema import NON_EMPTY, WorkloadConfig

SOURCE = "trace"  # emo.workloads: read from workload.path, never run


@dataclass
class RecordedWorkload(WorkloadConfig):
    kind: str = "recorded"
    path: str = field(
        default=MISSING, metadata=NON_EMPTY
    )  # a Kineto JSON trace (file or folder of per-rank files) or an nsys SQLite export


SCHEMA = RecordedWorkload


def label(params: dict) -> str:
    """`recorded trace.json`: the file's or folder's name."""
    return f"recorded {Path(params.get('path', '?')).name}"
