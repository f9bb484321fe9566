"""A rank's host thread, planned with numpy: between two blocking calls the host's timeline is a
cumulative sum of fixed costs (CPU ops, framework and runtime-call overheads with seeded jitter), so
the engine only touches the ops that put work on the GPU or block, and the host's trace records are
rebuilt afterwards from per-iteration arrays (`HostLog`).

Ops are validated once here: a bad op is a one-line ValueError naming the rank and the op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# op codes (emo.device.sim.program.Op)
CPU, LAUNCH, MEMCPY, RECORD, WAIT, SSYNC, ESYNC, DSYNC, COLL, ITER, BEGIN, END = range(12)
# jitter categories: which physics range an op's runtime call draws its duration from
J_NONE, J_LAUNCH, J_NCCL, J_RUNTIME, J_MEMCPY = range(5)
JITTER_KEYS = (None, "launch_us", "nccl_launch_us", "runtime_call_us", "memcpy_call_us")
BLOCKING_MEMCPY = 12  # internal code: cudaMemcpy that waits for the copy
REQUEST = 13  # internal code: a host-triggered policy's clock request, (REQUEST, clock index); no host time


def triggered_ops(ops: list, names: set[str] | frozenset[str], synchronize: bool, clocks: list[int], r: int) -> list:
    """Rank r's ops with a host-triggered policy's requests (emo.policy.Trigger): after the BEGIN of
    the i-th scope named in `names`, a cudaDeviceSynchronize (when `synchronize`) and then the
    request of clocks[i] (a clock index). As Perseus's controller, one clock per matching scope per
    iteration: a count that differs is a one-line ValueError."""
    n = sum(1 for op in ops if int(op[0]) == BEGIN and str(op[1]) in names)
    if n != len(clocks):
        raise ValueError(
            f"host-triggered policy: rank {r} enters {n} scopes named {sorted(names)} per iteration "
            f"but the policy has {len(clocks)} steps for it"
        )
    out: list = []
    k = 0
    for op in ops:
        out.append(op)
        if int(op[0]) == BEGIN and str(op[1]) in names:
            if synchronize:
                out.append((DSYNC,))
            out.append((REQUEST, int(clocks[k])))
            k += 1
    return out


@dataclass
class HostPlan:
    """Static, per-iteration description of one rank's host ops."""

    n: int
    code: np.ndarray  # [n] op code (BLOCKING_MEMCPY for blocking copies)
    lo: np.ndarray  # [n] jitter range of the op's runtime call (ns)
    span: np.ndarray
    fixed_adv: np.ndarray  # [n] host time the op takes besides its runtime call
    adv_has_d: np.ndarray  # [n] 1 if the runtime call's duration advances the host (non-blocking ops)
    rel_fixed: np.ndarray  # [n] from op start to the GPU seeing the work, besides the runtime call
    corr_idx: np.ndarray  # [n] correlation id offset within an iteration (ops with runtime calls)
    ext_idx: np.ndarray  # [n] External id offset within an iteration
    n_corr: int
    n_ext: int
    active: list  # [(i, code, a, b, corr_i, ext_i)] ops the engine must act on, in order
    names: list  # [n] op name (CPU op, BEGIN scope, framework op of a launch) or ""
    arg: list  # [n] kernel id / collective id / event id / stream id, per op
    sid: list  # [n] stream id or -1
    scopes: list  # [(begin_i, end_i)] matched BEGIN/END pairs
    wait_src: dict  # WAIT op i -> (RECORD op index, same_iteration) of the event it waits on
    pre_ns: float
    comm_ns: float
    extra: dict = field(default_factory=dict)  # MEMCPY op i -> (kind, nbytes)
    # [n] the profiler's cost of the NEXT op's records, paid at the end of this op (a traced run's
    # prologue to each op); 0 when untraced. A CPU op's own record excludes it.
    trace_ns: np.ndarray | None = None


