"""`SimDevice`: the virtual GPU behind the device protocol (emo.device.Device).

One SimDevice stands for one node of identical GPUs (as many as the program has ranks). Virtual time
and the energy counters persist across calls: the clock keeps running and the counters keep counting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from emo.device import CAPTURES, COUNTERS, Measurement, ProfileResult, ProfilingUnavailable, RunResult
from emo.device.sim.energy import EnergyMeter, ThermalLeakage, power_steps
from emo.device.sim.engine import Engine, SimResult
from emo.device.sim.physics import GpuPhysics, KernelTables, SimPhysics
from emo.policy import FrequencyPolicy, issue_plan
from emo.workloads.program import KernelSpec, Op, Program, Work

COUNTER_FORMS = ("ncu", "dcgm", "none")  # none: a box without profiling permission

MAX_GPUS = 1024  # the most GPUs one program may run on (the hybrid workload's TP8 x PP8 x DP16)
NVML_SAMPLE_MS = 1000.0 / 6  # nvmlDeviceGetSamples' period on the virtual GPU: NVML's fastest rate
NODE_GPUS = 64  # the GPUs modelled from the start; a program on more adds its GPUs (SimDevice._grow)


@contextlib.contextmanager
def _no_gc():
    """Cyclic GC off while the engine allocates millions of records; afterwards they go straight to
    the oldest generation (freeze + unfreeze), so re-enabling it does not scan them all at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


def _cfg_dict(gpu_cfg: Any) -> dict:
    """The GPU config as a dict, every key the schema has a default for filled from it
    (emo.config.GpuConfig, where each key's one default lives) when not given: a config not composed
    by Hydra (the API, tests) reads as a composed one."""
    if isinstance(gpu_cfg, dict):
        given = dict(gpu_cfg)
    else:
        try:
            from omegaconf import OmegaConf

            given = OmegaConf.to_container(gpu_cfg, resolve=True)  # type: ignore[assignment]
        except Exception as e:  # pragma: no cover - not an OmegaConf node either
            raise ValueError(f"gpu config: want a dict or OmegaConf node, got {type(gpu_cfg).__name__}") from e
    return {**_schema_defaults(), **given}


def _schema_defaults() -> dict:
    from omegaconf import MISSING

    from emo.config import GpuConfig

    out = {}
    for f in dataclasses.fields(GpuConfig):
        if f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        elif f.default is not dataclasses.MISSING and f.default != MISSING:
            out[f.name] = f.default
    return out


