"""Your program on the virtual GPU: `emo run gpu=a100 workload=command ...` on a machine without one.

Every device call that starts the program on a GPU box (docs/gpu.md, "Three users": trace, its
untraced run, profile's counters and baselines, validate) starts it here too, once, as you run it
(launcher and ranks real, under EMO's injected hooks), with CUDA hidden (`CUDA_VISIBLE_DEVICES=""`:
the ranks run on the CPU, e.g. over gloo). Each launch records the ranks' host side with
torch.profiler (CPU ops and their input shapes, `EMO_RECORD_SHAPES=1`) for the workload's
wait + warmup + active iterations and is then ended by EMO, as on a GPU box. What a GPU would do
comes from the virtual GPU: `program_from_cpu_traces` turns one recorded iteration per rank into
the virtual GPU's program (emo.workloads.program), and the virtual GPU runs it as many iterations as
the stage asks, under the stage's clocks, writing the traces, counters and energy the stages read.

How the host side becomes a program (per rank, the last recorded iteration):
- an aten op that computes (a GEMM; any other op with no aten op inside it, but views, allocations
  and dtype no-ops) is a kernel launch on the compute stream, its Work from the op's input shapes
  and dtype (emo.workloads.kernels: a cuBLAS-like GEMM, a DRAM-streaming elementwise or reduction
  kernel);
- the host's time before each launch is a GPU host's Python and module overhead for that op, the
  synthetic workloads' (emo.workloads.emitter.HOST_US; the virtual GPU adds the dispatcher and the
  runtime call), not the CPU's timing: there an op's time is its computation and the profiler's,
  and it changes from launch to launch with the machine's load, which would make the stages'
  launches disagree. Time the program spends outside torch ops (data loading, Python) is measured
  and logged (the wall time less the ops' computation and the waits for the CPU backend's
  collectives), not simulated;
- a c10d collective (`c10d::allreduce_`, ...) is an NCCL collective on its own stream after the
  compute work before it, of the recorded tensors' bytes; the compute stream waits for it before
  its next kernel, or, for one issued inside autograd's backward (DDP's buckets), before the first
  kernel after backward;
- `aten::_local_scalar_dense` (`.item()`) is a blocking 4-byte copy to the host; an iteration
  that never waits for the GPU gets one wait at its end (the launch queue would bound it).
No result is made up and nothing is read from the virtual GPU's configuration: the kernels' times
and energies, the clocks and the energy counter are the virtual GPU's physics, as for a synthetic
workload; the program's operations, their shapes, its ranks and collectives are your program's,
recorded on this CPU at every launch.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from emo.device import RunResult
from emo.device.sim.device import SimDevice
from emo.policy import FrequencyPolicy
from emo.workloads.emitter import COLLECTIVE_HOST, DEFAULT_HOST, HOST_US
from emo.workloads.program import CollectiveSpec, KernelSpec, Op, Program

log = logging.getLogger(__name__)

RECORDED = 5  # iterations a launch records at least (the workload's `active` if more)
COMPUTE, NCCL = 7, 20  # stream ids, as the synthetic workloads' (emo.workloads.emitter)

# aten ops that launch no kernel on a GPU: views, allocations, metadata, dtype no-ops
NO_KERNEL = frozenset(
    f"aten::{n}"
    for n in (
        "view t transpose as_strided expand expand_as reshape _reshape_alias unsqueeze squeeze permute slice "
        "select detach detach_ empty empty_like empty_strided new_empty new_empty_strided resolve_conj "
        "resolve_neg result_type to lift_fresh alias contiguous flatten unflatten split split_with_sizes chunk "
        "narrow set_ size numel dim stride _unsafe_view unbind record_stream item is_nonzero broadcast_tensors "
        "view_as numpy_T matrix_H _has_compatible_shallow_copy_type is_same_size _local_scalar_dense"
    ).split()
) | {"detach"}
GEMMS = frozenset(f"aten::{n}" for n in ("mm", "addmm", "bmm", "baddbmm", "addbmm"))
REDUCTIONS = ("sum", "mean", "norm", "max", "min", "amax", "amin", "softmax", "var", "std", "prod", "argmax", "nll")
COLLECTIVES = {
    "allreduce": "allreduce",
    "all_reduce": "allreduce",
    "allgather": "allgather",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "alltoall": "alltoall",
    "all_to_all": "alltoall",
    "broadcast": "allreduce",  # a ring broadcast moves no more than an allreduce
    "barrier": "allreduce",
}
ELSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "bool": 1}
DTYPE = {"float": "fp32", "double": "fp64", "c10::BFloat16": "bf16", "c10::Half": "fp16"}


# --------------------------------------------------------------------------- the device
class CommandSimDevice(SimDevice):
    """The virtual GPU (backend `sim`), which also runs a `command` workload: your program started
    for real, its host side recorded on the CPU, its kernels run on the virtual GPU (module doc)."""

    launches = 0  # how often this device started the program

    def _program(self, workload: Any) -> Program:
        from emo.workloads import kind_of

        if isinstance(workload, Program) or not kind_of(workload).command:
            return super()._program(workload)
        return self.record(workload)

    def record(self, workload: Any) -> Program:
        """Start the program once, record its host side, and make it the virtual GPU's program."""
        from emo.device import launcher

        spec = launcher.CaptureSpec.from_workload(workload)
        spec.active = max(spec.active, RECORDED)  # the host time logged: the least over these
        self.launches += 1
        cmd = " ".join(spec.command)
        log.info(
            "virtual %s: starting your program (launch %d of this stage): %s; its ranks run on the CPU, "
            "%d iterations recorded, the GPU's work simulated",
            self.name,
            self.launches,
            cmd,
            launcher.markers_needed(spec),
        )
        with (
            tempfile.TemporaryDirectory(prefix="emo-host-") as out,
            _env(CUDA_VISIBLE_DEVICES="", EMO_RECORD_SHAPES="1"),
        ):
            res = launcher.run_capture(spec, Path(out))
            program = program_from_cpu_traces(res.trace_files, self.name, name=f"command:{cmd}")
        log.info(
            "virtual %s: %s: %d rank(s), %d kernel launches and %d collectives an iteration "
            "(host time outside the ops that become GPU work, on this CPU: %s ms an iteration per rank)",
            self.name,
            cmd,
            program.ranks,
            program.kernel_launches(),
            sum(1 for ops in program.ops for op in ops if op[0] == Op.COLLECTIVE),
            ", ".join(f"{t:g}" for t in program.meta.get("cpu_host_ms", [])),
        )
        return program

    def run_segments(
        self, workload: Any, runs: list[tuple[FrequencyPolicy | None, int]], *, warmup: int = 1
    ) -> list[RunResult]:
        """Several measured runs in one launch of the program (as NvmlDevice.run_segments): the
        program is started and recorded once, then each run is the virtual GPU's under its clocks."""
        program = self._program(workload)
        out = []
        try:
            for policy, n in runs:
                self.set_policy(policy)
                out.append(self.run(program, n, warmup=warmup))
        finally:
            self.set_policy(None)
        return out