def plan(prog, r: int, phys, stream_of, trigger: tuple | None = None, capture: str | None = None) -> HostPlan:
    """Validate and plan rank r's ops. `stream_of(sid)` returns the engine's stream object;
    `trigger`: None, or (scope names, synchronize, clock indices) of a host-triggered policy
    (`triggered_ops`); `capture`: None (untraced), or the capture that records this run ("full":
    every CPU op, annotation and runtime call; "light": runtime calls only), each record costing
    the host `phys.trace_overhead_us` before its op starts."""
    ops = prog.ops[r]
    if trigger is not None:
        ops = triggered_ops(ops, trigger[0], trigger[1], trigger[2], r)
    n = len(ops)
    nk, nc = len(prog.kernels), len(prog.collectives)
    opname = [k.op_name for k in prog.kernels]
    pre, post = phys.cpu_op_pre_us * 1e3, phys.cpu_op_post_us * 1e3
    qlat = phys.launch_queue_us * 1e3
    comm = phys.comm_op_us * 1e3
    rng_ns = {
        k: (getattr(phys, k)[0] * 1e3, (getattr(phys, k)[1] - getattr(phys, k)[0]) * 1e3) for k in JITTER_KEYS if k
    }
    code = np.zeros(n, dtype=np.int64)
    cat = np.zeros(n, dtype=np.int64)
    fixed_adv = np.zeros(n)
    adv_has_d = np.zeros(n)
    rel_fixed = np.zeros(n)
    corr_inc = np.zeros(n, dtype=np.int64)
    ext_inc = np.zeros(n, dtype=np.int64)
    names, arg, sid = [""] * n, [-1] * n, [-1] * n
    active, scopes, stack = [], [], []
    extra: dict = {}
    last_record: dict = {}
    wait_src: dict = {}
    waits_unresolved: list = []
    for i, op in enumerate(ops):
        try:
            c = int(op[0])
            if c == LAUNCH:
                kid = op[2]
                if not 0 <= kid < nk:
                    raise IndexError(f"kernel {kid} not in the kernel table ({nk})")
                name = opname[kid]
                names[i], arg[i], sid[i] = name, kid, op[1]
                cat[i] = J_LAUNCH
                fixed_adv[i] = (pre + post) if name else 0.0
                rel_fixed[i] = (pre if name else 0.0) + qlat
                active.append((i, LAUNCH, stream_of(op[1]), kid))
            elif c == CPU:
                if not op[1] >= 0:
                    raise ValueError("negative duration")
                fixed_adv[i] = float(op[1])
                names[i] = str(op[2])
            elif c == COLL:
                cidx = op[2]
                if not 0 <= cidx < nc:
                    raise IndexError(f"collective {cidx} not in the collective table ({nc})")
                if r not in prog.collectives[cidx].ranks:
                    raise ValueError(f"rank {r} is not among the collective's ranks {prog.collectives[cidx].ranks}")
                arg[i], sid[i] = cidx, op[1]
                cat[i] = J_NCCL
                fixed_adv[i] = comm
                rel_fixed[i] = 0.4 * comm + qlat
                active.append((i, COLL, stream_of(op[1]), cidx))
            elif c == RECORD:
                arg[i], sid[i] = op[1], op[2]
                cat[i] = J_RUNTIME
                last_record[op[1]] = i
                active.append((i, RECORD, stream_of(op[2]), op[1]))
            elif c == WAIT:
                arg[i], sid[i] = op[2], op[1]
                cat[i] = J_RUNTIME
                if op[2] in last_record:
                    wait_src[i] = (last_record[op[2]], True)
                else:
                    waits_unresolved.append((i, op[2]))
                active.append((i, WAIT, stream_of(op[1]), op[2]))
            elif c == MEMCPY:
                if op[2] not in ("HtoD", "DtoH", "DtoD"):
                    raise ValueError(f"memcpy kind {op[2]!r} is not HtoD, DtoH or DtoD")
                sid[i] = op[1]
                cat[i] = J_MEMCPY
                extra[i] = (op[2], float(op[3]))
                c = BLOCKING_MEMCPY if op[4] else MEMCPY
                active.append((i, c, stream_of(op[1]), extra[i]))
            elif c == SSYNC:
                sid[i] = op[1]
                cat[i] = J_RUNTIME
                active.append((i, SSYNC, stream_of(op[1]), None))
            elif c == ESYNC:
                arg[i] = op[1]
                cat[i] = J_RUNTIME
                active.append((i, ESYNC, op[1], None))
            elif c == DSYNC:
                cat[i] = J_RUNTIME
                active.append((i, DSYNC, None, None))
            elif c == ITER:
                active.append((i, ITER, None, None))
            elif c == REQUEST and trigger is not None:
                active.append((i, REQUEST, int(op[1]), None))
            elif c == BEGIN:
                names[i] = str(op[1])
                stack.append(i)
            elif c == END:
                if not stack:
                    raise ValueError("END without BEGIN")
                scopes.append((stack.pop(), i))
            else:
                raise ValueError("unknown op code")
        except (IndexError, TypeError, ValueError, KeyError) as e:
            raise ValueError(f"program {prog.name!r}: rank {r}: bad op {op!r}: {e}") from None
        code[i] = c
        if c in (LAUNCH, COLL, RECORD, WAIT, MEMCPY, BLOCKING_MEMCPY, SSYNC, ESYNC, DSYNC):
            corr_inc[i] = 1
        if c in (LAUNCH, CPU, COLL, RECORD, WAIT, MEMCPY, BLOCKING_MEMCPY, SSYNC, ESYNC, DSYNC, BEGIN):
            ext_inc[i] = 1
        if c in (LAUNCH, COLL, RECORD, WAIT, MEMCPY):
            adv_has_d[i] = 1.0
    if stack:
        raise ValueError(f"program {prog.name!r}: rank {r}: BEGIN {names[stack[-1]]!r} without END")
    for i, eid in waits_unresolved:  # waits on the previous iteration's record, if the event is ever recorded
        if eid in last_record:
            wait_src[i] = (last_record[eid], False)
    lo = np.zeros(n)
    span = np.zeros(n)
    for k in (J_LAUNCH, J_NCCL, J_RUNTIME, J_MEMCPY):
        m = cat == k
        key = JITTER_KEYS[k]
        assert key is not None  # only J_NONE has no jitter key
        lo[m], span[m] = rng_ns[key]
    corr_idx = np.cumsum(corr_inc)
    ext_idx = np.cumsum(ext_inc)
    trace_ns = None
    if capture is not None and n:
        records = corr_inc.astype(np.float64)  # every runtime call
        if capture == "full":  # and the CPU ops, annotations and collectives' records around them
            named = np.array([bool(x) for x in names]) & np.isin(code, (LAUNCH, CPU, BEGIN))
            records += named | (code == COLL)
        trace_ns = np.roll(records * phys.trace_overhead_us * 1e3, -1)  # op i+1's prologue ends op i
        fixed_adv = fixed_adv + trace_ns
    act = [(i, c, a, b, int(corr_idx[i]), int(ext_idx[i])) for i, c, a, b in active]
    return HostPlan(
        n=n,
        code=code,
        lo=lo,
        span=span,
        fixed_adv=fixed_adv,
        adv_has_d=adv_has_d,
        rel_fixed=rel_fixed,
        corr_idx=corr_idx,
        ext_idx=ext_idx,
        n_corr=int(corr_idx[-1]) if n else 0,
        n_ext=int(ext_idx[-1]) if n else 0,
        active=act,
        names=names,
        arg=arg,
        sid=sid,
        scopes=scopes,
        wait_src=wait_src,
        pre_ns=pre,
        comm_ns=comm,
        extra=extra,
        trace_ns=trace_ns,
    )


