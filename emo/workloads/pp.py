"""Pipeline parallelism with the 1F1B schedule (PipeDream-Flush / Megatron).

Stage s runs min(P-s-1, M) warm-up forwards, then alternates one forward and one backward, then
drains the remaining backwards. Activations go forward and gradients backward as 2-rank SENDRECV
collectives (one rendezvous per transfer) on a stream per neighbour, as PyTorch gives each P2P
pair its own communicator. Both ends of a link issue its transfers in the same order (the order in
which the later stage consumes and produces them), so in-order streams cannot deadlock. The step
ends with clip-grad-norm all-reduced over all stages, AdamW per stage and a blocking .item().
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from emo.schema import WorkloadConfig, at_least, one_of
from emo.workloads import check_workload
from emo.workloads import kernels as K
from emo.workloads.arch import Arch
from emo.workloads.emitter import COMPUTE, NCCL, Builder, RankEmitter
from emo.workloads.program import CollectiveSpec, Program
from emo.workloads.transformer import (
    Dims,
    Phase,
    TransformerShape,
    backward_phases,
    data_loader,
    forward_phases,
    issue,
    optimizer_step,
    pipeline_rules,
    shape_rules,
)


@dataclass
class PPWorkload(WorkloadConfig):
    kind: str = "pp"
    pp: int = field(default=4, metadata=one_of(2, 4, 8))  # pipeline stages (GPUs)
    microbatches: int = field(default=8, metadata=at_least(1))  # >= pp
    partition: str = field(
        default="uniform", metadata=one_of("uniform", "parameter")
    )  # "uniform" or "parameter" (embedding and LM head make stages uneven)
    # paired: a receive goes with the send after it (Megatron's 1F1B); early: as soon as the link allows
    recv: str = field(default="paired", metadata=one_of("paired", "early"))
    # a 1.3B GPT (GPT-3 XL shape) with 1-sequence micro-batches: ~0.15 s per step on 4 A100s
    model: TransformerShape = field(default_factory=lambda: TransformerShape(layers=16, hidden=2048, heads=16, batch=1))


SCHEMA = PPWorkload  # the config of workload.kind=pp (emo.workloads finds SCHEMA, rules, label, grid and build here)


def rules(w: dict) -> None:
    """What ties the keys together: a micro-batch and a layer per stage at least."""
    shape_rules(w["model"])
    pipeline_rules(w)


def label(params: dict) -> str:
    """`PP4 uniform`, `PP8 parameter`."""
    return f"PP{params.get('pp', '?')} {params.get('partition', '')}".strip()


def grid(w: dict) -> tuple[int, int, int]:
    return 1, int(w["pp"]), 1


P2P_PREV = 24  # stream of the link to the previous stage
P2P_NEXT = 28  # stream of the link to the next stage
DP = 32  # the data-parallel process group's NCCL stream (gradient buckets)


def validate(w: PPWorkload) -> None:
    check_workload(dataclasses.asdict(w))  # the schema's ranges and rules (its kind's)


# --------------------------------------------------------------------------- partition
def uniform_partition(layers: int, stages: int) -> list[int]:
    """Equal transformer layers per stage (the first stages take the remainder)."""
    q, r = divmod(layers, stages)
    return [q + (s < r) for s in range(stages)]


def parameter_partition(layers: int, stages: int, layer_w: int, first_w: int, last_w: int) -> list[int]:
    """Contiguous layers per stage minimising the largest stage's parameter count, the first stage
    also holding `first_w` (embedding) and the last `last_w` (LM head), every stage at least one
    layer: DeepSpeed's partition_method="parameters", solved exactly. Among the partitions with
    that bottleneck, the one with the most even loads (least sum of squares) wins."""

    def load(s: int, n: int) -> int:
        return n * layer_w + (first_w if s == 0 else 0) + (last_w if s == stages - 1 else 0)

    def solve(cost, combine, cap: float) -> tuple[float, list[int]]:
        # best[s][j]: best value placing the first j layers on stages 0..s (each load <= cap)
        inf = float("inf")
        best = [[inf] * (layers + 1) for _ in range(stages)]
        cut = [[0] * (layers + 1) for _ in range(stages)]
        for j in range(1, layers + 1):
            if load(0, j) <= cap:
                best[0][j] = cost(load(0, j))
        for s in range(1, stages):
            for j in range(s + 1, layers + 1):
                for i in range(s, j):  # stage s holds layers i..j-1
                    if load(s, j - i) <= cap and best[s - 1][i] < inf:
                        v = combine(best[s - 1][i], cost(load(s, j - i)))
                        if v < best[s][j]:
                            best[s][j], cut[s][j] = v, i
        sizes, j = [], layers
        for s in range(stages - 1, 0, -1):
            i = cut[s][j]
            sizes.append(j - i)
            j = i
        sizes.append(j)
        return best[stages - 1][layers], sizes[::-1]

    bottleneck, _ = solve(float, max, float("inf"))
    return solve(lambda x: float(x) ** 2, lambda a, b: a + b, bottleneck)[1]


def partition(w: PPWorkload, d: Dims) -> list[int]:
    if w.partition == "uniform":
        return uniform_partition(w.model.layers, w.pp)
    return parameter_partition(w.model.layers, w.pp, d.layer_params(), d.embedding_params(), d.head_params())


# --------------------------------------------------------------------------- schedule
def one_f_one_b(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """The 1F1B order of forwards ('F', m) and backwards ('B', m) on one stage."""
    warm = min(stages - stage - 1, micro)
    order = [("F", m) for m in range(warm)]
    for i in range(micro - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", m) for m in range(micro - warm, micro)]
    return order


def build(w: PPWorkload, arch: Arch) -> Program:
    validate(w)
    return pipeline(w, arch, Grid(1, w.pp, 1))


# --------------------------------------------------------------------------- the grid of ranks
@dataclass(frozen=True)
class Grid:
    """Where each rank sits in a TP x PP x DP job, in Megatron-LM's order: tensor-parallel ranks
    adjacent (one NVLink domain), then data-parallel replicas, then pipeline stages."""

    tp: int
    pp: int
    dp: int

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, s: int, d: int, t: int) -> int:
        return (s * self.dp + d) * self.tp + t

    def tp_group(self, s: int, d: int) -> tuple[int, ...]:
        return tuple(self.rank(s, d, t) for t in range(self.tp))

    def dp_group(self, s: int, t: int) -> tuple[int, ...]:
        return tuple(self.rank(s, d, t) for d in range(self.dp))

    def mp_group(self, d: int) -> tuple[int, ...]:
        """The model-parallel group of replica d (every stage and TP rank): clip-grad-norm's all-reduce."""
        return tuple(sorted(self.rank(s, d, t) for s in range(self.pp) for t in range(self.tp)))

    def name(self, what: str, s: int = 0, d: int = 0, t: int = 0) -> str:
        """Process-group names; the plain pipeline keeps its own ("pp0-1", "pp")."""
        if self.tp == self.dp == 1:
            return {"p2p": f"pp{s}-{s + 1}", "mp": "pp"}[what]
        return {"p2p": f"pp{s}-{s + 1}.{d}.{t}", "mp": f"mp{d}", "tp": f"tp{s}.{d}", "dp": f"dp{s}.{t}"}[what]


