"""A GPT-style transformer step as a list of phases, and the Domino-style loop that issues them.

A phase is the compute between two tensor-parallel all-reduces (Megatron split: column-parallel
QKV/FC1, row-parallel out-proj/FC2, so each attention and MLP block ends in a partial sum):
`pre` produces the tensor to reduce, `side` is work that does not need the reduced result (weight
gradients), `post` consumes it (bias, dropout, residual; layer-norm backward). With tp = 1 (the
pipeline stages) the same phases run back to back without collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from emo.schema import at_least, bad, one_of
from emo.workloads import kernels as K
from emo.workloads.arch import Arch
from emo.workloads.emitter import COMPUTE, NCCL, RankEmitter
from emo.workloads.program import CollectiveSpec


@dataclass
class TransformerShape:
    layers: int = field(default=4, metadata=at_least(1))  # transformer layers per model replica
    hidden: int = field(default=4096, metadata=at_least(1))
    heads: int = field(default=32, metadata=at_least(1))  # divides hidden (and tp)
    ffn_mult: int = field(default=4, metadata=at_least(1))
    seq: int = field(default=2048, metadata=at_least(1))
    batch: int = field(default=4, metadata=at_least(1))  # micro-batch size (sequences)
    vocab: int = field(default=50304, metadata=at_least(1))  # divisible by tp (vocab-parallel embedding and LM head)
    dtype: str = field(default="bf16", metadata=one_of("bf16", "fp16"))  # fp16 on GPUs without bf16


def shape_rules(m: dict) -> None:
    """A model shape the attention kernels take: heads divide hidden, into a head dim that is a
    multiple of 8 and at most 256 (a rule of every workload with a `model`)."""
    if m["hidden"] % m["heads"]:
        bad("workload.model.hidden", f"divisible by workload.model.heads ({m['heads']})", m["hidden"])
    hd = m["hidden"] // m["heads"]
    if hd % 8 or hd > 256:
        bad(
            "workload.model.heads",
            f"such that the head dim hidden/heads ({hd}) is a multiple of 8 and <= 256",
            m["heads"],
        )


def tp_rules(w: dict) -> None:
    """A model split over `w["tp"]` ranks: its heads and vocabulary divide evenly."""
    m = w["model"]
    for k in ("heads", "vocab"):
        if m[k] % w["tp"]:
            bad(f"workload.model.{k}", f"divisible by workload.tp ({w['tp']})", m[k])


def pipeline_rules(w: dict) -> None:
    """A model split into `w["pp"]` stages under 1F1B: a micro-batch and a layer per stage at least."""
    if w["microbatches"] < w["pp"]:
        bad("workload.microbatches", f">= workload.pp ({w['pp']})", w["microbatches"])
    if w["model"]["layers"] < w["pp"]:
        bad("workload.model.layers", f">= workload.pp ({w['pp']})", w["model"]["layers"])


@dataclass(frozen=True)
class Dims:
    arch: Arch
    dtype: str
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int
    tp: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        """Parameters of one transformer layer held by one tensor-parallel rank."""
        h, f, t = self.hidden, self.ffn, self.tp
        return 4 * h + (3 * h * h + 3 * h + h * h + f * h + f + h * f) // t + 2 * h

    def embedding_params(self) -> int:
        return self.vocab * self.hidden // self.tp

    def head_params(self) -> int:
        return self.vocab * self.hidden // self.tp + 2 * self.hidden  # untied LM head + final norm


Emit = Callable[[RankEmitter, int], None]


def _nothing(em: RankEmitter, c: int) -> None:
    return None


@dataclass
class Phase:
    name: str
    pre: Emit
    ar_bytes: int = 0  # per chunk; 0: nothing to all-reduce
    ar_dtype: str = "bf16"
    side: Emit = _nothing
    post: Emit = _nothing


# --------------------------------------------------------------------------- forward
def forward_phases(d: Dims, seqs: int, layers: int, first: bool, last: bool) -> list[Phase]:
    """Phases of a forward pass over `layers` layers for a chunk of `seqs` sequences; `first` adds the
    (vocab-parallel) embedding, `last` the final norm, LM head and cross entropy."""
    a, t, h = d.arch, d.dtype, d.hidden
    rows = seqs * d.seq
    n = rows * h
    f_tp, h_tp, heads_tp, v_tp = d.ffn // d.tp, h // d.tp, d.heads // d.tp, d.vocab // d.tp
    act = n * K.ELT

    def bias_dropout_add(em: RankEmitter, c: int) -> None:
        em.launch(K.elementwise(a, t, "add", n))  # row-parallel bias, added once after the reduction
        em.launch(K.dropout(a, t, n))
        em.launch(K.elementwise(a, t, "add", n))  # residual

    def attn(em: RankEmitter, c: int) -> None:
        em.launch(K.layer_norm_fwd(a, t, rows, h))
        em.launch(K.gemm(a, t, rows, 3 * h_tp, h, "tn", "aten::addmm"))
        em.launch(K.attention_fwd(a, t, seqs, heads_tp, d.seq, d.head_dim))
        em.launch(K.gemm(a, t, rows, h, h_tp, "tn", "aten::mm"))

    def mlp(em: RankEmitter, c: int) -> None:
        em.launch(K.layer_norm_fwd(a, t, rows, h))
        em.launch(K.gemm(a, t, rows, f_tp, h, "tn", "aten::addmm"))
        em.launch(K.elementwise(a, t, "gelu", rows * f_tp))
        em.launch(K.gemm(a, t, rows, h, f_tp, "tn", "aten::mm"))

    phases: list[Phase] = []
    if first:
        phases.append(
            Phase(
                "embedding",
                lambda em, c: em.launch(K.embedding_fwd(a, t, rows, h)),
                act,
                post=lambda em, c: em.launch(K.dropout(a, t, n)),
            )
        )
    for i in range(layers):
        phases.append(Phase(f"attention{i}", attn, act, post=bias_dropout_add))
        phases.append(Phase(f"mlp{i}", mlp, act, post=bias_dropout_add))
    if last:

        def logits(em: RankEmitter, c: int) -> None:
            em.launch(K.layer_norm_fwd(a, t, rows, h))
            em.launch(K.gemm(a, t, rows, v_tp, h, "tn", "aten::mm"))

        if d.tp == 1:

            def loss(em: RankEmitter, c: int) -> None:
                logits(em, c)
                em.launch(K.log_softmax_fwd(a, t, rows, v_tp))
                em.launch(K.nll_loss(a, rows))

            phases.append(Phase("lm_head", loss))
        else:  # vocab-parallel cross entropy: all-reduce the row max, then the sum of exponentials

            def head(em: RankEmitter, c: int) -> None:
                logits(em, c)
                em.launch(K.row_reduce(a, "max", rows, v_tp))

            phases.append(Phase("lm_head", head, rows * 4, "fp32"))
            phases.append(
                Phase(
                    "cross_entropy",
                    lambda em, c: em.launch(K.row_reduce(a, "sumexp", rows, v_tp)),
                    rows * 4,
                    "fp32",
                    post=lambda em, c: em.launch(K.nll_loss(a, rows)),
                )
            )
    return phases


# --------------------------------------------------------------------------- backward
def backward_phases(d: Dims, seqs: int, layers: int, first: bool, last: bool) -> list[Phase]:
    """Phases of the backward pass matching `forward_phases`, in execution order. The input
    gradient of each column-parallel block is all-reduced while the weight gradients run."""
    a, t, h = d.arch, d.dtype, d.hidden
    rows = seqs * d.seq
    n = rows * h
    f_tp, h_tp, heads_tp, v_tp = d.ffn // d.tp, h // d.tp, d.heads // d.tp, d.vocab // d.tp
    act = n * K.ELT

    def ln_bwd_residual(em: RankEmitter, c: int) -> None:
        em.launch_all(K.layer_norm_bwd(a, t, rows, h))
        em.launch(K.elementwise(a, t, "add", n))  # gradient through the residual branch

    def mlp(em: RankEmitter, c: int) -> None:
        em.launch(K.elementwise(a, t, "dropout_backward", n))
        em.launch(K.gemm(a, t, rows, f_tp, h, "nn", "aten::mm"))  # dgrad FC2
        em.launch(K.elementwise(a, t, "gelu_backward", rows * f_tp))
        em.launch(K.gemm(a, t, rows, h, f_tp, "nn", "aten::mm"))  # dgrad FC1

    def mlp_wgrad(em: RankEmitter, c: int) -> None:
        em.launch(K.gemm(a, t, h, f_tp, rows, "nt", "aten::mm"))
        em.launch(K.bias_grad(a, t, rows, h))
        em.launch(K.gemm(a, t, f_tp, h, rows, "nt", "aten::mm"))
        em.launch(K.bias_grad(a, t, rows, f_tp))

    def attn(em: RankEmitter, c: int) -> None:
        em.launch(K.elementwise(a, t, "dropout_backward", n))
        em.launch(K.gemm(a, t, rows, h_tp, h, "nn", "aten::mm"))  # dgrad out-proj
        em.launch_all(K.attention_bwd(a, t, seqs, heads_tp, d.seq, d.head_dim))
        em.launch(K.gemm(a, t, rows, h, 3 * h_tp, "nn", "aten::mm"))  # dgrad QKV

    def attn_wgrad(em: RankEmitter, c: int) -> None:
        em.launch(K.gemm(a, t, h, h_tp, rows, "nt", "aten::mm"))
        em.launch(K.bias_grad(a, t, rows, h))
        em.launch(K.gemm(a, t, 3 * h_tp, h, rows, "nt", "aten::mm"))
        em.launch(K.bias_grad(a, t, rows, 3 * h_tp))

    phases: list[Phase] = []
    if last:

        def head(em: RankEmitter, c: int) -> None:
            em.launch(K.nll_loss(a, rows, backward=True))
            em.launch(K.elementwise(a, t, "softmax_grad", rows * v_tp))
            em.launch(K.gemm(a, t, rows, h, v_tp, "nn", "aten::mm"))

        phases.append(
            Phase(
                "lm_head_backward",
                head,
                act if d.tp > 1 else 0,
                side=lambda em, c: em.launch(K.gemm(a, t, v_tp, h, rows, "nt", "aten::mm")),
                post=lambda em, c: em.launch_all(K.layer_norm_bwd(a, t, rows, h)),
            )
        )
    for i in reversed(range(layers)):
        phases.append(Phase(f"mlp{i}_backward", mlp, act, side=mlp_wgrad, post=ln_bwd_residual))
        phases.append(Phase(f"attention{i}_backward", attn, act, side=attn_wgrad, post=ln_bwd_residual))
    if first:

        def embed(em: RankEmitter, c: int) -> None:
            em.launch(K.elementwise(a, t, "dropout_backward", n))
            em.launch_all(K.embedding_bwd(a, t, rows, h))

        phases.append(Phase("embedding_backward", embed))
    return phases


# --------------------------------------------------------------------------- issuing
def issue(
    em: RankEmitter, phases: list[Phase], chunks: int, group: tuple[int, ...], key: tuple, name: str = "tp"
) -> None:
    """Issue `phases` for `chunks` chunks, Domino style: phase p of every chunk is issued before phase
    p+1, so the all-reduce of chunk i (on the NCCL stream, after a record/wait join) overlaps the
    compute of chunk i+1; the consumer of a reduced tensor waits for its event just before `post`.
    `group` are the ranks of the tensor-parallel group and `name` its process group's name."""
    reduce = len(group) > 1
    pending: list[int | None] = [None] * chunks
    prev: Phase | None = None
    for p, ph in enumerate(phases):
        for c in range(chunks):
            if prev is not None:
                if (ev := pending[c]) is not None:
                    em.wait(COMPUTE, ev)
                    pending[c] = None
                prev.post(em, c)
            ph.pre(em, c)
            if reduce and ph.ar_bytes:
                em.join(COMPUTE, NCCL)
                em.collective(NCCL, key + (p, c), CollectiveSpec("allreduce", group, ph.ar_bytes, name, ph.ar_dtype))
                pending[c] = em.record(NCCL)
            ph.side(em, c)
        prev = ph
    if prev is not None:
        for c in range(chunks):
            if (ev := pending[c]) is not None:
                em.wait(COMPUTE, ev)
            prev.post(em, c)