@dataclass
class IterLog:
    """What one iteration of the host did: its jitter draws, the time shift of each segment between
    blocking calls, and when each blocking call returned."""

    d: np.ndarray  # [n] runtime-call durations drawn this iteration
    cs: np.ndarray  # [n] op start offsets ignoring blocking (exclusive cumsum)
    seg_from: list  # op index from which each shift applies
    seg_shift: list  # the shifts (ns)
    block_end: dict  # op index -> time the blocking call returned


class HostLog:
    """A rank's host records, rebuilt on demand from the plan and the per-iteration logs."""

    def __init__(self, plan_: HostPlan, iters: list[IterLog], corr0: int, ext0: int):
        self.plan, self.iters, self.corr0, self.ext0 = plan_, iters, corr0, ext0
        self._built = None

    def _times(self, it: IterLog) -> np.ndarray:
        seg = np.searchsorted(np.asarray(it.seg_from), np.arange(self.plan.n), side="right") - 1
        return it.cs + np.asarray(it.seg_shift)[seg]

    def build(self):
        if self._built is not None:
            return self._built
        p = self.plan
        host, cpu_ops, annotations, comm_ops, syncs = [], [], [], [], []
        code = p.code.tolist()
        for k, it in enumerate(self.iters):
            t = self._times(it).tolist()
            d = it.d.tolist()
            cb, eb = self.corr0 + k * p.n_corr, self.ext0 + k * p.n_ext
            corr = (p.corr_idx + cb).tolist()
            ext = (p.ext_idx + eb).tolist()
            for i in range(p.n):
                c = code[i]
                if c == CPU:
                    own = p.fixed_adv[i] - (p.trace_ns[i] if p.trace_ns is not None else 0.0)
                    cpu_ops.append((p.names[i], t[i], float(own), ext[i]))
                elif c == LAUNCH:
                    name = p.names[i]
                    t_rt = t[i] + (p.pre_ns if name else 0.0)
                    host.append((0, t_rt, d[i], corr[i], ext[i], p.arg[i], t[i], name))
                elif c == COLL:
                    host.append((1, t[i] + 0.4 * p.comm_ns, d[i], corr[i], ext[i], p.arg[i], t[i], ""))
                    comm_ops.append((t[i], p.comm_ns + d[i], ext[i], p.arg[i]))
                elif c in (RECORD, WAIT, MEMCPY):
                    host.append((c, t[i], d[i], corr[i], ext[i], p.sid[i], t[i], ""))  # runtime code == op code
                    if c == WAIT:
                        rc, rs = self._record_of(i, k)
                        syncs.append((3, p.sid[i], t[i] + 1000.0, t[i] + d[i], corr[i], ext[i], rc, rs))
                elif c in (BLOCKING_MEMCPY, SSYNC, ESYNC, DSYNC):
                    t1 = it.block_end[i]
                    rt = {BLOCKING_MEMCPY: 2, SSYNC: 5, ESYNC: 6, DSYNC: 7}[c]
                    host.append((rt, t[i], t1 - t[i], corr[i], ext[i], p.sid[i] if c != ESYNC else p.arg[i], t[i], ""))
                    kind = {BLOCKING_MEMCPY: 0, SSYNC: 0, ESYNC: 1, DSYNC: 2}[c]
                    rc, rs = self._record_of_event(i, k) if c == ESYNC else (-1, -1)
                    t0 = t[i] + (d[i] if c == BLOCKING_MEMCPY else 1000.0)
                    syncs.append(
                        (
                            kind,
                            p.sid[i] if c in (SSYNC, BLOCKING_MEMCPY) else -1,
                            t0,
                            max(t0, t1 - 300.0),
                            corr[i],
                            ext[i],
                            rc,
                            rs,
                        )
                    )
            for b, e in p.scopes:
                annotations.append((p.names[b], t[b], t[e] - t[b], ext[b]))
        self._built = (host, cpu_ops, annotations, comm_ops, syncs)
        return self._built

    def _record_of(self, i: int, k: int) -> tuple[int, int]:
        src = self.plan.wait_src.get(i)
        if src is None:
            return -1, -1
        j, same = src
        kk = k if same else k - 1
        if kk < 0:
            return -1, -1
        return self.corr0 + kk * self.plan.n_corr + int(self.plan.corr_idx[j]), self.plan.sid[j]

    def _record_of_event(self, i: int, k: int) -> tuple[int, int]:
        eid = self.plan.arg[i]
        best = None
        for j in range(i - 1, -1, -1):
            if self.plan.code[j] == RECORD and self.plan.arg[j] == eid:
                best = (j, k)
                break
        if best is None:
            for j in range(self.plan.n - 1, i, -1):
                if self.plan.code[j] == RECORD and self.plan.arg[j] == eid:
                    best = (j, k - 1)
                    break
        if best is None or best[1] < 0:
            return -1, -1
        j, kk = best
        return self.corr0 + kk * self.plan.n_corr + int(self.plan.corr_idx[j]), self.plan.sid[j]
