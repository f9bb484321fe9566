"""Tensor parallelism (Megatron split) with Domino-style overlap of the all-reduces, or without it.

Every rank of the TP group runs the same program. `overlap: domino`: the batch is split into
`chunks`; each attention and MLP block ends in an all-reduce over the group, issued on the NCCL
stream after a record/wait join while the compute stream moves on to the next chunk; the consumer
waits for it just before use. `overlap: megatron`: the batch in one piece, so the compute stream
waits for each forward all-reduce at once (the synchronous all_reduce of Megatron-LM's
RowParallelLinear); in backward the input-gradient all-reduce still overlaps the weight-gradient
GEMMs, as Megatron's async grad-input all-reduce does. Forward, backward (input-gradient all-reduce overlapping the weight gradients), clip-grad-norm
with its all-reduce, fused AdamW, and loss.item() at the end.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from emo.schema import WorkloadConfig, at_least, bad, one_of
from emo.workloads import check_workload
from emo.workloads.arch import Arch
from emo.workloads.emitter import COMPUTE, NCCL, Builder
from emo.workloads.program import Program
from emo.workloads.transformer import (
    Dims,
    TransformerShape,
    backward_phases,
    data_loader,
    forward_phases,
    issue,
    optimizer_step,
    shape_rules,
    tp_rules,
)


@dataclass
class TPWorkload(WorkloadConfig):
    kind: str = "tp"
    tp: int = field(default=2, metadata=one_of(2, 4, 8))  # tensor-parallel degree (GPUs)
    chunks: int = field(
        default=2, metadata=at_least(1)
    )  # divides model.batch; Domino-style split of the batch: all-reduce of chunk i overlaps compute of i+1
    # domino: the batch in `chunks`, each chunk's all-reduce overlapping the next chunk's compute;
    # megatron: plain Megatron-LM, the whole batch at once, forward all-reduces blocking the compute
    # stream (backward's input-gradient all-reduce still overlaps the weight gradients); chunks unused
    overlap: str = field(default="domino", metadata=one_of("domino", "megatron"))
    training: bool = True
    model: TransformerShape = field(default_factory=TransformerShape)


SCHEMA = TPWorkload  # the config of workload.kind=tp (emo.workloads finds SCHEMA, rules, label, grid and build here)


def rules(w: dict) -> None:
    """What ties the keys together: the model splits over the TP ranks, the batch into the chunks."""
    shape_rules(w["model"])
    tp_rules(w)
    if w["overlap"] == "domino" and w["model"]["batch"] % w["chunks"]:
        bad("workload.chunks", f"a divisor of workload.model.batch ({w['model']['batch']})", w["chunks"])


def label(params: dict) -> str:
    """`TP4`, `TP8 megatron`."""
    plain = " megatron" if params.get("overlap") == "megatron" else ""
    return f"TP{params.get('tp', '?')}{plain}"


def grid(w: dict) -> tuple[int, int, int]:
    return int(w["tp"]), 1, 1


def validate(w: TPWorkload) -> None:
    check_workload(dataclasses.asdict(w))  # the schema's ranges and rules (its kind's)


def build(w: TPWorkload, arch: Arch) -> Program:
    validate(w)
    m = w.model
    dtype = m.dtype if arch.bf16 else "fp16"
    d = Dims(arch, dtype, m.hidden, m.heads, m.ffn_mult * m.hidden, m.seq, m.vocab, w.tp)
    chunks = w.chunks if w.overlap == "domino" else 1
    seqs = m.batch // chunks
    group = tuple(range(w.tp))
    params = m.layers * d.layer_params() + d.embedding_params() + d.head_params()
    b = Builder(
        f"tp{w.tp}",
        w.tp,
        {COMPUTE: "compute", NCCL: "nccl"},
        {
            "kind": "tp",
            "tp": w.tp,
            "chunks": chunks,
            "overlap": w.overlap,
            "training": w.training,
            "gpu": arch.gpu,
            "dtype": dtype,
            "params_per_rank": params,
        },
    )
    fwd = forward_phases(d, seqs, m.layers, first=True, last=True)
    bwd = backward_phases(d, seqs, m.layers, first=True, last=True)
    for r in group:
        em = b.rank(r)
        em.iteration()
        data_loader(em, m.batch * m.seq)
        with em.scope("## forward ##"):
            issue(em, fwd, chunks, group, ("fwd",))
        if w.training:
            with em.scope("## backward ##"):
                em.cpu(40.0, "aten::ones_like")  # loss.backward(): the seed gradient
                issue(em, bwd, chunks, group, ("bwd",))
            optimizer_step(em, arch, params, group, "tp")
            em.cpu(150.0, "Optimizer.zero_grad#AdamW.zero_grad")
        em.memcpy("DtoH", 4, blocking=True)  # loss.item()
    return b.program
