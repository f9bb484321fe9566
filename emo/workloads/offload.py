"""MoE decode with the routed experts on the CPU (KTransformers style).

Per generated token and layer: on the GPU the attention block (RMSNorm, QKV, RoPE, KV-cache append,
split-KV flash decoding, out-projection, residual) and the router (RMSNorm, gate GEMM, softmax,
top-k); the hidden states and routing go to the host in a blocking copy; the GPU starts the shared
experts while the CPU computes the routed experts (a host interval of expert FLOPs / cpu_gflops);
the result is copied back and added. After the last layer: final norm, LM head, argmax, and the new
tokens to the host. The GPU waits for the CPU most of the time: lots of slack by design.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from emo.schema import WorkloadConfig, above, at_least, bad
from emo.workloads import check_workload
from emo.workloads import kernels as K
from emo.workloads.arch import Arch
from emo.workloads.emitter import COMPUTE, Builder
from emo.workloads.program import Program
from emo.workloads.transformer import TransformerShape, shape_rules


@dataclass
class OffloadWorkload(WorkloadConfig):
    kind: str = "offload"
    experts: int = field(default=64, metadata=at_least(1))  # routed MoE experts, on the CPU (DeepSeek-V2-Lite-like)
    top_k: int = field(default=6, metadata=at_least(1))  # <= experts
    expert_hidden: int = field(default=1408, metadata=at_least(1))
    shared_experts: int = field(default=2, metadata=at_least(0))  # always-on experts, kept on the GPU
    cpu_gflops: float = field(default=800.0, metadata=above(0))  # host compute rate for expert GEMMs
    pcie_gbps: float = field(
        default=25.0, metadata=above(0)
    )  # host <-> device copy bandwidth (a hint in Program.meta; the simulator's link model decides)
    decode_tokens: int = field(default=8, metadata=at_least(1))  # tokens generated per iteration
    # seq: tokens already in the KV cache; batch: sequences decoded together
    model: TransformerShape = field(
        default_factory=lambda: TransformerShape(layers=8, hidden=2048, heads=16, seq=1024, batch=8, vocab=102400)
    )


SCHEMA = OffloadWorkload  # the config of workload.kind=offload (emo.workloads finds SCHEMA, rules and build here)


def rules(w: dict) -> None:
    """What ties the keys together: top-k of the experts there are."""
    shape_rules(w["model"])
    if w["top_k"] > w["experts"]:
        bad("workload.top_k", f"<= workload.experts ({w['experts']})", w["top_k"])


def label(params: dict) -> str:
    """`offload` (its cells were always called so)."""
    return "offload"


def validate(w: OffloadWorkload) -> None:
    check_workload(dataclasses.asdict(w))  # the schema's ranges and rules (its kind's)


def expert_flops(w: OffloadWorkload) -> float:
    """FLOPs of the routed experts of one layer for one decode step: gate, up and down projections
    for each of the batch's top-k choices."""
    return w.model.batch * w.top_k * 3 * 2.0 * w.model.hidden * w.expert_hidden


def build(w: OffloadWorkload, arch: Arch) -> Program:
    validate(w)
    m = w.model
    a = arch
    t = m.dtype if arch.bf16 else "fp16"
    bsz, h, hd = m.batch, m.hidden, m.hidden // m.heads
    fe_shared = w.shared_experts * w.expert_hidden
    cpu_us = expert_flops(w) / (w.cpu_gflops * 1e9) * 1e6
    b = Builder(
        "offload",
        1,
        {COMPUTE: "compute"},
        {
            "kind": "offload",
            "gpu": arch.gpu,
            "dtype": t,
            "pcie_gbps": w.pcie_gbps,
            "cpu_expert_us": cpu_us,
            "decode_tokens": w.decode_tokens,
        },
    )
    em = b.rank(0)
    em.iteration()
    for step in range(w.decode_tokens):
        ctx = m.seq + step + 1
        with em.scope("decode_step"):
            em.launch(K.embedding_fwd(a, t, bsz, h))
            for _ in range(m.layers):
                # attention block
                em.launch(K.rms_norm(a, t, bsz, h))
                em.launch(K.gemm(a, t, bsz, 3 * h, h, "tn", "aten::mm"))
                em.launch(K.elementwise(a, t, "rotary", bsz * 2 * h))
                em.launch(K.elementwise(a, t, "copy", bsz * 2 * h))  # append K and V to the cache
                em.launch_all(K.attention_decode(a, t, bsz, m.heads, ctx, hd))
                em.launch(K.gemm(a, t, bsz, h, h, "tn", "aten::mm"))
                em.launch(K.elementwise(a, t, "add", bsz * h))
                # router
                em.launch(K.rms_norm(a, t, bsz, h))
                em.launch(K.gemm(a, t, bsz, w.experts, h, "tn", "aten::mm"))
                em.launch_all(K.topk(a, bsz, w.experts, w.top_k))
                # hidden states + routing to the host; blocks until the GPU got there
                em.memcpy("DtoH", bsz * h * K.ELT + bsz * w.top_k * 12, blocking=True)
                if fe_shared:  # the GPU works on the shared experts meanwhile
                    em.launch(K.gemm(a, t, bsz, 2 * fe_shared, h, "tn", "aten::mm"))
                    em.launch(K.elementwise(a, t, "silu_mul", bsz * fe_shared))
                    em.launch(K.gemm(a, t, bsz, h, fe_shared, "tn", "aten::mm"))
                em.cpu(cpu_us, "cpuinfer::MoE::forward", jitter=0.1)
                em.memcpy("HtoD", bsz * h * K.ELT, blocking=False)
                em.launch(K.elementwise(a, t, "add", bsz * h))  # routed + shared
                em.launch(K.elementwise(a, t, "add", bsz * h))  # residual
            em.launch(K.rms_norm(a, t, bsz, h))
            em.launch(K.gemm(a, t, bsz, m.vocab, h, "tn", "aten::mm"))
            em.launch(K.row_reduce(a, "argmax", bsz, m.vocab))
            em.memcpy("DtoH", bsz * 8, blocking=True)  # next tokens .tolist()
            em.cpu(250.0, "sample_and_check_stop")
    return b.program
