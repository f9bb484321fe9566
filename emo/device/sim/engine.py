"""The discrete-event core of the virtual GPU: host threads, streams, SM clocks, NCCL collectives.

Design for speed (a million kernels in seconds):
  - each rank's host thread is a generator that runs ahead through its ops without touching the
    event heap, queueing work on stream FIFOs with release times, until it blocks on a sync;
  - the heap holds only GPU-side events: kernel ends (versioned, so a clock change re-schedules the
    running kernel's end), stream wake-ups at a release time, clock-change landings, host wake-ups;
  - kernel durations come from per kernel x clock tables (lists of lists) built once with numpy;
  - energy is not integrated here: the engine records intervals (kernel segments at one clock,
    clock timeline, communication/copy intervals) that `emo.device.sim.energy` integrates with numpy.

Concurrency model: compute kernels share the SMs, so at most one compute kernel runs per GPU at a
time; streams compete for the SMs in order of their head kernel's release time. NCCL kernels run
beside compute and contend with it while they transfer: the compute kernel loses the SMs the NCCL
channels occupy and part of the HBM bandwidth (`slow` table), and the transfer is slowed by the
compute kernel's own HBM traffic (`cslow` table). Copies use the copy engines and do not contend.
Anything running progresses at its current rate: a clock change, a power-controller step or
contention starting or stopping re-rates the running kernel and every transfer in flight (the
fraction of work left is kept). CUDA semantics: in-order streams, cudaEventRecord completes when
prior work on its stream is done, cudaStreamWaitEvent waits for the most recent record at call time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from emo.device.sim import hostplan
from emo.workloads.program import Program

# item kinds queued on a stream
K_KERNEL, K_COLL, K_COPY, K_RECORD, K_WAIT = 0, 1, 2, 3, 4
# heap event kinds
E_KEND, E_XEND, E_TRY, E_CLOCK, E_HOST, E_CEND, E_POWER = 0, 1, 2, 3, 4, 5, 6
# host runtime call codes (trace)
RT_LAUNCH, RT_NCCL, RT_MEMCPY, RT_RECORD, RT_WAIT, RT_SSYNC, RT_ESYNC, RT_DSYNC = range(8)
RT_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernel",
    "cudaMemcpyAsync",
    "cudaEventRecord",
    "cudaStreamWaitEvent",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
)
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
    __slots__ = (
        "idx",
        "streams",
        "sm_busy",
        "sm_waiters",
        "run",
        "ver",
        "req_ci",
        "last_issue",
        "clock_t",
        "clock_ci",
        "segs",
        "xsegs",
        "pending",
        "dev_waiters",
        "end_t",
        "cap_ci",
        "xfers",
        "p_avg",
        "p_acc",
        "p_t",
        "cs",
    )

    def __init__(self, idx: int, ci: int, last_issue: float, t0: float, cap_ci: int = 1 << 30, p_avg: float = 0.0):
        self.idx = idx
        self.streams: dict[int, _Stream] = {}
        self.sm_busy = False
        self.sm_waiters: list[_Stream] = []
        # running compute kernel: [stream, kid, seg_start, frac_left, eff_ci, start, corr, ext, jitter,
        # progress_t (when frac_left was last updated), its full duration at the current rate]
        self.run: list | None = None
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
        self.cap_ci = cap_ci  # the power controller's clock ceiling (effective clock = min(req, cap))
        self.xfers: list = []  # collective transfers in flight that this GPU takes part in
        self.p_avg = p_avg  # the power controller's averaged power (W)
        self.p_acc = 0.0  # energy above idle of compute segments since p_t (W*ns)
        self.p_t = t0
        self.cs = 1.0  # how much its running kernel slows a transfer (cslow), kept while transfers run


@dataclass
class RankRecord:
    """What one rank did: everything the trace writer and the meters need."""

    kernels: list = field(default_factory=list)  # (corr, kid, sid, t0, t1, ext, seg_t0, eff_ci, req_ci)
    colls: list = field(default_factory=list)  # (corr, coll_idx, sid, t0, t1, ext)
    copies: list = field(default_factory=list)  # (corr, kind, nbytes, sid, t0, t1, ext)
    iter_t: list = field(default_factory=list)  # host time of each ITER
    host_end: float = 0.0
    gpu_end: float = 0.0
    log: hostplan.HostLog | None = None  # hostplan.HostLog: the host's records, rebuilt on demand

    @property
    def host(self) -> list:
        """Runtime calls: (rt_code, t0, dur, corr, ext, arg, cpu_op t0, cpu_op name)."""
        assert self.log is not None  # set by the engine before any reader asks
        return self.log.build()[0]

    @property
    def cpu_ops(self) -> list:  # (name, t0, dur, ext)
        assert self.log is not None  # set by the engine before any reader asks
        return self.log.build()[1]

    @property
    def annotations(self) -> list:  # user_annotation scopes: (name, t0, dur, ext)
        assert self.log is not None  # set by the engine before any reader asks
        return self.log.build()[2]

    @property
    def comm_ops(self) -> list:  # record_param_comms: (t0, dur, ext, coll_idx)
        assert self.log is not None  # set by the engine before any reader asks
        return self.log.build()[3]

    @property
    def syncs(self) -> list:  # cuda_sync: (kind, sid, t0, t1, corr, ext, rec_corr, rec_sid)
        assert self.log is not None  # set by the engine before any reader asks
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

    def __init__(
        self,
        program: Program,
        *,
        dur: list[list[float]],
        slow: list[list[float]],
        cslow: list[list[float]],
        phys,
        gphys,
        clock_ci: list[int],
        last_issue: list[float],
        t_start: float,
        iterations: int,
        policy_plan: dict[int, tuple[int | None, list[tuple[float, int]]]] | None,
        rng: np.random.Generator,
        coll_ns,
        noise: float = 0.0,
        power: tuple | None = None,
        cap_ci: list[int] | None = None,
        p_avg: list[float] | None = None,
        trigger: tuple[frozenset[str], bool, dict[int, list[int]]] | None = None,
        capture: str | None = None,
    ):
        """dur[kid][ci]: kernel time alone; slow/cslow[kid][ci]: the factor by which a kernel is slowed
        by a transfer in flight / slows one; noise: the multiplier of the physics' noise sizes;
        power: None (no cap binds) or (cap_w, kernel power [gpu][kid][ci], idle power [gpu][ci], thermal)
        for the power controller, whose state (clock ceiling, averaged power) cap_ci/p_avg carry across
        runs; thermal: None or (leakage [gpu][ci], die temperature above idle [gpu] at the start): the
        controller reads board power as the sensor does, leakage rising with temperature included;
        trigger: None, or a host-triggered policy's (scope names, synchronize, {gpu: clock index of
        each step}) (emo.policy.Trigger): a GPU listed there is requested its i-th clock when its
        host enters its i-th matching scope, after a device synchronize when synchronize is set;
        capture: None (untraced) or the capture recording the run, whose records cost host time
        (emo.device.sim.hostplan.plan)."""
        self.prog = program
        self.dur, self.slow, self.cslow = dur, slow, cslow
        self.noise = noise
        self.power = power
        self.phys, self.gphys = phys, gphys
        self.iterations = iterations
        self.t_start = t_start
        # per GPU: (clock to request at the very first iteration mark or None, [(issue offset ns, clock)])
        self.policy = policy_plan or {}
        self.trigger = trigger
        self.capture = capture
        self.rng = rng
        self.coll_ns = coll_ns  # (coll_idx, ci) -> ns
        n = program.ranks
        top = len(gphys.clocks) - 1
        cap_ci = cap_ci or [top] * n
        p_avg = p_avg or [0.0] * n
        self.gpus = [
            _Gpu(g, clock_ci[g], last_issue[g], t_start, cap_ci[g] if power else top, p_avg[g]) for g in range(n)
        ]
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
        self.done = done
        for r in range(len(hosts)):
            self._push(self.t_start, E_HOST, r)
        self.p_live = 0  # power-controller ticks in the heap: they alone do not keep the run going
        if self.power is not None:
            period = self.phys.power_period_ms * 1e6
            for g in self.gpus:
                self._push(self.t_start + period, E_POWER, g.idx)
                self.p_live += 1
        heap = self.heap
        pop = heapq.heappop
        hpush = heapq.heappush
        cnt = self.cnt
        gpus = self.gpus
        dur = self.dur
        pc = self.power is not None
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
                if pc:
                    self._power_acc(g, run, t)
                g.end_t = t
                q = st.q
                q.popleft()
                g.pending -= 1
                if q and not g.sm_waiters:
                    item = q[0]
                    if item[0] == 0 and item[1] <= t:
                        # fast path: the stream's next kernel is already queued and the SMs are free
                        kid = item[3]
                        eff = g.req_ci if g.req_ci < g.cap_ci else g.cap_ci
                        d = dur[kid][eff] * item[5]
                        if g.xfers:
                            d *= self.slow[kid][eff]
                        g.run = [st, kid, t, 1.0, eff, t, item[2], item[4], item[5], t, d]
                        g.ver += 1
                        hpush(heap, (t + d, next(cnt), 0, a, g.ver))
                        if g.xfers:
                            self._rerate_xfers(g, t)
                        continue
                g.run = None
                g.sm_busy = False
                st.busy = False
                if g.xfers:
                    self._rerate_xfers(g, t)
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
            elif kind == E_CEND:
                if b == a[4]:
                    self._xfer_done(a, t)
            elif kind == E_POWER:
                self._power_tick(gpus[a], t)
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
            raise ValueError(
                f"program {self.prog.name!r}: ranks {stuck} never finish (a collective misses a "
                f"participant, or a sync waits for work that is never launched)"
            )
        for g in gpus:
            if g.pending:
                raise ValueError(
                    f"program {self.prog.name!r}: GPU {g.idx} still has {g.pending} unfinished items "
                    f"(a collective misses a participant?)"
                )
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
        eff = min(g.req_ci, g.cap_ci)
        d = self.dur[kid][eff] * item[5]
        if g.xfers:
            d *= self.slow[kid][eff]
        g.sm_busy = True
        st.busy = True
        g.run = [st, kid, now, 1.0, eff, now, item[2], item[4], item[5], now, d]
        g.ver += 1
        heapq.heappush(self.heap, (now + d, next(self.cnt), E_KEND, g.idx, g.ver))
        if g.xfers:
            self._rerate_xfers(g, now)

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
            raise ValueError(
                f"program {self.prog.name!r}: collective {cidx} launched twice by one rank in "
                f"iteration {key[0]} (collective ids are per iteration: one launch per participant)"
            )
        last = max(e[3] for e in entry)
        # a transfer: [participants, frac_left, progress_t, full duration at the current rate, version,
        # coll_idx, start]
        tr = [entry, 1.0, last, 0.0, 0, cidx, last]
        for pg, _pst, _pitem, arr in entry:
            if last > arr:
                pg.xsegs.append((arr, last, self.spin_w[pg.req_ci]))
            pg.xfers.append(tr)
            run = pg.run
            pg.cs = self.cslow[run[1]][run[4]] if run is not None else 1.0
        self._rerate_xfer(tr, last)
        for pg, _, _, _ in entry:
            self._rerate_kernel(pg, last, pg.req_ci)  # contention starts

    def _xfer_ns(self, tr) -> float:
        """Full transfer time at the participants' current clocks and contention: the slowest SM clock
        paces the ring, and so does the participant whose compute takes the most HBM bandwidth."""
        entry = tr[0]
        ci = min(e[0].req_ci for e in entry)
        ck = (tr[5], ci)
        xfer = self.coll_ns.get(ck)
        if xfer is None:
            xfer = self.coll_ns[ck] = self.gphys.collective_ns(self.prog.collectives[tr[5]], self.clocks[ci])
        return xfer * max(e[0].cs for e in entry)

    def _rerate_xfer(self, tr, now: float) -> None:
        if tr[3] > 0:
            tr[1] -= (now - tr[2]) / tr[3]
        tr[2] = now
        d = self._xfer_ns(tr)
        if d == tr[3]:
            return
        tr[3] = d
        tr[4] += 1
        heapq.heappush(self.heap, (now + max(tr[1], 0.0) * d, next(self.cnt), E_CEND, tr, tr[4]))

    def _rerate_xfers(self, g: _Gpu, now: float, clock: bool = False) -> None:
        """g's compute kernel (or, with clock, its clock) changed: re-rate the transfers it takes part in."""
        run = g.run
        cs = self.cslow[run[1]][run[4]] if run is not None else 1.0
        if cs == g.cs and not clock:
            return  # same contention as before: no transfer's rate changed
        g.cs = cs
        for tr in g.xfers:
            self._rerate_xfer(tr, now)

    def _xfer_done(self, tr, t: float) -> None:
        entry, cidx, t0 = tr[0], tr[5], tr[6]
        link_w = self.phys.comm_link_w
        for pg, pst, pitem, arr in entry:
            pg.xsegs.append((t0, t, self.spin_w[pg.req_ci] + link_w))
            self.ranks[pg.idx].colls.append((pitem[2], cidx, pst.sid, arr, t, pitem[4]))
            pg.xfers.remove(tr)
            self._rerate_kernel(pg, t, pg.req_ci)  # contention stops
        for pg, pst, _, _ in entry:  # the NCCL kernels end (as E_XEND would)
            pst.q.popleft()
            pst.busy = False
            pg.pending -= 1
            pg.end_t = t
            self._advance(pst, t)
            self._check_drain(pg, pst, t)

    def _clock(self, g: _Gpu, t: float, ci: int, issue: float) -> None:
        """A clock request lands: the last one issued wins; what runs continues at the new rate."""
        if issue < g.last_issue:
            return
        g.last_issue = issue
        if ci == g.req_ci:
            return
        old_req = g.req_ci
        g.req_ci = ci
        g.clock_t.append(t)
        g.clock_ci.append(ci)
        self._rerate_kernel(g, t, old_req)
        if g.xfers:
            self._rerate_xfers(g, t, clock=True)

    def _rerate_kernel(self, g: _Gpu, t: float, old_req: int) -> None:
        """The running kernel's rate may have changed (clock, power ceiling, contention): keep the
        fraction of work it has left and re-schedule its end; a new clock starts a new segment."""
        run = g.run
        if run is None:
            return
        kid = run[1]
        run[3] -= (t - run[9]) / run[10]
        run[9] = t
        eff = min(g.req_ci, g.cap_ci)
        if eff != run[4] or old_req != g.req_ci:
            if self.power is not None:
                self._power_acc(g, run, t, old_req)
            g.segs.append((run[2], t, kid, run[4], old_req))
            run[2] = t
            run[4] = eff
        d = self.dur[kid][eff] * run[8]
        if g.xfers:
            d *= self.slow[kid][eff]
        run[10] = d
        g.ver += 1
        self._push(t + max(run[3], 0.0) * d, E_KEND, g.idx, g.ver)

    # ------------------------------------------------------------------ power controller
    def _power_acc(self, g: _Gpu, run, t: float, req: int | None = None) -> None:
        """Add the running segment's energy above idle since the controller's last tick."""
        assert self.power is not None  # the controller only runs when a cap binds
        kpow, idle = self.power[1][g.idx], self.power[2][g.idx]
        s0 = run[2] if run[2] > g.p_t else g.p_t
        if t > s0:
            g.p_acc += (kpow[run[1]][run[4]] - idle[g.req_ci if req is None else req]) * (t - s0)

    def _power_tick(self, g: _Gpu, t: float) -> None:
        """Every power_period_ms: average the board power over power_window_ms (exponentially) and step
        the clock ceiling down in proportion to the excess over the limit, or up in proportion to the
        headroom once under it by more than the hysteresis."""
        ph = self.phys
        assert self.power is not None  # the controller only runs when a cap binds
        cap_w, idle, thermal = self.power[0], self.power[2][g.idx], self.power[3]
        period = ph.power_period_ms * 1e6
        if g.run is not None:
            self._power_acc(g, g.run, t)
        p = idle[g.req_ci] + g.p_acc / max(t - g.p_t, 1.0)
        if thermal is not None:  # the die warms (lagging) and its leakage with it (energy.ThermalLeakage)
            static, theta = thermal[0][g.idx], thermal[1]
            a = math.exp(-(t - g.p_t) / (ph.thermal_tau_s * 1e9))
            theta[g.idx] = a * theta[g.idx] + (1 - a) * ph.thermal_r_k_per_w * (p - thermal[2][g.idx])
            p += static[g.req_ci] * (math.exp(ph.leak_temp_coeff * theta[g.idx]) - 1.0)
        g.p_acc, g.p_t = 0.0, t
        alpha = min(1.0, ph.power_period_ms / ph.power_window_ms)
        g.p_avg = g.p_avg + alpha * (p - g.p_avg) if g.p_avg > 0 else p
        top = len(self.clocks) - 1
        cap = min(g.cap_ci, top)
        if g.p_avg > cap_w:
            cap -= max(1, int(ph.power_gain * (g.p_avg / cap_w - 1.0) * top))
        elif g.p_avg < cap_w * (1.0 - ph.power_hysteresis):
            cap += max(1, int(ph.power_gain * (1.0 - g.p_avg / cap_w) * top))
        cap = min(max(cap, 0), top)
        if cap != g.cap_ci:
            g.cap_ci = cap
            self._rerate_kernel(g, t, g.req_ci)
            if g.xfers:
                self._rerate_xfers(g, t)
        self.p_live -= 1
        if len(self.heap) > self.p_live:  # something else is still to happen
            self._push(t + period, E_POWER, g.idx)
            self.p_live += 1

    # ------------------------------------------------------------------ host side
    def _host(self, r: int):
        """Rank r's host thread: runs ahead through its ops; yields when it blocks on a sync.
        Only ops that queue GPU work or block are visited; host times come from a numpy plan."""
        g = self.gpus[r]
        rec = self.ranks[r]
        trig = None
        if self.trigger is not None and r in self.trigger[2]:
            trig = (self.trigger[0], self.trigger[1], self.trigger[2][r])
        p = hostplan.plan(self.prog, r, self.phys, lambda sid: self._stream(g, sid), trig, self.capture)
        asked = g.req_ci  # the clock last requested by the triggered policy's side process
        iters: list = []
        rec.log = hostplan.HostLog(p, iters, 0, 0)
        heap, cnt, hpush = self.heap, self.cnt, heapq.heappush
        first_ci, issues = self.policy.get(r, (None, []))
        rng = self.rng
        delay = self.gphys.clock_delay_ns
        sk = self.phys.noise_kernel * self.noise  # per-launch duration jitter (lognormal sigma)
        si = self.phys.noise_iteration * self.noise  # iteration-to-iteration variation
        n_act = len(p.active)
        ones = [1.0] * n_act
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
            if sk > 0 or si > 0:
                z = rng.standard_normal(n_act + 1)
                jl = np.exp(sk * z[1:] + si * z[0] - 0.5 * (sk * sk + si * si)).tolist()
            else:
                jl = ones
            cb, eb = it * p.n_corr, it * p.n_ext
            shift = t
            seg_from, seg_shift, block_end = [0], [shift], {}
            for (i, c, a, b, ci, ei), ti, rel, di, jit in zip(act, ti_l, rel_l, d_l, jl):
                if c == 1:  # LAUNCH
                    rel += shift
                    g.pending += 1
                    if not a.q and not a.busy:
                        hpush(heap, (rel, next(cnt), 2, a, None))  # E_TRY: the stream was idle
                    a.q.append((0, rel, cb + ci, b, eb + ei, jit))
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
                        hpush(heap, (t_it + delay(rng, first_ci), next(cnt), 3, r, (first_ci, t_it, -1)))
                        first_ci = None
                    for at, ci_ in issues:  # each lands after a latency drawn from the physics' distribution
                        issue = t_it + at
                        hpush(heap, (issue + delay(rng, ci_), next(cnt), 3, r, (ci_, issue, k_it)))
                elif c == 13:  # REQUEST: a host-triggered step, at the host's time here (after its sync)
                    if a != asked:  # Perseus's side process sets a clock only if it differs from its last
                        asked = a
                        issue = ti + shift
                        hpush(heap, (issue + delay(rng, a), next(cnt), 3, r, (a, issue, -1)))
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
                        waited = events.get(a)
                        if waited is not None and waited[0] is None:
                            waited[1].append(r)
                            yield
                            ready = max(ready, self.wake[r])
                        elif waited is not None:
                            ready = max(ready, waited[0])
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