def optimizer_step(
    em: RankEmitter, arch: Arch, params: int, norm_group: tuple[int, ...] = (), group: str = "0"
) -> None:
    """clip_grad_norm_ (foreach norm, all-reduced over `norm_group` when it spans several ranks, as
    Megatron does over the model-parallel group) then fused AdamW, one multi_tensor_apply launch
    per 320 chunks of 64 Ki elements."""
    for n in K.multi_tensor_launches(params):
        em.launch(K.grad_norm(arch, n))
    em.launch(K.grad_norm_cleanup(arch))
    if len(norm_group) > 1:
        em.join(COMPUTE, NCCL)
        em.collective(NCCL, ("grad_norm", group), CollectiveSpec("allreduce", norm_group, 4, group, "fp32"))
        em.wait(COMPUTE, em.record(NCCL))
    with em.scope("Optimizer.step#AdamW.step"):
        em.cpu(60.0, "aten::_foreach_add_")  # step counters
        for n in K.multi_tensor_launches(params):
            em.launch(K.adam(arch, n))


def data_loader(em: RankEmitter, tokens: int, ms: float = 4.0) -> None:
    """Next batch from the DataLoader (host only), then its token ids and labels to the GPU."""
    em.cpu(ms * 1000.0, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", jitter=0.3)
    em.memcpy("HtoD", tokens * 8, blocking=False)
    em.memcpy("HtoD", tokens * 8, blocking=False)
