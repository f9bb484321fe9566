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

from emo.device.sim import hostplan
from emo.device.sim.program import Program

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
    __slots__ = ("gpu", "sid", "q", "busy", "blocked", "sm_wait", "try_t", "drain_waiters")

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

    kernels: list = field(default_factory=list)  # (corr, kid, sid, t0, t1, ext, seg_t0, eff_ci, req_ci)
    colls: list = field(default_factory=list)  # (corr, coll_idx, sid, t0, t1, ext)
    copies: list = field(default_factory=list)  # (corr, kind, nbytes, sid, t0, t1, ext)
    iter_t: list = field(default_factory=list)  # host time of each ITER
    host_end: float = 0.0
    gpu_end: float = 0.0
    log: object = None  # hostplan.HostLog: the host's records, rebuilt on demand

    @property
    def host(self) -> list:
        """Runtime calls: (rt_code, t0, dur, corr, ext, arg, cpu_op t0, cpu_op name)."""
        return self.log.build()[0]

    @property
    def cpu_ops(self) -> list:  # (name, t0, dur, ext)
        return self.log.build()[1]

    @property
    def annotations(self) -> list:  # user_annotation scopes: (name, t0, dur, ext)
        return self.log.build()[2]

    @property
    def comm_ops(self) -> list:  # record_param_comms: (t0, dur, ext, coll_idx)
        return self.log.build()[3]

    @property
    def syncs(self) -> list:  # cuda_sync: (kind, sid, t0, t1, corr, ext, rec_corr, rec_sid)
        return self.log.build()[4]


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
                 iterations: int, policy_plan: dict[int, tuple[int | None, list[tuple[float, int]]]] | None,
                 rng: np.random.Generator, coll_ns):
        self.prog = program
        self.dur, self.thr = dur, thr
        self.phys, self.gphys = phys, gphys
        self.iterations = iterations
        self.t_start = t_start
        # per GPU: (clock to request at the very first iteration mark or None, [(issue offset ns, clock)])
        self.policy = policy_plan or {}
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
                ci, issue, k_it = b
                marks = self.ranks[a].iter_t
                if 0 <= k_it < len(marks) - 1 and marks[k_it + 1] <= issue:
                    continue  # the next iteration began before this was issued: the applier dropped it
                if done[a] and issue > self.ranks[a].host_end:
                    continue  # the program had ended: the applier was closed
                self._clock(gpus[a], t, ci, issue)
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
        if len({e[0].idx for e in entry}) != len(entry):
            raise ValueError(f"program {self.prog.name!r}: collective {cidx} launched twice by one rank in "
                             f"iteration {key[0]} (collective ids are per iteration: one launch per participant)")
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
    def _host(self, r: int):
        """Rank r's host thread: runs ahead through its ops; yields when it blocks on a sync.
        Only ops that queue GPU work or block are visited; host times come from a numpy plan."""
        g = self.gpus[r]
        rec = self.ranks[r]
        p = hostplan.plan(self.prog, r, self.phys, lambda sid: self._stream(g, sid))
        iters: list = []
        rec.log = hostplan.HostLog(p, iters, 0, 0)
        heap, cnt, hpush = self.heap, self.cnt, heapq.heappush
        first_ci, issues = self.policy.get(r, (None, []))
        rng = self.rng
        dlo, dhi = self.phys.clock_delay_ms
        iter_app = rec.iter_t.append
        events: dict = {}  # event id -> its latest record [done_t, waiters, corr, sid]
        act = p.active
        n = p.n
        idx = np.array([a[0] for a in act], dtype=np.int64)
        rel_fixed = p.rel_fixed[idx]
        t = self.wake[r]
        for it in range(self.iterations):
            d = p.lo + p.span * rng.random(n)
            adv = p.fixed_adv + p.adv_has_d * d
            csum = np.cumsum(adv)
            cs = csum - adv  # start offset of each op, ignoring blocking
            end_off = float(csum[-1]) if n else 0.0
            cs_a = cs[idx]
            ti_l = cs_a.tolist()
            rel_l = (cs_a + rel_fixed + d[idx]).tolist()
            d_l = d[idx].tolist()
            cb, eb = it * p.n_corr, it * p.n_ext
            shift = t
            seg_from, seg_shift, block_end = [0], [shift], {}
            for (i, c, a, b, ci, ei), ti, rel, di in zip(act, ti_l, rel_l, d_l):
                if c == 1:  # LAUNCH
                    rel += shift
                    g.pending += 1
                    if not a.q and not a.busy:
                        hpush(heap, (rel, next(cnt), 2, a, None))  # E_TRY: the stream was idle
                    a.q.append((0, rel, cb + ci, b, eb + ei))
                elif c == 3:  # RECORD
                    rel += shift
                    er = [None, [], cb + ci, a.sid]
                    events[b] = er
                    g.pending += 1
                    if not a.q and not a.busy:
                        hpush(heap, (rel, next(cnt), 2, a, None))
                    a.q.append((3, rel, er))
                elif c == 4:  # WAIT
                    rel += shift
                    g.pending += 1
                    if not a.q and not a.busy:
                        hpush(heap, (rel, next(cnt), 2, a, None))
                    a.q.append((4, rel, events.get(b), cb + ci, eb + ei))
                elif c == 8:  # COLLECTIVE
                    rel += shift
                    g.pending += 1
                    if not a.q and not a.busy:
                        hpush(heap, (rel, next(cnt), 2, a, None))
                    a.q.append((1, rel, cb + ci, (it, b), eb + ei))
                elif c == 2:  # MEMCPY (async)
                    rel += shift
                    g.pending += 1
                    if not a.q and not a.busy:
                        hpush(heap, (rel, next(cnt), 2, a, None))
                    a.q.append((2, rel, cb + ci, b[0], b[1], eb + ei))
                elif c == 9:  # ITER: the policy's t = 0, applied as emo.runtime's applier does
                    t_it = ti + shift
                    k_it = len(rec.iter_t)
                    iter_app(t_it)
                    if first_ci is not None:  # the applier's very first mark: the first step's clock now
                        hpush(heap, (t_it + rng.uniform(dlo, dhi) * 1e6, next(cnt), 3, r, (first_ci, t_it, -1)))
                        first_ci = None
                    for at, ci_ in issues:  # each lands 5-15 ms after it is issued
                        issue = t_it + at
                        hpush(heap, (issue + rng.uniform(dlo, dhi) * 1e6, next(cnt), 3, r, (ci_, issue, k_it)))
                else:  # blocking: cudaMemcpy, stream / event / device synchronize
                    t0 = ti + shift
                    ready = t0
                    if c == hostplan.BLOCKING_MEMCPY:
                        g.pending += 1
                        if not a.q and not a.busy:
                            hpush(heap, (t0 + di, next(cnt), 2, a, None))
                        a.q.append((2, t0 + di, cb + ci, b[0], b[1], eb + ei))
                        ready = t0 + di
                        a.drain_waiters.append(r)
                        yield
                        t1 = max(ready, self.wake[r]) + 0.5 * di
                    elif c == 5:  # STREAM_SYNC
                        if a.q or a.busy:
                            a.drain_waiters.append(r)
                            yield
                            ready = max(ready, self.wake[r])
                        t1 = ready + di
                    elif c == 6:  # EVENT_SYNC
                        er = events.get(a)
                        if er is not None and er[0] is None:
                            er[1].append(r)
                            yield
                            ready = max(ready, self.wake[r])
                        elif er is not None:
                            ready = max(ready, er[0])
                        t1 = ready + di
                    else:  # DEVICE_SYNC
                        if g.pending:
                            g.dev_waiters.append(r)
                            yield
                            ready = max(ready, self.wake[r])
                        t1 = ready + di
                    block_end[i] = t1
                    shift = t1 - ti  # the next op starts when the call returns
                    seg_from.append(i + 1)
                    seg_shift.append(shift)
            t = end_off + shift
            iters.append(hostplan.IterLog(d, cs, seg_from, seg_shift, block_end))
        rec.host_end = t