@contextlib.contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------- host side -> program
class _Ev:
    __slots__ = ("name", "ts", "end", "args", "parent", "children", "kind")

    def __init__(self, e: dict):
        self.name, self.ts = str(e["name"]), float(e["ts"])
        self.end = self.ts + float(e.get("dur", 0.0))
        self.args = e.get("args") or {}
        self.parent: _Ev | None = None
        self.children: list[_Ev] = []
        self.kind = ""  # "kernel", "coll", "sync" or ""

    def ancestors(self):
        p = self.parent
        while p is not None:
            yield p
            p = p.parent


def _load(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]


def _iterations(events: list[dict], where: str) -> list[tuple[float, float, list[_Ev], list]]:
    """Per recorded ProfilerStep, its span (µs), the main thread's ops inside it (nested), and the
    spans the main thread waited for a collective in."""
    steps = sorted((e for e in events if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"{where}: no ProfilerStep# in the host trace (did the program step an optimizer?)")
    out = []
    for s in steps:
        t0, t1, tid = float(s["ts"]), float(s["ts"]) + float(s["dur"]), s["tid"]
        evs = [
            _Ev(e)
            for e in events
            if e["tid"] == tid
            and e.get("cat") in ("cpu_op", "user_annotation")
            and not str(e["name"]).startswith("ProfilerStep#")
            and t0 <= float(e["ts"]) < t1
        ]
        evs.sort(key=lambda e: (e.ts, -e.end))
        stack: list[_Ev] = []
        for e in evs:
            while stack and e.ts >= stack[-1].end:
                stack.pop()
            if stack:
                e.parent = stack[-1]
                stack[-1].children.append(e)
            stack.append(e)
        # where the main thread waited for the CPU backend's collective (gloo's own thread ran it,
        # the main thread ran no op): a GPU's host would not wait there (the stream does)
        busy = _union([(e.ts, e.end) for e in evs if e.parent is None])
        idle = _gaps(busy, t0, t1)
        comm = _union(
            [
                (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                for e in events
                if e["tid"] != tid and str(e["name"]).startswith("gloo:") and float(e["ts"]) < t1
            ]
        )
        waits = [(max(a, c), min(b, d)) for a, b in idle for c, d in comm if min(b, d) > max(a, c)]
        out.append((t0, t1, evs, waits))
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _gaps(busy: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    out, cur = [], t0
    for a, b in busy:
        if a > cur:
            out.append((cur, min(a, t1)))
        cur = max(cur, b)
    if cur < t1:
        out.append((cur, t1))
    return out


def _classify(evs: list[_Ev]) -> None:
    for e in evs:
        n = e.name
        if n.startswith("c10d::") and any(k in n for k in COLLECTIVES):
            e.kind = "coll"
        elif n == "aten::_local_scalar_dense":
            e.kind = "sync"
        elif n in GEMMS:
            e.kind = "kernel"
        elif n.startswith("aten::") and n not in NO_KERNEL and not any(c.name.startswith("aten::") for c in e.children):
            e.kind = "kernel"
    for e in evs:  # work inside a collective is the collective's
        if e.kind and any(a.kind == "coll" for a in e.ancestors()):
            e.kind = ""


def _numel(dims: Any) -> int:
    if not isinstance(dims, list) or not dims:
        return 1
    if isinstance(dims[0], list):  # a tensor list
        return sum(_numel(d) for d in dims)
    return math.prod(int(d) for d in dims)


def _tensors(e: _Ev) -> list[tuple[list, str]]:
    dims, types = e.args.get("Input Dims") or [], e.args.get("Input type") or []
    return [(d, t) for d, t in zip(dims, types) if isinstance(d, list) and t not in ("Scalar", "")]


def _kernel(arch: Any, e: _Ev, default_dtype: str) -> KernelSpec:
    from emo.workloads import kernels as K

    ts = _tensors(e)
    dtype = next((t for _, t in ts if t in DTYPE), default_dtype)
    el = ELSIZE.get(dtype, 4)
    if e.name in GEMMS:
        mats = [d for d, _ in ts if len(d) >= 2]
        if len(mats) >= 2:
            a, b = mats[-2], mats[-1]
            batch = math.prod(int(x) for x in a[:-2]) if len(a) > 2 else 1
            m, k, n = batch * int(a[-2]), int(a[-1]), int(b[-1])
            low = DTYPE.get(dtype) in ("bf16", "fp16")
            spec = K.gemm(arch, DTYPE[dtype] if low else "bf16", m, n, k, "tn", e.name)
            if low:
                return spec
            w, tm, tn = spec.work, *K._gemm_tile(arch, m, n)[:2]
            scale = el / K.ELT  # fp32 (or fp64) operands: SIMT FMAs, wider bytes
            work = replace(
                w,
                fp32_flop=w.fp32_flop + (w.fp16_tensor_flop if el == 4 else 0.0),
                fp64_flop=w.fp16_tensor_flop if el == 8 else 0.0,
                fp16_tensor_flop=0.0,
                shared_bytes=w.shared_bytes * scale,
                l2_bytes=w.l2_bytes * scale,
                dram_read_bytes=w.dram_read_bytes * scale,
                dram_write_bytes=w.dram_write_bytes * scale,
            )
            kind = "sgemm" if el == 4 else "dgemm"
            return KernelSpec(f"{arch.family}_{kind}_{tm}x{tn}_tn", work, e.name, spec.grid, spec.block)
    n = max((_numel(d) for d, _ in ts), default=1)
    read = float(sum(_numel(d) for d, _ in ts) * el)
    short = e.name.removeprefix("aten::")
    reduce = any(r in short for r in REDUCTIONS)
    write = float(el if reduce and n else n * el)
    work = K._stream(arch, max(n, 1), read, write, 2.0 * n, threads_per_item=1 / 16 if reduce else 0.25)
    family = "reduce_kernel" if reduce else "vectorized_elementwise_kernel"
    name = f"void at::native::{family}<{short}, {DTYPE.get(dtype, dtype)}>"
    grid = (max(1, math.ceil(n / 512)), 1, 1)
    return KernelSpec(name, work, e.name, grid, (128, 1, 1))


def _host_items(t0: float, t1: float, evs: list[_Ev], waits: list) -> list[tuple[_Ev | None, float]]:
    """(op, host µs before it) for each kernel, collective and sync op in host order: the wall time
    since the previous one, less the CPU computation of the ops that become GPU work; last, (None,
    the host µs from the last one to the iteration's end)."""
    ops = [e for e in evs if e.kind]
    removed = sorted([(e.ts, e.end) for e in ops if not any(a.kind for a in e.ancestors())] + list(waits))

    def host(a: float, b: float) -> float:
        return max(0.0, b - a - sum(max(0.0, min(y, b) - max(x, a)) for x, y in removed))

    out: list[tuple[_Ev | None, float]] = []
    cursor = t0
    for e in ops:
        out.append((e, host(cursor, e.ts)))
        cursor = max(cursor, e.ts)
    out.append((None, host(cursor, t1)))
    return out


def _signature(items: list[tuple[_Ev | None, float]]) -> tuple:
    return tuple((e.name, json.dumps(e.args.get("Input Dims"))) if e else None for e, _ in items)


def program_from_cpu_traces(files: list[Path], gpu: str, *, name: str = "command") -> Program:
    """The virtual GPU's program for one iteration of a CPU run's ranks (module doc): one Kineto trace
    per rank, recorded with input shapes."""
    from emo.workloads.arch import arch_for

    arch = arch_for(gpu)
    files = sorted(Path(f) for f in files)
    if not files:
        raise ValueError("virtual GPU: the program wrote no host trace")
    per_rank: list[list[tuple[_Ev | None, float]]] = []
    for f in files:
        recorded = []
        for t0, t1, evs, waits in _iterations(_load(f), str(f)):
            _classify(evs)
            recorded.append(_host_items(t0, t1, evs, waits))
        last = recorded[-1]
        same = [it for it in recorded if _signature(it) == _signature(last)]
        per_rank.append([(e, min(it[i][1] for it in same)) for i, (e, _) in enumerate(last)])
    colls = [[e for e, _ in r if e is not None and e.kind == "coll"] for r in per_rank]
    if len({len(c) for c in colls}) > 1:
        raise ValueError(
            f"virtual GPU: the ranks ran different numbers of collectives an iteration "
            f"({', '.join(str(len(c)) for c in colls)}): their iterations do not line up"
        )
    ranks = len(per_rank)
    prog = Program(name=name, ranks=ranks, ops=[[] for _ in range(ranks)], streams={COMPUTE: "compute", NCCL: "nccl"})
    for c in colls[0]:
        ts = _tensors(c)
        kind = next(v for k, v in COLLECTIVES.items() if k in c.name)
        nbytes = sum(_numel(d) for d, _ in ts) * 4 if ts else 4  # a TensorList's dtype is not recorded: fp32
        prog.collective(CollectiveSpec(kind, tuple(range(ranks)), int(max(nbytes, 4)), dtype="fp32"))
    event = 0
    for r, items in enumerate(per_rank):
        ops = prog.ops[r]
        gemm_types = [t for e, _ in items if e is not None and e.name in GEMMS for _, t in _tensors(e) if t in DTYPE]
        default_dtype = gemm_types[0] if gemm_types else "float"
        ops.append((Op.ITER,))
        pending: list[int] = []  # events of collectives the compute stream has not waited for yet
        deferred: list[int] = []  # ... issued inside backward: waited for after it
        synced, coll = False, 0
        prog.meta.setdefault("cpu_host_ms", []).append(round(sum(g for _, g in items) / 1e3, 3))
        for e, _ in items:
            if e is None:  # the iteration's end
                break
            # the host's time before the op: a GPU host's Python and module overhead per op, as the
            # synthetic workloads have it (the virtual GPU adds the dispatcher and the runtime call)
            us, where = COLLECTIVE_HOST if e.kind == "coll" else HOST_US.get(e.name, DEFAULT_HOST)
            ops.append((Op.CPU, int(us * 1e3), where))
            in_backward = any(a.name.startswith("autograd::engine::evaluate_function") for a in e.ancestors())
            if e.kind == "coll":
                ops += [(Op.RECORD, event, COMPUTE), (Op.WAIT, NCCL, event), (Op.COLLECTIVE, NCCL, coll)]
                ops.append((Op.RECORD, event + 1, NCCL))
                (deferred if in_backward else pending).append(event + 1)
                event, coll = event + 2, coll + 1
                continue
            if not in_backward:
                pending, deferred = pending + deferred, []
            for ev in pending:
                ops.append((Op.WAIT, COMPUTE, ev))
            pending = []
            if e.kind == "sync":
                ops.append((Op.MEMCPY, COMPUTE, "DtoH", 4, True))
                synced = True
            else:
                ops.append((Op.LAUNCH, COMPUTE, prog.kernel(_kernel(arch, e, default_dtype))))
        for ev in pending + deferred:
            ops.append((Op.WAIT, COMPUTE, ev))
        if not synced:
            ops.append((Op.STREAM_SYNC, COMPUTE))
    return prog
