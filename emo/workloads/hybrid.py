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
from dataclasses import dataclass, field

from emo.schema import WorkloadConfig, above, at_least, bad, one_of
from emo.workloads import check_workload
from emo.workloads.arch import Arch
from emo.workloads.pp import Grid, pipeline
from emo.workloads.program import Program
from emo.workloads.transformer import TransformerShape, pipeline_rules, shape_rules, tp_rules

MAX_GPUS = 1024  # TP8 x PP8 x DP16: the largest hybrid job (the virtual GPU simulates every rank)


@dataclass
class HybridWorkload(WorkloadConfig):
    kind: str = "hybrid"
    tp: int = field(default=2, metadata=one_of(1, 2, 4, 8))  # tensor-parallel ranks per stage (one NVLink domain)
    pp: int = field(default=2, metadata=one_of(1, 2, 4, 8))  # pipeline stages
    dp: int = field(default=2, metadata=one_of(1, 2, 4, 8, 16))  # data-parallel replicas; tp * pp * dp GPUs in all
    microbatches: int = field(default=4, metadata=at_least(1))  # per replica and step, >= pp (1F1B)
    partition: str = field(default="uniform", metadata=one_of("uniform", "parameter"))
    # paired: a receive goes with the send after it (Megatron's 1F1B); early: as soon as the link allows
    recv: str = field(default="paired", metadata=one_of("paired", "early"))
    bucket_mb: float = field(default=25.0, metadata=above(0))  # DDP's bucket_cap_mb: gradients all-reduced per bucket
    # a 1.3B GPT (GPT-3 XL shape) with 1-sequence micro-batches, 8 layers so the default stays small
    model: TransformerShape = field(default_factory=lambda: TransformerShape(layers=8, hidden=2048, heads=16, batch=1))


SCHEMA = (
    HybridWorkload  # the config of workload.kind=hybrid (emo.workloads finds SCHEMA, rules, label, grid and build here)
)


def rules(w: dict) -> None:
    """What ties the keys together: at most MAX_GPUS ranks, the model split over TP ranks and stages."""
    shape_rules(w["model"])
    if w["tp"] * w["pp"] * w["dp"] > MAX_GPUS:
        bad(
            "workload.dp",
            f"such that workload.tp * workload.pp * workload.dp <= {MAX_GPUS} GPUs "
            f"({w['tp']} * {w['pp']} * {w['dp']} = {w['tp'] * w['pp'] * w['dp']})",
            w["dp"],
        )
    tp_rules(w)
    pipeline_rules(w)


def label(params: dict) -> str:
    """`TP2xPP2xDP2`."""
    return "x".join(f"{k.upper()}{params.get(k, '?')}" for k in ("tp", "pp", "dp"))


def grid(w: dict) -> tuple[int, int, int]:
    return int(w["tp"]), int(w["pp"]), int(w["dp"])


def validate(w: HybridWorkload) -> None:
    check_workload(dataclasses.asdict(w))  # the schema's ranges and rules (its kind's)


def build(w: HybridWorkload, arch: Arch) -> Program:
    validate(w)
    return pipeline(w, arch, Grid(w.tp, w.pp, w.dp))