def grad_buckets(phases: list[Phase], grads: dict[str, int], cap_bytes: int) -> list[list[Phase]]:
    """Backward phases in runs whose gradients fill one DDP bucket each (`cap_bytes`, in backward
    order, as DDP's reducer fills them): the bucket's all-reduce can start once its run is done."""
    runs: list[list[Phase]] = [[]]
    fill = 0
    for ph in phases:
        runs[-1].append(ph)
        fill += grads.get(ph.name, 0)
        if fill >= cap_bytes:
            runs.append([])
            fill = 0
    return [r for r in runs if r]


def pipeline(w, arch: Arch, grid: Grid) -> Program:
    """1F1B over `grid.pp` stages, each stage a tensor-parallel group of `grid.tp` ranks, the whole
    pipeline replicated `grid.dp` times; with dp > 1 the last micro-batch's backward all-reduces the
    gradients over the replicas in DDP buckets (`w.bucket_mb`) as they fill, overlapping the rest of
    that backward, and the optimizer step waits for them."""
    m = w.model
    dtype = m.dtype if arch.bf16 else "fp16"
    d = Dims(arch, dtype, m.hidden, m.heads, m.ffn_mult * m.hidden, m.seq, m.vocab, grid.tp)
    sizes = partition(w, Dims(arch, dtype, m.hidden, m.heads, m.ffn_mult * m.hidden, m.seq, m.vocab, 1))
    job = _Job(
        w,
        arch,
        grid,
        d,
        dtype,
        sizes,
        schedules=[one_f_one_b(s, grid.pp, w.microbatches) for s in range(grid.pp)],
        params=stage_params(sizes, d),
        act=m.batch * m.seq * m.hidden * K.ELT,
        grad_bytes=layer_grad_bytes(m.hidden, m.ffn_mult * m.hidden, grid.tp),
    )
    meta = workload_meta(w, grid)
    b = Builder(
        f"pp{grid.pp}" if meta["kind"] == "pp" else f"tp{grid.tp}pp{grid.pp}dp{grid.dp}",
        grid.ranks,
        streams(grid),
        {**meta, "layers_per_stage": sizes, "params_per_stage": job.params, "gpu": arch.gpu, "dtype": dtype},
    )
    for r in range(grid.ranks):
        _Rank(job, b.rank(r), r).iteration()
    return b.program


