"""TP x PP x DP, the way large models train (Megatron-LM's 3D parallelism).

`tp * pp * dp` ranks in Megatron's order (TP ranks adjacent, then replicas, then stages). Each
pipeline stage is a tensor-parallel group running the Megatron split with its all-reduces issued
whole (no Domino chunks: micro-batches already keep the pipeline busy); stages exchange activations
and gradients rank to rank (TP rank t of stage s with TP rank t of stage s+1) under 1F1B; the
replicas accumulate gradients over the micro-batches and all-reduce them in the last micro-batch's
backward, bucket by bucket as DDP's reducer does, so the buckets of the late layers overlap the
backward of the early ones. Then clip-grad-norm over the model-parallel group and AdamW.
The schedule and the stage emission are the pipeline's (emo.workloads.pp.pipeline).
"""

from __future__ import annotations

import dataclasses

from emo.config import HybridWorkload, check_workload
from emo.workloads.arch import Arch
from emo.workloads.pp import Grid, pipeline
from emo.workloads.program import Program

SCHEMA = HybridWorkload  # the config of workload.kind=hybrid (emo.workloads finds SCHEMA and build here)


def validate(w: HybridWorkload) -> None:
    check_workload(dataclasses.asdict(w))  # the schema's ranges and rules (emo.config)


def build(w: HybridWorkload, arch: Arch) -> Program:
    validate(w)
    return pipeline(w, arch, Grid(w.tp, w.pp, w.dp))
