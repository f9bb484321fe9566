"""The discrete-event core of the virtual GPU: host threads, streams, SM clocks, NCCL collectives.

Design for speed (a million kernels in seconds):
  - each rank's host thread is a generator that runs ahead through its ops without touching the
    event heap, queueing work on stream FIFOs with release times, until it blocks on a sync;
  - the heap holds only GPU-side events: kernel ends (versioned, so a clock change re-schedules the
    running kernel's end), stream wake-ups at a release time, clock-change landings, host wake-ups;
  - kernel durations come from per kernel x clock tables (lists of lists) built once with numpy;
  - energy is not integrated here: the engine records intervals (kernel segments at one clock,
    clock timeline, communication/copy intervals) that `emo.device.sim.energy` integrates with numpy.

Concurrency model (kept simple on purpose): compute kernels share the SMs, so at most one compute
kernel runs per GPU at a time; streams compete for the SMs in order of their head kernel's release
time. NCCL kernels and copies run concurrently with compute (copy engines / few SMs) without slowing
it. CUDA semantics: in-order streams, cudaEventRecord completes when prior work on its stream is
done, cudaStreamWaitEvent waits for the most recent record of the event at call time.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from emo.device.sim.program import Op, Program

# item kinds queued on a stream
K_KERNEL, K_COLL, K_COPY, K_RECORD, K_WAIT = 0, 1, 2, 3, 4
# heap event kinds
E_KEND, E_XEND, E_TRY, E_CLOCK, E_HOST = 0, 1, 2, 3, 4
# host runtime call codes (trace)
RT_LAUNCH, RT_NCCL, RT_MEMCPY, RT_RECORD, RT_WAIT, RT_SSYNC, RT_ESYNC, RT_DSYNC = range(8)
RT_NAMES = ("cudaLaunchKernel", "cudaLaunchKernel", "cudaMemcpyAsync", "cudaEventRecord",
            "cudaStreamWaitEvent", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
RT_CBID = (211, 211, 41, 135, 147, 131, 133, 165)


class _Stream:
    __slots__ = ("gpu", "sid", "q", "busy", "blocked", "sm_wait", "try_t", "drain_waiters", "rec_trace")

    def __init__(self, gpu: int, sid: int):
        self.gpu, self.sid = gpu, sid
        self.q: deque = deque()
        self.busy = False  # an item executes (or a collective waits for its peers)
        self.blocked = False  # head is a stream-wait on an unfinished event record
        self.sm_wait = False  # head is a kernel waiting for the SMs
        self.try_t = -1.0
        self.drain_waiters: list[int] = []  # ranks whose host waits for this stream to drain


class _Gpu:
    __slots__ = ("idx", "streams", "sm_busy", "sm_waiters", "run", "ver", "req_ci", "last_issue",
                 "clock_t", "clock_ci", "segs", "xsegs", "pending", "dev_waiters", "end_t")

    def __init__(self, idx: int, ci: int, last_issue: float, t0: float):
        self.idx = idx
        self.streams: dict[int, _Stream] = {}
        self.sm_busy = False
        self.sm_waiters: list[_Stream] = []
        self.run = None  # running compute kernel: [stream, kid, seg_start, frac_left, eff_ci, start, corr, ext]
        self.ver = 0
        self.req_ci = ci
        self.last_issue = last_issue
        self.clock_t = [t0]
        self.clock_ci = [ci]
        self.segs: list[tuple] = []  # compute-kernel segments ended by a clock change: (t0, t1, kid, eff_ci, req_ci)
        self.xsegs: list[tuple] = []  # extra power intervals: (t0, t1, watts)
        self.pending = 0  # items queued or running on any stream
        self.dev_waiters: list[int] = []
        self.end_t = t0  # when its last item finished


@dataclass
class RankRecord:
    """What one rank did: everything the trace writer and the meters need."""

    host: list = field(default_factory=list)  # runtime calls: (rt_code, t0, dur, corr, ext, arg, cpu_op t0, cpu_op name)
    cpu_ops: list = field(default_factory=list)  # (name, t0, dur, ext)
    annotations: list = field(default_factory=list)  # (name, t0, dur, ext)  user_annotation
    comm_ops: list = field(default_factory=list)  # (t0, dur, ext, coll_idx)  record_param_comms
    kernels: list = field(default_factory=list)  # (corr, kid, sid, t0, t1, ext, seg_t0, eff_ci, req_ci)
    colls: list = field(default_factory=list)  # (corr, coll_idx, sid, t0, t1, ext)
    copies: list = field(default_factory=list)  # (corr, kind, nbytes, sid, t0, t1, ext)
    syncs: list = field(default_factory=list)  # (kind, sid, t0, t1, corr, ext, rec_corr, rec_sid)
    iter_t: list = field(default_factory=list)  # host time of each ITER
    host_end: float = 0.0
    gpu_end: float = 0.0


@dataclass
class SimResult:
    ranks: list[RankRecord]
    gpus: list[_Gpu]
    t_start: float
    t_end: float
    kernel_count: int


class Engine:
    """Runs `iterations` repetitions of a program from virtual time `t_start` (ns)."""

    def __init__(self, program: Program, *, dur: list[list[float]], thr: list[list[int]],
                 phys, gphys, clock_ci: list[int], last_issue: list[float], t_start: float,
                 iterations: int, policy_steps: dict[int, list[tuple[float, int]]] | None,
                 lead_ns: float, rng: np.random.Generator, coll_ns):
        self.prog = program
        self.dur, self.thr = dur, thr
        self.phys, self.gphys = phys, gphys
        self.iterations = iterations
        self.t_start = t_start
        self.policy = policy_steps or {}
        self.lead_ns = lead_ns
        self.rng = rng
        self.coll_ns = coll_ns  # (coll_idx, ci) -> ns
        n = program.ranks
        self.gpus = [_Gpu(g, clock_ci[g], last_issue[g], t_start) for g in range(n)]
        self.ranks = [RankRecord() for _ in range(n)]
        self.heap: list = []
        self.cnt = itertools.count()
        self.wake = [t_start] * n
        self.colls: dict = {}
        self.spin_w = [gphys.comm_spin_w(c) for c in range(len(gphys.clocks))]
        self.clocks = gphys.clocks.tolist()
        ranges = {}
        for key in ("launch_us", "nccl_launch_us", "runtime_call_us", "memcpy_call_us"):
            lo, hi = getattr(phys, key)
            ranges[key] = (rng.uniform(lo, hi, 4096) * 1e3).tolist()
        self.jit = ranges

    # ------------------------------------------------------------------ helpers
    def _push(self, t, kind, a, b=None):
        heapq.heappush(self.heap, (t, next(self.cnt), kind, a, b))

    def _stream(self, g: _Gpu, sid: int) -> _Stream:
        st = g.streams.get(sid)
        if st is None:
            st = g.streams[sid] = _Stream(g.idx, sid)
        return st

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        hosts = [self._host(r) for r in range(self.prog.ranks)]
        self.hosts = hosts
        done = [False] * len(hosts)
        for r in range(len(hosts)):
            self._push(self.t_start, E_HOST, r)
        heap = self.heap
        pop = heapq.heappop
        hpush = heapq.heappush
        cnt = self.cnt
        gpus = self.gpus
        dur, thr = self.dur, self.thr
        kernel_lists = [rec.kernels for rec in self.ranks]
        while heap:
            t, _, kind, a, b = pop(heap)
            if kind == E_KEND:
                g = gpus[a]
                if b != g.ver:
                    continue  # re-scheduled by a clock change
                run = g.run
                st = run[0]
                # (corr, kid, sid, start, end, ext, last-segment start, its clock, requested clock)
                kernel_lists[a].append((run[6], run[1], st.sid, run[5], t, run[7], run[2], run[4], g.req_ci))
                g.end_t = t
                q = st.q
                q.popleft()
                g.pending -= 1
                if q and not g.sm_waiters:
                    item = q[0]
                    if item[0] == 0 and item[1] <= t:
                        # fast path: the stream's next kernel is already queued and the SMs are free
                        kid = item[3]
                        eff = thr[kid][g.req_ci]
                        g.run = [st, kid, t, 1.0, eff, t, item[2], item[4]]
                        g.ver += 1
                        hpush(heap, (t + dur[kid][eff], next(cnt), 0, a, g.ver))
                        continue
                g.run = None
                g.sm_busy = False
                st.busy = False
                self._sm_free(g, st, t)
            elif kind == E_XEND:
                st = a
                st.q.popleft()
                st.busy = False
                g = gpus[st.gpu]
                g.pending -= 1
                g.end_t = t
                self._advance(st, t)
                self._check_drain(g, st, t)
            elif kind == E_TRY:
                a.try_t = -1.0
                self._advance(a, t)
            elif kind == E_CLOCK:
                self._clock(gpus[a], t, b[0], b[1])
            else:  # E_HOST
                self.wake[a] = t
                try:
                    next(hosts[a])
                except StopIteration:
                    done[a] = True
        if not all(done):
            stuck = [r for r, d in enumerate(done) if not d]
            raise ValueError(f"program {self.prog.name!r}: ranks {stuck} never finish (a collective misses a "
                             f"participant, or a sync waits for work that is never launched)")
        for g in gpus:
            if g.pending:
                raise ValueError(f"program {self.prog.name!r}: GPU {g.idx} still has {g.pending} unfinished items "
                                 f"(a collective misses a participant?)")
        t_end = self.t_start
        for rec, g in zip(self.ranks, gpus):
            rec.gpu_end = max(rec.host_end, g.end_t)
            t_end = max(t_end, rec.gpu_end)
        return SimResult(self.ranks, gpus, self.t_start, t_end, sum(len(k) for k in kernel_lists))

    # ------------------------------------------------------------------ GPU side
    def _advance(self, st: _Stream, now: float) -> None:
        """Start whatever the head of `st` allows at time `now`."""
        q = st.q
        g = self.gpus[st.gpu]
        while q:
            if st.busy or st.blocked or st.sm_wait:
                return
            item = q[0]
            rel = item[1]
            if rel > now:
                if st.try_t != rel:
                    st.try_t = rel
                    self._push(rel, E_TRY, st)
                return
            kind = item[0]
            if kind == K_KERNEL:
                if g.sm_busy:
                    st.sm_wait = True
                    g.sm_waiters.append(st)
                    return
                self._start_kernel(g, st, item, now)
                return
            if kind == K_RECORD:
                rec = item[2]
                rec[0] = now
                q.popleft()
                g.pending -= 1
                waiters = rec[1]
                rec[1] = None
                for w in waiters:
                    if isinstance(w, int):  # a host in cudaEventSynchronize
                        self._push(now, E_HOST, w)
                    else:
                        w.blocked = False
                        w.q.popleft()  # the stream-wait item
                        g2 = self.gpus[w.gpu]
                        g2.pending -= 1
                        self._advance(w, now)
                continue
            if kind == K_WAIT:
                rec = item[2]
                if rec is not None and rec[0] is None:
                    st.blocked = True
                    rec[1].append(st)
                    return
                q.popleft()
                g.pending -= 1
                continue
            st.busy = True
            if kind == K_COLL:
                self._arrive(g, st, item, now)
            else:  # K_COPY
                end = now + self.gphys.memcpy_ns(item[3], item[4])
                self.ranks[g.idx].copies.append((item[2], item[3], item[4], st.sid, now, end, item[5]))
                g.xsegs.append((now, end, self.phys.copy_w))
                self._push(end, E_XEND, st)
            return
        self._check_drain(g, st, now)

    def _start_kernel(self, g: _Gpu, st: _Stream, item, now: float) -> None:
        kid = item[3]
        eff = self.thr[kid][g.req_ci]
        end = now + self.dur[kid][eff]
        g.sm_busy = True
        st.busy = True
        g.run = [st, kid, now, 1.0, eff, now, item[2], item[4]]
        g.ver += 1
        heapq.heappush(self.heap, (end, next(self.cnt), E_KEND, g.idx, g.ver))

    def _sm_free(self, g: _Gpu, st: _Stream, now: float) -> None:
        """The SMs became free at `now`: give them to the earliest-released waiting kernel."""
        waiters = g.sm_waiters
        if waiters:
            best = min(waiters, key=lambda s: s.q[0][1])
            own = st.q[0] if st.q else None
            if own is None or own[0] != K_KERNEL or own[1] > now or own[1] > best.q[0][1]:
                waiters.remove(best)
                best.sm_wait = False
                self._advance(best, now)
        self._advance(st, now)
        self._check_drain(g, st, now)

    def _check_drain(self, g: _Gpu, st: _Stream, now: float) -> None:
        if st.drain_waiters and not st.q and not st.busy:
            for r in st.drain_waiters:
                self._push(now, E_HOST, r)
            st.drain_waiters = []
        if g.dev_waiters and g.pending == 0:
            for r in g.dev_waiters:
                self._push(now, E_HOST, r)
            g.dev_waiters = []

    def _arrive(self, g: _Gpu, st: _Stream, item, now: float) -> None:
        """An NCCL kernel reached the GPU; the collective completes when all participants have."""
        key = item[3]
        cidx = key[1]
        spec = self.prog.collectives[cidx]
        entry = self.colls.get(key)
        if entry is None:
            entry = self.colls[key] = []
        entry.append((g, st, item, now))
        if len(entry) < len(spec.ranks):
            return
        del self.colls[key]
        last = max(e[3] for e in entry)
        ci = min(e[0].req_ci for e in entry)  # the slowest SM clock paces the ring
        ck = (cidx, ci)
        xfer = self.coll_ns.get(ck)
        if xfer is None:
            xfer = self.coll_ns[ck] = self.gphys.collective_ns(spec, self.clocks[ci])
        end = last + xfer
        link_w = self.phys.comm_link_w
        for pg, pst, pitem, arr in entry:
            spin = self.spin_w[pg.req_ci]
            if last > arr:
                pg.xsegs.append((arr, last, spin))
            pg.xsegs.append((last, end, spin + link_w))
            self.ranks[pg.idx].colls.append((pitem[2], cidx, pst.sid, arr, end, pitem[4]))
            self._push(end, E_XEND, pst)

    def _clock(self, g: _Gpu, t: float, ci: int, issue: float) -> None:
        """A clock request lands: the last one issued wins; a running kernel continues at the new rate."""
        if issue < g.last_issue:
            return
        g.last_issue = issue
        if ci == g.req_ci:
            return
        old_req = g.req_ci
        g.req_ci = ci
        g.clock_t.append(t)
        g.clock_ci.append(ci)
        run = g.run
        if run is None:
            return
        kid, eff = run[1], run[4]
        new_eff = self.thr[kid][ci]
        d_old = self.dur[kid][eff]
        run[3] -= (t - run[2]) / d_old
        g.segs.append((run[2], t, kid, eff, old_req))
        run[2] = t
        run[4] = new_eff
        g.ver += 1
        self._push(t + max(run[3], 0.0) * self.dur[kid][new_eff], E_KEND, g.idx, g.ver)

    # ------------------------------------------------------------------ host side
    def _compile(self, r: int) -> list[tuple]:
        """Rank r's ops with plain-int codes and resolved streams/names, validated once per run."""
        prog = self.prog
        g = self.gpus[r]
        opname = [k.op_name for k in prog.kernels]
        nk, nc = len(prog.kernels), len(prog.collectives)
        out = []
        for op in prog.ops[r]:
            try:
                code = int(op[0])
                if code == 1:
                    if not 0 <= op[2] < nk:
                        raise IndexError(f"kernel {op[2]} not in the kernel table ({nk})")
                    out.append((1, self._stream(g, op[1]), op[2], opname[op[2]]))
                elif code == 0:
                    if op[1] < 0:
                        raise ValueError("negative duration")
                    out.append((0, float(op[1]), op[2]))
                elif code == 8:
                    if not 0 <= op[2] < nc:
                        raise IndexError(f"collective {op[2]} not in the collective table ({nc})")
                    if r not in prog.collectives[op[2]].ranks:
                        raise ValueError(f"rank {r} is not among the collective's ranks {prog.collectives[op[2]].ranks}")
                    out.append((8, self._stream(g, op[1]), op[2]))
                elif code == 3:
                    out.append((3, op[1], self._stream(g, op[2])))
                elif code == 4:
                    out.append((4, self._stream(g, op[1]), op[2]))
                elif code == 2:
                    if op[2] not in ("HtoD", "DtoH", "DtoD"):
                        raise ValueError(f"memcpy kind {op[2]!r} is not HtoD, DtoH or DtoD")
                    out.append((2, self._stream(g, op[1]), op[2], float(op[3]), bool(op[4])))
                elif code == 5:
                    out.append((5, self._stream(g, op[1])))
                elif code in (6, 10):
                    out.append((code, op[1]))
                elif code in (7, 9, 11):
                    out.append((code,))
                else:
                    raise ValueError("unknown op code")
            except (IndexError, TypeError, ValueError, KeyError) as e:
                raise ValueError(f"program {prog.name!r}: rank {r}: bad op {op!r}: {e}") from None
        return out

    def _host(self, r: int):
        """Rank r's host thread: runs ahead through its ops; yields when it blocks on a sync."""
        prog = self.prog
        ops = self._compile(r)
        g = self.gpus[r]
        rec = self.ranks[r]
        host_app, cpu_app, ann_app, sync_app = rec.host.append, rec.cpu_ops.append, rec.annotations.append, rec.syncs.append
        comm_app = rec.comm_ops.append
        phys = self.phys
        pre, post = phys.cpu_op_pre_us * 1e3, phys.cpu_op_post_us * 1e3
        qlat = phys.launch_queue_us * 1e3
        comm_op = phys.comm_op_us * 1e3
        jl, jn, jr, jm = (self.jit["launch_us"], self.jit["nccl_launch_us"], self.jit["runtime_call_us"],
                          self.jit["memcpy_call_us"])
        heap = self.heap
        cnt = self.cnt
        hpush = heapq.heappush
        steps = self.policy.get(r, [])
        lead = self.lead_ns
        rng = self.rng
        dlo, dhi = phys.clock_delay_ms
        events: dict[int, list] = {}  # event id -> its latest record [done_t, waiters, corr, sid]
        scopes: list = []
        t = self.wake[r]
        corr = 0  # correlation ids (unique within a rank: one trace file per rank)
        ext = 0
        j = 0
        for it in range(self.iterations):
            for op in ops:
                code = op[0]
                if code == 1:  # LAUNCH: [cpu_op [cudaLaunchKernel] ]
                    name = op[3]
                    t0 = t
                    if name:
                        t += pre
                    d = jl[j & 4095]
                    j += 1
                    corr += 1
                    # (code, runtime start, dur, corr, ext, kernel, cpu_op start, cpu_op name)
                    host_app((0, t, d, corr, ext, op[2], t0, name))
                    t += d
                    st = op[1]
                    g.pending += 1
                    q = st.q
                    if not q and not st.busy:
                        hpush(heap, (t + qlat, next(cnt), 2, st, None))  # E_TRY: the stream was idle
                    q.append((0, t + qlat, corr, op[2], ext))
                    if name:
                        t += post
                    ext += 1
                elif code == 0:  # CPU
                    cpu_app((op[2], t, op[1], ext))
                    ext += 1
                    t += op[1]
                elif code == 3:  # RECORD
                    d = jr[j & 4095]
                    j += 1
                    corr += 1
                    st = op[2]
                    host_app((3, t, d, corr, ext, st.sid, t, ""))
                    er = [None, [], corr, st.sid]
                    events[op[1]] = er
                    g.pending += 1
                    if not st.q and not st.busy:
                        hpush(heap, (t + d, next(cnt), 2, st, None))
                    st.q.append((3, t + d, er))
                    t += d
                    ext += 1
                elif code == 4:  # WAIT
                    d = jr[j & 4095]
                    j += 1
                    corr += 1
                    st = op[1]
                    host_app((4, t, d, corr, ext, st.sid, t, ""))
                    g.pending += 1
                    er = events.get(op[2])
                    if not st.q and not st.busy:
                        hpush(heap, (t + d, next(cnt), 2, st, None))
                    st.q.append((4, t + d, er, corr, ext))
                    sync_app((3, st.sid, t + 1000.0, t + d, corr, ext, er[2] if er else -1, er[3] if er else -1))
                    t += d
                    ext += 1
                elif code == 8:  # COLLECTIVE: [record_param_comms [nccl:* [cudaLaunchKernel]]]
                    st, cidx = op[1], op[2]
                    t0 = t
                    t += comm_op * 0.4
                    d = jn[j & 4095]
                    j += 1
                    corr += 1
                    host_app((1, t, d, corr, ext, cidx, t, ""))
                    t += d
                    g.pending += 1
                    if not st.q and not st.busy:
                        hpush(heap, (t + qlat, next(cnt), 2, st, None))
                    st.q.append((1, t + qlat, corr, (it, cidx), ext))
                    t += comm_op * 0.6
                    comm_app((t0, t - t0, ext, cidx))
                    ext += 1
                elif code == 2:  # MEMCPY
                    st, kind, nbytes, blocking = op[1], op[2], op[3], op[4]
                    d = jm[j & 4095]
                    j += 1
                    corr += 1
                    t0 = t
                    g.pending += 1
                    if not st.q and not st.busy:
                        hpush(heap, (t + d, next(cnt), 2, st, None))
                    st.q.append((2, t + d, corr, kind, nbytes, ext))
                    t += d
                    if blocking:
                        st.drain_waiters.append(r)
                        yield
                        t = max(t, self.wake[r]) + jr[j & 4095]
                        j += 1
                        sync_app((0, st.sid, t0 + d, t - 500.0, corr, ext, -1, -1))
                    host_app((2, t0, t - t0, corr, ext, st.sid, t0, ""))
                    ext += 1
                elif code == 5:  # STREAM_SYNC
                    st = op[1]
                    corr += 1
                    t0 = t
                    if st.q or st.busy:
                        st.drain_waiters.append(r)
                        yield
                        t = max(t, self.wake[r])
                    t += jr[j & 4095]
                    j += 1
                    sync_app((0, st.sid, t0 + 1000.0, t - 300.0, corr, ext, -1, -1))
                    host_app((5, t0, t - t0, corr, ext, st.sid, t0, ""))
                    ext += 1
                elif code == 6:  # EVENT_SYNC
                    corr += 1
                    t0 = t
                    er = events.get(op[1])
                    if er is not None and er[0] is None:
                        er[1].append(r)
                        yield
                        t = max(t, self.wake[r])
                    elif er is not None:
                        t = max(t, er[0])
                    t += jr[j & 4095]
                    j += 1
                    sync_app((1, -1, t0 + 1000.0, t - 300.0, corr, ext, er[2] if er else -1, er[3] if er else -1))
                    host_app((6, t0, t - t0, corr, ext, op[1], t0, ""))
                    ext += 1
                elif code == 7:  # DEVICE_SYNC
                    corr += 1
                    t0 = t
                    if g.pending:
                        g.dev_waiters.append(r)
                        yield
                        t = max(t, self.wake[r])
                    t += jr[j & 4095]
                    j += 1
                    sync_app((2, -1, t0 + 1000.0, t - 300.0, corr, ext, -1, -1))
                    host_app((7, t0, t - t0, corr, ext, -1, t0, ""))
                    ext += 1
                elif code == 9:  # ITER: the policy's t = 0; requests land 5-15 ms after they are issued
                    rec.iter_t.append(t)
                    for t_ms, ci in steps:
                        issue = max(t, t + t_ms * 1e6 - lead)
                        hpush(heap, (issue + rng.uniform(dlo, dhi) * 1e6, next(cnt), 3, r, (ci, issue)))
                elif code == 10:  # BEGIN
                    scopes.append((op[1], t, ext))
                    ext += 1
                else:  # END
                    if not scopes:
                        raise ValueError(f"program {prog.name!r}: rank {r}: END without BEGIN")
                    name, t0, e = scopes.pop()
                    ann_app((name, t0, t - t0, e))
        if scopes:
            raise ValueError(f"program {prog.name!r}: rank {r}: BEGIN {scopes[-1][0]!r} without END")
        rec.host_end = t