class SimDevice:
    """The virtual GPU(s) of one node, implementing emo.device.Device."""

    runs_triggered_policies = True  # it follows host-triggered policies (emo.policy.Trigger) in its host timeline

    def __init__(self, gpu_cfg: Any):
        cfg = _cfg_dict(gpu_cfg)
        for key in ("name", "clocks_mhz", "default_mhz", "tdp_w"):
            if key not in cfg or cfg[key] in (None, "???", []):
                raise ValueError(f"gpu.{key}: missing")
        self.name = str(cfg["name"])
        self.cfg = cfg
        clocks = [int(c) for c in cfg["clocks_mhz"]]
        if clocks != sorted(set(clocks)):
            raise ValueError(f"gpu.clocks_mhz ({self.name}): must be strictly ascending")
        if int(cfg["default_mhz"]) not in clocks:
            raise ValueError(f"gpu.default_mhz ({self.name}): {cfg['default_mhz']} is not a supported clock")
        self.phys = SimPhysics.from_config(cfg["physics"], where=f"gpu.physics ({self.name})")
        self.counter_form = str(cfg["counters"])  # what profile_range answers in (not physics)
        if self.counter_form not in COUNTER_FORMS:
            raise ValueError(f"gpu.counters: {self.counter_form!r} is not one of {', '.join(COUNTER_FORMS)}")
        self.gp = GpuPhysics(self.phys, clocks, float(cfg["tdp_w"]))
        self.clocks = clocks
        self.default_ci = clocks.index(int(cfg["default_mhz"]))
        self.seed = int(cfg["seed"])
        self.noise = float(cfg["noise"])  # multiplier of the physics' noise sizes (0: none)
        if not self.noise >= 0:
            raise ValueError(f"gpu.noise ({self.name}): want a multiplier >= 0, got {self.noise}")
        self.tdp_w = float(cfg["tdp_w"])
        self.cap_w = self.tdp_w
        self.policy: FrequencyPolicy | None = None
        self._applier_started: set[int] = set()
        self.now = 0.0  # virtual ns
        self.idle_w = self.gp.idle_power_w()  # nominal chip (the power controller's estimate)
        self.idle_w_g = [self.gp.idle_power_w(g, self.seed) for g in range(NODE_GPUS)]  # each chip's own
        self.static_w_g = [self.gp.static_w(g, self.seed) for g in range(NODE_GPUS)]
        self._runs = 0
        self._profiles = 0  # profile_range calls: each replay draws its own counter errors
        self._ci = [self.default_ci] * NODE_GPUS  # requested clock per GPU
        self._last_issue = [-math.inf] * NODE_GPUS
        ph, k = self.phys, self.noise
        d0 = self.default_ci

        def thermal(g: int) -> ThermalLeakage | None:
            if ph.thermal_r_k_per_w <= 0 or ph.leak_temp_coeff == 0:
                return None  # the die starts at its idle temperature at the default clock
            return ThermalLeakage(
                ph.thermal_r_k_per_w, ph.thermal_tau_s, ph.leak_temp_coeff, float(self.idle_w_g[g][d0])
            )

        def meter(g: int) -> EnergyMeter:
            return EnergyMeter(
                ph.counter_period_ms,
                ph.sensor_window_ms,
                self.seed,
                g,
                counter_noise=k * ph.noise_energy,
                counter_gain=k * ph.noise_energy_gain,
                sensor_noise=k * ph.noise_power,
                sensor_gain=k * ph.noise_power_gain,
                thermal=thermal(g),
                static_w=float(self.static_w_g[g][d0]),
            )

        self._meter = meter
        self.meters = [meter(g) for g in range(NODE_GPUS)]
        top = len(clocks) - 1
        self._cap_ci = [top] * NODE_GPUS  # the power controller's clock ceiling per GPU ...
        self._p_avg = [0.0] * NODE_GPUS  # ... and its averaged power: the controller runs on across calls
        self.last_sim: SimResult | None = None
        self.last_sim_seconds = 0.0

    # ------------------------------------------------------------------ protocol: clocks and control
    @property
    def control(self):
        """Its GPUs behind the vendor-neutral control interface (emo.device.control.GpuControl)."""
        from emo.device.sim.control import SimControl

        if getattr(self, "_control", None) is None:
            self._control = SimControl(self, NODE_GPUS)
        return self._control

    def supported_clocks(self) -> list[int]:
        return list(self.clocks)

    def default_clock(self) -> int:
        return self.clocks[self.default_ci]

    def clock_index(self, mhz: float) -> int:
        """The supported clock nearest to `mhz` (like nvidia-smi -lgc snapping a request)."""
        c = np.asarray(self.clocks)
        return int(np.argmin(np.abs(c - float(mhz))))

    def set_policy(self, policy: FrequencyPolicy | None) -> None:
        if policy is not None and policy.gpu and policy.gpu != self.name:
            raise ValueError(f"policy is for GPU {policy.gpu!r}, this device is {self.name!r}")
        self.policy = policy
        self._applier_started = set()  # GPUs whose applier has seen its first iteration mark
        if policy is None:
            self._lock_all(self.default_ci)

    def set_power_limit(self, watts: float | None) -> None:
        if watts is not None and not 0 < watts <= self.tdp_w * 1.5:
            raise ValueError(f"power limit {watts} W outside (0, {self.tdp_w * 1.5}] for {self.name}")
        self.cap_w = self.tdp_w if watts is None else float(watts)

    def close(self) -> None:
        self.policy = None
        self.cap_w = self.tdp_w
        self._lock_all(self.default_ci)

    def _lock_all(self, ci: int, gpus: int | None = None) -> None:
        """Lock every GPU's clock now and wait until the change has landed (idle meanwhile)."""
        gpus = len(self.meters) if gpus is None else gpus
        self._grow(gpus)
        if all(self._ci[g] == ci for g in range(gpus)):
            return
        rng = np.random.default_rng([self.seed, 99, self._runs])
        self._runs += 1
        t_land = self.now + self.gp.clock_delay_ns(rng, ci)
        self._idle_until(t_land)
        for g in range(gpus):
            self._ci[g] = ci
            self._last_issue[g] = self.now

    def _idle_until(self, t: float, gpus: int = MAX_GPUS) -> None:  # (gpus: unused, every GPU idles)
        if t <= self.now:
            return
        top = len(self.clocks) - 1
        ticks = int((t - self.now) / (self.phys.power_period_ms * 1e6))
        for g in range(len(self.meters)):
            idle = float(self.idle_w_g[g][self._ci[g]])
            self.meters[g].idle(t, idle, float(self.static_w_g[g][self._ci[g]]))
            if self._cap_ci[g] < top and ticks and idle < self.cap_w * (1 - self.phys.power_hysteresis):
                # the power controller keeps running while the GPU idles (engine._power_tick's step up)
                step = max(1, int(self.phys.power_gain * (1 - idle / self.cap_w) * top))
                self._cap_ci[g] = min(top, self._cap_ci[g] + ticks * step)
                self._p_avg[g] = idle
        self.now = t

    # ------------------------------------------------------------------ protocol: measurement
    def energy_j(self, device: int = 0) -> float:
        self._check_gpu(device)
        return self.meters[device].counter_j(self.now)

    def power_w(self, device: int = 0) -> float:
        """The board power sensor (mean of a short window at the last update)."""
        self._check_gpu(device)
        return self.meters[device].power_w(self.now)

    def utilization(self, device: int = 0) -> dict[str, float]:
        """Utilisation of one GPU over the last run, like nvmlDeviceGetUtilizationRates over its sample
        period (fractions 0..1): `gpu`, as NVML defines it, the share of the time one or more kernels
        was executing, NCCL kernels included (one spinning while it waits for a peer counts, however
        few SMs it holds); `memory`, the DRAM bandwidth used over that time as a share of the peak
        (what online governors such as GEEPAFS read as a throughput signal)."""
        self._check_gpu(device)
        res, tab = self.last_sim, getattr(self, "last_tables", None)
        g = None if res is None else next((g for g in res.gpus if g.idx == int(device)), None)
        span = 0.0 if res is None else res.t_end - res.t_start
        if res is None or g is None or tab is None or span <= 0:
            return {"gpu": 0.0, "memory": 0.0}
        cols = _kernel_segments(res, g)
        mem = 0.0
        for s0, s1, kid, eff in cols:
            dur = np.clip(s1, res.t_start, res.t_end) - np.clip(s0, res.t_start, res.t_end)
            mem += float((dur * tab.util["dram"][kid.astype(np.int64), eff.astype(np.int64)]).sum())
        u0, u1 = _busy_union(res, g, cols)
        busy = float((np.clip(u1, res.t_start, res.t_end) - np.clip(u0, res.t_start, res.t_end)).sum())
        return {"gpu": min(busy / span, 1.0), "memory": min(mem / span, 1.0)}

    def time_s(self) -> float:
        return self.now * 1e-9

    def sleep(self, seconds: float) -> None:
        """Let virtual time pass with the GPUs idle."""
        self._idle_until(self.now + seconds * 1e9)

    def _check_gpu(self, device: int) -> None:
        if not 0 <= int(device) < MAX_GPUS:
            raise ValueError(f"device index {device} out of range")
        self._grow(int(device) + 1)

    def _grow(self, gpus: int) -> None:
        """Model `gpus` GPUs (a job larger than the node's NODE_GPUS): each added GPU is its own chip
        (seeded by its index, as the first ones), idle at the default clock until now. The first
        NODE_GPUS are never changed by it."""
        for g in range(len(self.meters), gpus):
            self.idle_w_g.append(self.gp.idle_power_w(g, self.seed))
            self.static_w_g.append(self.gp.static_w(g, self.seed))
            self._ci.append(self.default_ci)
            self._last_issue.append(-math.inf)
            self._cap_ci.append(len(self.clocks) - 1)
            self._p_avg.append(0.0)
            m = self._meter(g)
            m.idle(self.now, float(self.idle_w_g[g][self.default_ci]), float(self.static_w_g[g][self.default_ci]))
            self.meters.append(m)

    # ------------------------------------------------------------------ tables
    def tables(self, kernels: list[KernelSpec]) -> tuple[KernelTables, list, list, list]:
        """Per kernel x clock duration and power, and the clock each kernel really gets under the cap."""
        tab = self.gp.kernel_tables([k.work for k in kernels])
        slow, cslow = self.gp.contention(tab)
        return tab, tab.dur_ns.tolist(), slow.tolist(), cslow.tolist()

    # ------------------------------------------------------------------ simulate
    def simulate(
        self, program: Program, iterations: int, *, policy: FrequencyPolicy | None = None, capture: str | None = None
    ) -> SimResult:
        """Run `iterations` of `program` from now; advances virtual time and the energy meters.
        `capture`: None (untraced), "full" or "light": the profiler recording the run, whose records
        cost the host time (`trace_overhead_us` each)."""
        if program.ranks < 1 or program.ranks > MAX_GPUS or len(program.ops) != program.ranks:
            raise ValueError(f"program {program.name!r}: ranks={program.ranks} but {len(program.ops)} op lists")
        self._grow(program.ranks)
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        tab, dur, slow, cslow = self.tables(program.kernels)
        plan = trigger = None
        # the schedule each GPU follows: its own, or the one meta.ranks maps its rank to (a sampled plan)
        sched = {int(k): int(v) for k, v in ((policy.meta.get("ranks") if policy else None) or {}).items()}
        if policy is not None and policy.trigger is not None:  # host-triggered (emo.policy.Trigger)
            per = {
                gi: [self.clock_index(s.sm_mhz) for s in sorted(policy.steps[sched.get(gi, gi)], key=lambda s: s.t_ms)]
                for gi in range(program.ranks)
                if policy.steps.get(sched.get(gi, gi))
            }
            trigger = (frozenset(policy.trigger.scopes), bool(policy.trigger.synchronize), per)
        elif policy is not None:
            plan = {}
            for gi in range(program.ranks):
                steps = sorted(policy.steps.get(sched.get(gi, gi), []), key=lambda s: s.t_ms)
                if not steps:
                    continue
                issues = [
                    (i.at_s * 1e9, self.clock_index(i.sm_mhz))
                    for i in issue_plan(steps, lead_ms=policy.lead_ms, period_ms=policy.period_ms)
                ]
                first = None if gi in self._applier_started else self.clock_index(steps[0].sm_mhz)
                plan[gi] = (first, issues)
                self._applier_started.add(gi)
        rng = np.random.default_rng([self.seed, self._runs])
        self._runs += 1
        wall = time.perf_counter()
        # the power controller only runs where the limit can bind (what this program can draw)
        ph = self.phys
        top = len(self.clocks) - 1
        peak = max(
            float(tab.power_w.max()) if tab.power_w.size else 0.0,
            float(self.idle_w.max()) + ph.comm_spin_w + ph.comm_link_w,
        )
        power = None
        if self.meters[0].thermal is not None or self.phys.chip_leak_spread or self.phys.chip_volt_spread:
            peak *= 1.15  # a warm die, a leaky chip draw more than the nominal tables say
        if self.cap_w < peak or min(self._cap_ci[: program.ranks]) < top:  # binds, or still recovering
            gs = range(program.ranks)
            th = None
            if self.meters[0].thermal is not None:
                tls = [self.meters[g].thermal for g in gs]
                assert all(tl is not None for tl in tls)  # every GPU gets a thermal model when GPU 0 does
                th = (
                    [self.static_w_g[g].tolist() for g in gs],
                    [tl.theta for tl in tls if tl is not None],
                    [tl.p_ref for tl in tls if tl is not None],
                )
            power = (
                self.cap_w,
                [tab.chip_power_w(self.gp, g, self.seed).tolist() for g in gs],
                [self.idle_w_g[g].tolist() for g in gs],
                th,
            )
        else:
            self._cap_ci[: program.ranks] = [top] * program.ranks
            self._p_avg[: program.ranks] = [0.0] * program.ranks
        eng = Engine(
            program,
            dur=dur,
            slow=slow,
            cslow=cslow,
            phys=self.phys,
            gphys=self.gp,
            clock_ci=self._ci[: program.ranks],
            last_issue=self._last_issue[: program.ranks],
            t_start=self.now,
            iterations=iterations,
            policy_plan=plan,
            rng=rng,
            coll_ns={},
            noise=self.noise,
            power=power,
            cap_ci=self._cap_ci[: program.ranks],
            p_avg=self._p_avg[: program.ranks],
            trigger=trigger,
            capture=capture,
        )
        with _no_gc():
            res = eng.run()
        self.last_sim_seconds = time.perf_counter() - wall
        t_dev = max([res.t_end] + [g.clock_t[-1] for g in res.gpus])
        for g in res.gpus:
            pw = tab.chip_power_w(self.gp, g.idx, self.seed)  # this chip's voltage and leakage
            t, e = power_steps(
                self.now,
                t_dev,
                g.clock_t,
                g.clock_ci,
                self.idle_w_g[g.idx],
                g.segs,
                pw,
                g.xsegs,
                res.ranks[g.idx].kernels,
            )
            self.meters[g.idx].append(t, e, (np.asarray(g.clock_t), self.static_w_g[g.idx][np.asarray(g.clock_ci)]))
            self._ci[g.idx] = g.req_ci
            self._last_issue[g.idx] = g.last_issue
            if power is not None:
                self._cap_ci[g.idx], self._p_avg[g.idx] = g.cap_ci, g.p_avg
        for gi in range(program.ranks, len(self.meters)):
            self.meters[gi].idle(
                t_dev, float(self.idle_w_g[gi][self._ci[gi]]), float(self.static_w_g[gi][self._ci[gi]])
            )
        self.now = t_dev
        self.last_sim = res
        self.last_tables = tab
        return res

    # ------------------------------------------------------------------ protocol: run a workload
    def run(
        self,
        workload: Any,
        iterations: int,
        *,
        warmup: int = 1,
        trace_dir: Path | None = None,
        capture: str = "full",
        trace_ranks: list[int] | None = None,
    ) -> RunResult:
        """With `trace_dir`, the measured iterations are traced by `capture` and pay its host cost;
        without, nothing is recorded and nothing is paid (the warm-up is never traced). `trace_ranks`:
        the ranks whose traces are written (a sampled trace, emo.sampling; None: every rank)."""
        if capture not in CAPTURES:
            raise ValueError(f"trace.capture={capture!r}: want one of {', '.join(CAPTURES)}")
        program = self._program(workload)
        if self.policy is None:
            self._lock_all(self.default_ci, program.ranks)  # undo clocks left locked by a microbenchmark
        if warmup > 0:
            self.simulate(program, warmup, policy=self.policy)
        # The window: begin at an energy-counter update (the counters of one node update together);
        # after the run, wait for the next update and one more idle update period, and take off the
        # idle tail the counter saw after the run (its power measured over that extra period).
        m0 = self.meters[0]
        u0 = m0.next_update(self.now)
        self._idle_until(u0 + 1.0)
        e0 = [self.energy_j(g) for g in range(program.ranks)]
        res = self.simulate(program, iterations, policy=self.policy, capture=capture if trace_dir else None)
        # from where the device is now: a clock request that lands after the run moved it past t_end,
        # and a counter update before that would leave idle time in the window the tail misses
        u1 = m0.next_update(self.now)
        self._idle_until(u1 + 1.0)
        e1 = [self.energy_j(g) for g in range(program.ranks)]
        u2 = m0.next_update(u1 + 1.0)
        self._idle_until(u2 + 1.0)
        e2 = [self.energy_j(g) for g in range(program.ranks)]
        tail = (u1 - res.t_end) / (u2 - u1)
        per = {g: (e1[g] - e0[g]) - (e2[g] - e1[g]) * tail for g in range(program.ranks)}
        it_t = res.ranks[0].iter_t
        iter_times = [(b - a) * 1e-9 for a, b in zip(it_t, it_t[1:] + [res.t_end])]
        files: list[Path] = []
        if trace_dir is not None:
            from emo.device.sim.kineto import write_traces

            files = write_traces(
                res, program, self, Path(trace_dir), first_step=warmup, capture=capture, ranks=trace_ranks
            )
        return RunResult(
            iterations=iterations,
            time_s=(res.t_end - res.t_start) * 1e-9,
            energy_j=float(sum(per.values())),
            iteration_times_s=iter_times,
            energy_per_device_j=per,
            trace_files=files,
        )

    def _program(self, workload: Any) -> Program:
        if isinstance(workload, Program):
            return workload
        from emo.workloads import build_program  # lazily: the device protocol does not need workloads

        return build_program(workload, self.name)

    # ------------------------------------------------------------------ protocol: microbenchmarks
    def run_microbenchmark(self, name: str, sm_mhz: int, min_seconds: float = 1.0) -> Measurement:
        from emo.microbench import load_registry

        reg = load_registry()
        if name not in reg:
            raise ValueError(f"microbenchmark {name!r} not in the registry ({', '.join(sorted(reg))})")
        return self.measure_work(Work(**reg[name]["work"]), sm_mhz, min_seconds, name=name)

    def measure_work(self, work: Work, sm_mhz: int, min_seconds: float = 1.0, *, name: str = "bench") -> Measurement:
        """Loop one kernel at a locked clock until the energy counter resolves it (>= 2 updates);
        time and energy per launch, from host timestamps and the counter's steady-state rate."""
        if int(sm_mhz) not in self.clocks:
            raise ValueError(f"{sm_mhz} MHz is not a supported clock of {self.name}")
        self._lock_all(self.clocks.index(int(sm_mhz)), 1)
        spec = KernelSpec(name=name, work=work)
        est = float(self.gp.kernel_tables([work]).dur_ns[0, self.clocks.index(int(sm_mhz))])
        period = self.phys.counter_period_ms * 1e6
        span = max(min_seconds * 1e9, 3 * period)
        per_iter = 200
        launches = max(int(math.ceil(span / max(est, 1.0) / per_iter)), 1)
        prog = Program(name=f"microbench:{name}", ranks=1, ops=[[]])
        kid = prog.kernel(spec)
        prog.ops[0] = [(Op.ITER,)] + [(Op.LAUNCH, 7, kid)] * per_iter
        prog.ops[0].append((Op.STREAM_SYNC, 7))
        saved, self.policy = self.policy, None
        try:
            res = self.simulate(prog, launches)
        finally:
            self.policy = saved
        n = launches * per_iter
        kern = res.ranks[0].kernels
        t_first, t_last = kern[0][3], max(k[4] for k in kern)
        meter = self.meters[0]
        # steady state: counter updates strictly inside the busy span (the tail may include idle)
        u0 = meter.next_update(t_first + 1.0)
        u1 = meter.last_update(t_last)
        time_per = (t_last - t_first) / n
        if u1 - u0 < period:
            raise ValueError(f"microbenchmark {name!r}: run too short for the energy counter")
        e0, e1 = meter.counter_j(u0 + 1.0), meter.counter_j(u1 + 1.0)
        power = (e1 - e0) / ((u1 - u0) * 1e-9)
        return Measurement(time_s=time_per * 1e-9, energy_j=power * time_per * 1e-9, sm_mhz=int(sm_mhz))

    # ------------------------------------------------------------------ protocol: profiling
    def profile_range(self, kernels: list[Any]) -> ProfileResult:
        """Table II counters of one execution of the range at the default clock, as CUPTI range
        profiling reports them; the replays cost virtual time (the GPU runs them)."""
        from emo.device.sim.profiling import as_specs

        specs = as_specs(kernels)
        if not specs:
            raise ValueError("profile_range: empty kernel range")
        if self.counter_form == "none":
            raise ProfilingUnavailable("the virtual GPU is configured without counters (gpu.counters=none)")
        w = [s.work for s in specs]
        tab = self.gp.kernel_tables(w)
        d = tab.dur_ns[:, self.default_ci]
        f_hz = self.clocks[self.default_ci] * 1e6
        get = lambda f: np.array([getattr(x, f) for x in w])
        aw = get("active_warps")
        c = {
            "sm_active_cycles": float(np.sum(d * 1e-9 * f_hz * np.minimum(1.0, aw * 8 + 0.05))),
            "active_warps": float(np.sum(aw * self.phys.max_warps_per_sm * d) / np.sum(d)),
            "dram_read_bytes": float(get("dram_read_bytes").sum()),
            "dram_write_bytes": float(get("dram_write_bytes").sum()),
            "l1_bytes": float((get("shared_bytes") + get("l1_bytes")).sum()),
            "l2_bytes": float((get("l2_bytes") + get("dram_read_bytes") + get("dram_write_bytes")).sum()),
            "alu_inst": float(((get("int_op") + get("sfu_op")) / 32).sum()),
            "fma_inst": float((get("fp32_flop") / 64).sum()),
            "fp64_inst": float((get("fp64_flop") / 64).sum()),
            "mem_inst": float(((get("shared_bytes") + get("l1_bytes") + get("l2_bytes")) / 512).sum()),
            "tensor_inst": float((get("fp16_tensor_flop") / 4096 + get("int8_tensor_op") / 8192).sum()),
        }
        assert tuple(c) == COUNTERS
        passes = 4  # 11 metrics from several hardware units: CUPTI needs a few replay passes
        rng = np.random.default_rng([self.seed, 97, self._profiles])
        self._profiles += 1
        if self.counter_form == "dcgm":  # what DCGM's profiling fields would average over the range
            from emo.device.sim.profiling import dcgm_fields, dcgm_noise

            c, passes = dcgm_fields(w, d, f_hz, self.phys), 1  # sampled while it runs, no replay
            c = dcgm_noise(c, self.noise * self.phys.noise_counter_dcgm, rng)
        else:
            from emo.device.sim.profiling import replay_noise

            c = replay_noise(c, self.noise * self.phys.noise_counter_ncu, rng)
        busy = float(d.sum()) + 3000.0 * len(specs)
        cost_ns = 5e7 + passes * (busy + 2e6)  # session set-up + per pass (save/restore memory)
        self._profile_busy(tab, cost_ns)
        return ProfileResult(counters=c, passes=passes, cost_s=cost_ns * 1e-9)

    def profile_ranges(self, workload: Any, ranges: list) -> list[ProfileResult]:
        """Ranges named by (rank, launch ordinals within an iteration): emo.device.sim.profiling."""
        from emo.device.sim.profiling import profile_ranges

        return profile_ranges(self, workload, ranges)

    def _profile_busy(self, tab: KernelTables, cost_ns: float) -> None:
        # the GPU replays the range at the default clock; count it as mean-kernel power
        p = float(np.mean(tab.chip_power_w(self.gp, 0, self.seed)[:, self.default_ci]))
        t1 = self.now + cost_ns
        self.meters[0].idle(t1, p, float(self.static_w_g[0][self.default_ci]))
        self._idle_until(t1)

    def __repr__(self) -> str:
        return f"SimDevice({self.name}, t={self.time_s():.3f}s)"

    def utilization_samples(self, device: int = 0) -> dict[str, list[tuple[float, float]]]:
        """NVML-style utilisation samples of the last run (nvmlDeviceGetSamples): one per sample
        period (NVML_SAMPLE_MS, NVML's fastest rate) lying wholly inside the
        run, each the share of its period a kernel ran (`gpu`) or device memory was busy (`memory`),
        in whole percent as NVML reports them; (t_s at the period's end, fraction 0..1)."""
        self._check_gpu(device)
        res, tab = self.last_sim, getattr(self, "last_tables", None)
        g = None if res is None else next((g for g in res.gpus if g.idx == int(device)), None)
        period = NVML_SAMPLE_MS * 1e6
        n = 0 if res is None else int((res.t_end - res.t_start) // period)
        if res is None or g is None or tab is None or n < 1:
            return {"gpu": [], "memory": []}
        cols = _kernel_segments(res, g)
        edges = res.t_start + period * np.arange(n + 1)
        busy, mem = np.zeros(n), np.zeros(n)
        overlap = (
            lambda s0, s1: np.clip(
                np.minimum(s1[:, None], edges[None, 1:])  # noqa: E731
                - np.maximum(s0[:, None], edges[None, :-1]),
                0,
                None,
            )
        )
        for s0, s1, kid, eff in cols:
            # each segment's overlap with each sample period
            mem += (overlap(s0, s1) * tab.util["dram"][kid.astype(np.int64), eff.astype(np.int64)][:, None]).sum(axis=0)
        busy += overlap(*_busy_union(res, g, cols)).sum(axis=0)  # any kernel, NCCL ones included
        t = [float(x) * 1e-9 for x in edges[1:]]
        pct = lambda x: [float(v) for v in np.floor(np.minimum(x / period, 1.0) * 100.0) / 100.0]  # noqa: E731
        return {"gpu": list(zip(t, pct(busy))), "memory": list(zip(t, pct(mem)))}

    # ------------------------------------------------------------------ protocol: clock-request latency
    def clock_step_latencies_ms(self, pairs: list[tuple[int, int]], poll_ms: float) -> list[float]:
        """For each (from, to) pair: lock `from` and wait until it has landed, lock `to`, and report the
        ms until a clock read every poll_ms first shows `to` (so the polling quantises the result, as
        it does on hardware). The GPUs idle meanwhile; virtual time and the counters advance."""
        if not poll_ms > 0:
            raise ValueError(f"clock_step_latencies_ms: poll_ms must be > 0, got {poll_ms}")
        out = []
        for f_from, f_to in pairs:
            for f in (f_from, f_to):
                if int(f) not in self.clocks:
                    raise ValueError(f"clock_step_latencies_ms: {f} MHz is not a supported clock of {self.name}")
            self._lock_all(self.clocks.index(int(f_from)))
            ci = self.clocks.index(int(f_to))
            if ci == self._ci[0]:
                out.append(0.0)  # the first read already shows it
                continue
            rng = np.random.default_rng([self.seed, 98, self._runs])
            self._runs += 1
            land = self.gp.clock_delay_ns(rng, ci)
            reads = math.ceil(land / (poll_ms * 1e6))
            self._idle_until(self.now + land)
            for g in range(len(self.meters)):
                self._ci[g] = ci
                self._last_issue[g] = self.now
            self._idle_until(self.now - land + reads * poll_ms * 1e6)
            out.append(reads * poll_ms)
        return out


def _busy_union(res, g, cols) -> tuple[np.ndarray, np.ndarray]:
    """When one or more kernels was executing on GPU g (NVML's definition of utilisation): the union
    of its compute-kernel segments and its NCCL kernels, from their start (spinning for the peers)
    to their end, as sorted disjoint (start, end) arrays."""
    starts = [c[0] for c in cols]
    ends = [c[1] for c in cols]
    colls = res.ranks[g.idx].colls
    if colls:
        c = np.asarray(colls, dtype=np.float64)
        starts.append(c[:, 3])
        ends.append(c[:, 4])
    if not starts:
        return np.zeros(0), np.zeros(0)
    s0, s1 = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(s0, kind="stable")
    s0, s1 = s0[order], np.maximum.accumulate(s1[order])
    new = np.concatenate([[True], s0[1:] > s1[:-1]])  # an interval starting after all before it ended
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:] - 1, [len(s0) - 1]])
    return s0[first], s1[last]


def _kernel_segments(res, g) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """GPU g's compute-kernel segments at one clock each, as the energy meter sees them
    (energy.power_steps): (start ns, end ns, kernel id, clock index) columns, the segments a clock
    change ended, then each kernel's last segment."""
    cols = []
    if g.segs:
        s = np.asarray(g.segs, dtype=np.float64)
        cols.append((s[:, 0], s[:, 1], s[:, 2], s[:, 3]))
    kern = res.ranks[g.idx].kernels
    if len(kern):
        k = np.asarray(kern, dtype=np.float64)
        cols.append((k[:, 6], k[:, 4], k[:, 1], k[:, 7]))
    return cols