def stage_params(sizes: list[int], d: Dims) -> list[int]:
    """Each stage's parameters: its layers, the first stage's embedding and the last one's LM head."""
    last = len(sizes) - 1
    return [
        n * d.layer_params() + (d.embedding_params() if s == 0 else 0) + (d.head_params() if s == last else 0)
        for s, n in enumerate(sizes)
    ]


def layer_grad_bytes(h: int, f: int, tp: int) -> tuple[int, int]:
    """Gradient bytes of one layer's attention and MLP on one of `tp` tensor-parallel ranks (hidden
    size `h`, FFN size `f`): the split weights a share each, the rest whole."""
    return K.ELT * ((4 * h * h + 3 * h) // tp + 3 * h), K.ELT * ((2 * f * h + f) // tp + 3 * h)


def streams(grid: Grid) -> dict[int, str]:
    """Stream id -> role: compute, the TP collectives, a link per neighbour, and the DP buckets' stream."""
    out = {COMPUTE: "compute", NCCL: "nccl", P2P_PREV: "p2p_prev", P2P_NEXT: "p2p_next"}
    if grid.dp > 1:
        out[DP] = "nccl_dp"
    return out


def workload_meta(w, grid: Grid) -> dict:
    """What the program says it is: the plain pipeline's keys, or the hybrid job's."""
    if w.kind == "pp":
        return {"kind": "pp", "pp": grid.pp, "microbatches": w.microbatches, "partition": w.partition}
    return {
        "kind": "hybrid",
        "tp": grid.tp,
        "pp": grid.pp,
        "dp": grid.dp,
        "microbatches": w.microbatches,
        "partition": w.partition,
        "bucket_mb": w.bucket_mb,
    }


def stage_grads(bwd: list[Phase], grad_bytes: tuple[int, int], d: Dims) -> dict[str, int]:
    """Backward phase -> the gradient bytes it leaves for DDP to all-reduce (layer_grad_bytes per
    attention or MLP block; the LM head and the embedding whole)."""
    grads = {
        ph.name: grad_bytes[0] if ph.name.startswith("attention") else grad_bytes[1]
        for ph in bwd
        if ph.name.endswith("_backward")
    }
    grads["lm_head_backward"] = K.ELT * d.head_params()
    grads["embedding_backward"] = K.ELT * d.embedding_params()
    return grads


@dataclass(frozen=True)
class _Job:
    """What every rank's emission shares."""

    w: Any  # a PPWorkload or an emo.workloads.hybrid.HybridWorkload
    arch: Arch
    grid: Grid
    d: Dims  # the dimensions on one TP rank
    dtype: str
    sizes: list[int]  # layers per stage
    schedules: list[list[tuple[str, int]]]  # the 1F1B order of each stage
    params: list[int]  # parameters per stage
    act: int  # one micro-batch's activation (or its gradient), whole on every TP rank
    grad_bytes: tuple[int, int]  # layer_grad_bytes


class _Rank:
    """One rank's iteration: its stage's 1F1B steps, the link to the next stage posted in the order
    that stage meets its transfers, and (dp > 1) the gradients of the last backward in DDP buckets."""

    def __init__(self, job: _Job, em: RankEmitter, r: int):
        grid, m = job.grid, job.w.model
        self.job, self.em = job, em
        self.s, self.dd, self.t = r // (grid.tp * grid.dp), (r // grid.tp) % grid.dp, r % grid.tp
        s = self.s
        self.first, self.last = s == 0, s == grid.pp - 1
        self.tp_group = grid.tp_group(s, self.dd)
        self.tp_name = grid.name("tp", s, self.dd) if grid.tp > 1 else "tp"
        self.fwd = forward_phases(job.d, m.batch, job.sizes[s], self.first, self.last)
        self.bwd = backward_phases(job.d, m.batch, job.sizes[s], self.first, self.last)
        self.grads = stage_grads(self.bwd, job.grad_bytes, job.d)
        # the link to the next stage carries transfers in the order that stage meets them
        self.queue = (
            [("fwd" if kind == "F" else "bwd", mb) for kind, mb in job.schedules[s + 1]] if not self.last else []
        )
        self.pos = 0  # transfers of the queue posted so far
        self.fwd_done: dict[int, int] = {}  # micro-batch -> event after its forward on the compute stream
        self.grad_in: dict[int, int] = {}  # micro-batch -> event after its gradient arrived

    def iteration(self) -> None:
        em, job, s, m = self.em, self.job, self.s, self.job.w.model
        em.iteration()
        if self.first or self.last:
            data_loader(
                em, m.batch * m.seq * job.w.microbatches, ms=3.0
            )  # tokens on the first stage, labels on the last
        else:
            em.cpu(300.0, "get_batch")
        for kind, mb in job.schedules[s]:
            if kind == "F":
                self.forward_step(mb)
            else:
                self.backward_step(mb)
        self.flush()
        assert self.pos == len(self.queue), (
            f"stage {s}: {len(self.queue) - self.pos} transfers to the next stage never posted"
        )
        optimizer_step(em, job.arch, job.params[s], job.grid.mp_group(self.dd), job.grid.name("mp", s, self.dd, self.t))
        em.cpu(150.0, "Optimizer.zero_grad#AdamW.zero_grad")
        em.memcpy("DtoH", 4, blocking=True)  # loss.item() on the last stage, grad_norm.item() elsewhere

    def transfer(self, src: int, dst: int, direction: str, mb: int) -> tuple[tuple, CollectiveSpec]:
        """The key and the spec of a micro-batch's transfer from stage `src` to stage `dst`."""
        grid, dd, t = self.job.grid, self.dd, self.t
        lo = min(src, dst)
        ranks = (grid.rank(src, dd, t), grid.rank(dst, dd, t))
        return (
            ("p2p", lo, dd, t, direction, mb),
            CollectiveSpec("sendrecv", ranks, self.job.act, grid.name("p2p", lo, dd, t), self.job.dtype),
        )

    def forward_step(self, mb: int) -> None:
        em, s = self.em, self.s
        with em.scope("forward_step"):
            if not self.first:
                em.collective(P2P_PREV, *self.transfer(s - 1, s, "fwd", mb))
                em.wait(COMPUTE, em.record(P2P_PREV))
            issue(em, self.fwd, 1, self.tp_group, ("tp", s, self.dd, "fwd", mb), self.tp_name)
            if not self.last:
                self.fwd_done[mb] = em.record(COMPUTE)
                self.flush()

    def backward_step(self, mb: int) -> None:
        em, s = self.em, self.s
        with em.scope("backward_step"):
            if not self.last:
                self.flush(need=mb)
                em.wait(COMPUTE, self.grad_in[mb])
            self.backward(mb)
            if not self.first:
                em.join(COMPUTE, P2P_PREV)
                em.collective(P2P_PREV, *self.transfer(s, s - 1, "bwd", mb))

    def flush(self, need: int | None = None) -> None:
        """Post the next link's transfers in order, as far as this stage can: a send once the
        forward that produces it has been issued; a receive at once (recv=early), or with the
        send that follows it (recv=paired, Megatron's send_forward_recv_backward), or, with no
        send after it, at the backward that `need`s it (Megatron's recv_backward)."""
        em, s, queue = self.em, self.s, self.queue
        while self.pos < len(queue):
            direction, mb = queue[self.pos]
            if direction == "fwd":
                if mb not in self.fwd_done:
                    return
                em.wait(P2P_NEXT, self.fwd_done[mb])
                em.collective(P2P_NEXT, *self.transfer(s, s + 1, "fwd", mb))
            else:
                if self.job.w.recv == "paired":
                    after = queue[self.pos + 1] if self.pos + 1 < len(queue) else None
                    if after is not None and after[0] == "fwd" and after[1] not in self.fwd_done:
                        return
                    if (after is None or after[0] != "fwd") and need != mb:
                        return
                em.collective(P2P_NEXT, *self.transfer(s + 1, s, "bwd", mb))
                self.grad_in[mb] = em.record(P2P_NEXT)
            self.pos += 1

    def backward(self, mb: int) -> None:
        """One micro-batch's backward; the last one's gradients all-reduced over the replicas in
        DDP buckets as they fill, the optimizer step waiting for every bucket."""
        em, job, s, t = self.em, self.job, self.s, self.t
        grid = job.grid
        key = ("tp", s, self.dd, "bwd", mb)
        if grid.dp == 1 or mb != job.w.microbatches - 1:  # gradients accumulate locally (DDP's no_sync)
            issue(em, self.bwd, 1, self.tp_group, key, self.tp_name)
            return
        runs = grad_buckets(self.bwd, self.grads, int(job.w.bucket_mb * 2**20))
        for i, run in enumerate(runs):
            issue(em, run, 1, self.tp_group, key + (i,), self.tp_name)
            nbytes = sum(self.grads.get(ph.name, 0) for ph in run)
            if nbytes:
                em.join(COMPUTE, DP)
                em.collective(
                    DP,
                    ("dp", s, t, i),
                    CollectiveSpec("allreduce", grid.dp_group(s, t), nbytes, grid.name("dp", s, self.dd, t), job.dtype),
                )
        em.wait(COMPUTE, em.record(DP))  # the optimizer step needs every bucket reduced
