"""Physics of one virtual GPU model: kernel time and board power versus SM clock.

Everything here is a pure function of the `physics` block of `conf/gpu/<model>.yaml` (validated into
`SimPhysics`) and of kernel work vectors; the simulator looks results up in per kernel x clock
tables built once with numpy.

Time (per kernel, at SM clock f) is the SUM over the kernel's phases (`phases`: a GEMM's main loop
and its epilogue, attention's softmax between its two matrix products), each phase with its own
resource mix; the counters report only the kernel's totals, as hardware does. Within a phase:
  - compute (fp32 / fp16-tensor / int8-tensor / fp64 / int / sfu: they share the issue slots) and
    shared+L1 cycles at per-SM rates, L2 at a per-GPU rate: t = cycles / f, derated by occupancy;
  - DRAM: bytes / bandwidth, or the SMs' request issue rate when that is slower (low clocks), or
    the latency bound of Little's law when the resident warps keep too few bytes in flight (low
    occupancy: latency = dram_latency_ns + dram_latency_cycles / f, so it slows with the clock);
  - the resources overlap as a latency-hiding roofline (after Hong & Kim's MWP/CWP analytical
    model, ISCA 2009): the slowest resource sets the time and the others are exposed by the share of
    their latency the resident warps cannot hide, t = max + (1 - h(a)) (sum - max), h(a) = h_max
    a/(a + a_half) at occupancy a; plus a pipeline fill of `phase_fill_cycles` (clock-bound) and
    `phase_fill_ns` (DRAM latency, clock-free) per phase; the kernel is floored at `min_ns`.
Power (board, W), per phase, averaged over the kernel by time:
  V(f) flat at volt_min below knee_mhz, then rising to volt_max at the max clock (a smooth knee of
  `volt_knee_mhz` width); with v = V/Vmax and phi = f/fmax the core draws
  static_w*v + (idle_dyn_w [+ active_dyn_w while a kernel runs] + sum_u util_u*unit_w_u
  + unit_w_issue*g(sum of the SM pipes' utilisations))*v^2*phi, g saturating (the shared issue and
  register-file power is paid once however many pipes use it: sub-additive); the board adds the
  regulators' conduction loss, quadratic in the core current (super-additive), and
  dram_w*dram_util. Per chip (`chip_power`): a voltage offset and a leakage factor drawn per GPU.
  Temperature-dependent leakage is added over time by the energy meter (energy.ThermalLeakage).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emo.device.sim.program import CollectiveSpec, Work

# Compute units: (Work field, per-SM-per-cycle rate field of SimPhysics, power weight field)
COMPUTE_UNITS = (
    ("fp32_flop", "fp32_flop_per_sm_cycle", "unit_w_fp32"),
    ("fp16_tensor_flop", "fp16_tensor_flop_per_sm_cycle", "unit_w_fp16_tensor"),
    ("int8_tensor_op", "int8_tensor_op_per_sm_cycle", "unit_w_int8_tensor"),
    ("fp64_flop", "fp64_flop_per_sm_cycle", "unit_w_fp64"),
    ("int_op", "int_op_per_sm_cycle", "unit_w_int"),
    ("sfu_op", "sfu_op_per_sm_cycle", "unit_w_sfu"),
)
WORK_FIELDS = tuple(f.name for f in dataclasses.fields(Work))


@dataclass(frozen=True)
class SimPhysics:
    """The virtual GPU's physical parameters (conf/gpu/<model>.yaml, key `physics`)."""

    device_name: str = "NVIDIA GPU"  # what deviceProperties / nvidia-smi would call it
    sms: int = 108
    max_warps_per_sm: int = 64
    compute_major: int = 8
    compute_minor: int = 0
    total_mem_bytes: int = 85899345920
    # throughput per SM per cycle
    fp32_flop_per_sm_cycle: float = 128.0
    fp16_tensor_flop_per_sm_cycle: float = 2048.0
    int8_tensor_op_per_sm_cycle: float = 4096.0
    fp64_flop_per_sm_cycle: float = 64.0
    int_op_per_sm_cycle: float = 64.0
    sfu_op_per_sm_cycle: float = 16.0
    shared_bytes_per_sm_cycle: float = 128.0  # shared memory + L1
    l2_bytes_per_cycle: float = 5120.0  # whole GPU
    dram_gbps: float = 2039.0
    dram_issue_bytes_per_cycle: float = 4000.0  # whole GPU: how fast the SMs can issue DRAM requests
    dram_latency_ns: float = 450.0  # a DRAM request's round trip: the DRAM part (clock independent) ...
    dram_latency_cycles: float = 0.0  # ... and the SM/L2/crossbar part (SM cycles; see docs)
    dram_bytes_in_flight_per_warp: float = 256.0  # outstanding DRAM bytes a resident warp keeps
    shape_dram_spread: float = 0.0  # per kernel shape: achieved DRAM bandwidth dram_gbps x (1 +- this)
    shape_hide_spread: float = 0.0  # per kernel shape: the exposed (unhidden) time x (1 +- this) (docs)
    shape_power_spread: float = 0.0  # per kernel shape: the units' switching power x (1 +- this) (docs)
    shape_issue_spread: float = 0.0  # per kernel shape: DRAM request issue rate x (1 +- this) (load widths, docs)
    hide_max: float = 0.98  # share of a non-dominant resource's time the warps can hide at full occupancy
    hide_half: float = 0.05  # occupancy at which half of that is hidden
    phase_fill_cycles: float = 1500.0  # per phase: prologue / pipeline fill (SM cycles)
    phase_fill_ns: float = 800.0  # per phase: first DRAM round trips (clock independent)
    epilogue_occupancy: float = 0.5  # a GEMM epilogue's occupancy relative to its main loop
    mainloop_ilp: float = (
        4.0  # a tiled matrix product's main loop: independent MMAs / copy stages in flight per warp ...
    )
    mainloop_occupancy: float = 0.35  # ... up to the occupancy its k-slice barriers let it behave like
    epilogue_fp32_share: float = 0.6  # share of a GEMM's fp32 work (bias, activation, scaling) in its epilogue
    occupancy_half_compute: float = 0.1  # derate a/(a+k)*(1+k) of compute pipes at occupancy a
    occupancy_half_memory: float = 0.3  # same for memory latency hiding
    # voltage / power
    knee_mhz: float = 1095.0
    volt_min: float = 0.70  # V below the knee
    volt_max: float = 1.00  # V at the max clock
    static_w: float = 60.0  # leakage at volt_max (scales with V)
    idle_dyn_w: float = 25.0  # clock tree at max V and f when idle (scales with V^2 f)
    active_dyn_w: float = 40.0  # extra while any kernel runs (V^2 f)
    unit_w_fp32: float = 180.0  # at full utilisation, max V and f
    unit_w_fp16_tensor: float = 300.0
    unit_w_int8_tensor: float = 280.0
    unit_w_fp64: float = 220.0
    unit_w_int: float = 120.0
    unit_w_sfu: float = 80.0
    unit_w_shared: float = 90.0
    unit_w_l2: float = 90.0
    dram_w: float = 70.0  # DRAM + memory controller at full bandwidth (clock independent)
    volt_knee_mhz: float = 0.0  # width of the V-f curve's knee (0: a sharp corner)
    unit_w_issue: float = 0.0  # shared issue / register-file power at saturation (V^2 f), sub-additive over pipes
    issue_half: float = 0.3  # summed pipe utilisation at which half of unit_w_issue is drawn
    vrm_loss_at_tdp: float = 0.0  # regulators' conduction loss at TDP core power and max V, as a share of TDP
    chip_volt_spread: float = 0.0  # per chip: V x (1 + this x N(0,1)) (voltage binning)
    chip_leak_spread: float = 0.0  # per chip: leakage x (1 + this x N(0,1)) (process variation)
    thermal_r_k_per_w: float = 0.0  # die temperature rise per W above idle (K/W); 0: no thermal state
    thermal_tau_s: float = 5.0  # its time constant
    leak_temp_coeff: float = 0.0  # leakage x exp(this x (T - T_idle)) (per K)
    noise_counter_ncu: float = 0.0  # per replay pass: relative error of its counters (ncu)
    noise_counter_dcgm: float = 0.0  # per field: relative error of a sampled activity ratio (DCGM)
    # communication (NCCL)
    link_gbps: float = 230.0  # NCCL bus bandwidth per GPU
    link_latency_us: float = 3.0  # per ring step
    p2p_gbps: float = 150.0  # send/recv between two GPUs
    comm_clock_fraction: float = 0.45  # below ~this fraction of max clock the SMs starve the link
    comm_spin_w: float = 20.0  # NCCL kernel polling (V^2 f), also while waiting for a peer
    comm_link_w: float = 25.0  # links + DRAM traffic while transferring
    comm_base_ns: float = 8000.0  # fixed NCCL kernel overhead
    comm_sm_fraction: float = 0.08  # share of the SMs the NCCL channels' CTAs hold while transferring
    comm_hbm_per_link_byte: float = 2.0  # HBM bytes a collective moves per byte on the link (send + receive/reduce)
    # copies
    pcie_gbps: float = 24.0
    dtod_gbps: float = 900.0
    copy_w: float = 15.0
    # host
    launch_us: tuple[float, float] = (4.0, 6.0)  # cudaLaunchKernel duration range
    nccl_launch_us: tuple[float, float] = (8.0, 12.0)
    runtime_call_us: tuple[float, float] = (1.5, 3.0)  # cudaEventRecord / StreamWaitEvent / sync return
    memcpy_call_us: tuple[float, float] = (6.0, 10.0)
    cpu_op_pre_us: float = 6.0  # framework (aten) overhead before the runtime call
    cpu_op_post_us: float = 2.0
    comm_op_us: float = 20.0  # record_param_comms / c10d overhead around an NCCL launch
    launch_queue_us: float = 1.0  # from cudaLaunchKernel return to the GPU seeing the kernel
    # the profiler's host cost per record it takes (a CPU op, an annotation, a runtime call), paid
    # only by traced runs (docs/virtual-gpu.md, "Tracing")
    trace_overhead_us: float = 2.0
    # control and sensors
    clock_delay_ms: tuple[float, float] = (5.0, 15.0)  # 5th-95th percentile of the lognormal body
    clock_target_slope: float = 0.3  # body x (1 + slope) for a target at the max clock, x 1 at or below the knee
    clock_tail_prob: float = 0.04  # share of requests that also wait out a driver/firmware stall
    clock_tail_ms: float = 20.0  # the stall: Pareto with this minimum ...
    clock_tail_alpha: float = 1.5  # ... and this shape (heavy: finite mean, infinite variance)
    clock_tail_max_ms: float = 300.0
    power_period_ms: float = 20.0  # the power controller acts this often ...
    power_window_ms: float = 40.0  # ... on power averaged (exponentially) over this window
    power_gain: float = 0.5  # bins stepped per tick = gain x relative excess (or headroom) x number of clocks
    power_hysteresis: float = 0.03  # steps back up (in proportion to the headroom) once this far under the limit
    # noise sizes at gpu.noise = 1 (relative standard deviations)
    noise_kernel: float = 0.01  # per launch: kernel duration jitter (lognormal)
    noise_iteration: float = 0.005  # per iteration: all of its kernels together
    noise_energy: float = 0.005  # energy counter: per update increment
    noise_energy_gain: float = 0.01  # energy counter: per GPU calibration error (constant)
    noise_power: float = 0.025  # power sensor: per sample (NVML: +-5 % of the reading)
    noise_power_gain: float = 0.01  # power sensor: per GPU calibration error (constant)
    counter_period_ms: float = 100.0
    sensor_window_ms: float = 25.0

    @classmethod
    def from_config(cls, physics: Any, where: str = "gpu.physics") -> SimPhysics:
        d = dict(physics or {})
        names = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            if key not in names:
                raise ValueError(f"{where}: unknown key {key!r} (valid: {', '.join(sorted(names))})")
        for key in ("launch_us", "nccl_launch_us", "runtime_call_us", "memcpy_call_us", "clock_delay_ms"):
            if key in d:
                v = list(d[key])
                if len(v) != 2 or not 0 <= v[0] <= v[1]:
                    raise ValueError(f"{where}.{key}: want [low, high] with 0 <= low <= high, got {v}")
                d[key] = (float(v[0]), float(v[1]))
        try:
            p = cls(**d)
        except TypeError as e:
            raise ValueError(f"{where}: {e}") from None
        if not 0 < p.volt_min <= p.volt_max:
            raise ValueError(f"{where}: want 0 < volt_min <= volt_max")
        if p.sms <= 0 or p.dram_gbps <= 0:
            raise ValueError(f"{where}: sms, dram_gbps must be > 0")
        if not 0 <= p.comm_sm_fraction < 1 or not 0 <= p.clock_tail_prob <= 1 or p.clock_tail_alpha <= 0:
            raise ValueError(
                f"{where}: want 0 <= comm_sm_fraction < 1, 0 <= clock_tail_prob <= 1, clock_tail_alpha > 0"
            )
        if not 0 <= p.trace_overhead_us < 1e6:
            raise ValueError(
                f"{where}.trace_overhead_us: want >= 0 (µs per recorded host event), got {p.trace_overhead_us}"
            )
        if p.power_period_ms <= 0 or p.power_window_ms <= 0:
            raise ValueError(f"{where}: power_period_ms and power_window_ms must be > 0")
        if not 0 <= p.hide_max < 1 or p.hide_half <= 0:
            raise ValueError(f"{where}: want 0 <= hide_max < 1 and hide_half > 0")
        return p


def work_matrix(works: list[Work]) -> dict[str, np.ndarray]:
    """Column arrays (one entry per kernel) of the work vectors."""
    if not works:
        return {f: np.zeros(0) for f in WORK_FIELDS}
    a = np.array([[getattr(w, f) for f in WORK_FIELDS] for w in works], dtype=np.float64)
    return {f: a[:, i] for i, f in enumerate(WORK_FIELDS)}


@dataclass
class KernelTables:
    """Per kernel x clock: duration (ns), board power while it runs alone (W), utilisations."""

    clocks: np.ndarray  # MHz, ascending
    dur_ns: np.ndarray  # [K, C]
    power_w: np.ndarray  # [K, C] whole-board power while the kernel runs
    util: dict[str, np.ndarray] = field(default_factory=dict)  # [K, C] per unit
    core_w: np.ndarray | None = None  # [K, C] the core's part of power_w (nominal chip, before regulator loss)
    dram_w: np.ndarray | None = None  # [K, C] the DRAM's part

    def chip_power_w(self, gp: GpuPhysics, chip: int, seed: int) -> np.ndarray:
        """[K, C] power_w of one chip of the node (its voltage offset and leakage)."""
        assert self.core_w is not None and self.dram_w is not None  # GpuPhysics.kernel_tables fills both
        return gp.board_w(self.core_w, self.dram_w, chip, seed)


class GpuPhysics:
    """Vectorised physics of one GPU model over its supported clocks."""

    def __init__(self, phys: SimPhysics, clocks_mhz: list[int], tdp_w: float):
        self.p = phys
        self.clocks = np.asarray(sorted(clocks_mhz), dtype=np.float64)
        if self.clocks.size == 0:
            raise ValueError("gpu.clocks_mhz: empty")
        self.fmax = float(self.clocks[-1])
        self.tdp_w = float(tdp_w)
        self.v = self.volt_rel(self.clocks)
        self.phi = self.clocks / self.fmax
        self.v2f = self.v**2 * self.phi

    # ------------------------------------------------------------------ voltage and idle power
    def volt_rel(self, mhz) -> np.ndarray:
        """V/Vmax: flat below the knee, linear up to volt_max at the max clock."""
        p = self.p
        f = np.asarray(mhz, dtype=np.float64)
        span = max(self.fmax - p.knee_mhz, 1e-9)
        if p.volt_knee_mhz > 0:  # a smooth knee: a parabola over knee +- w joins flat and linear
            w = p.volt_knee_mhz
            ramp = lambda z: np.where(z <= -w, 0.0, np.where(z >= w, z, (z + w) ** 2 / (4 * w)))  # noqa: E731
            x = ramp(f - p.knee_mhz) / max(float(ramp(np.float64(self.fmax - p.knee_mhz))), 1e-9)
        else:
            x = np.clip((f - p.knee_mhz) / span, 0.0, None)
        return (p.volt_min + (p.volt_max - p.volt_min) * x) / p.volt_max

    def idle_power_w(self, chip: int | None = None, seed: int = 0) -> np.ndarray:
        """[C] board power with no kernel running (of GPU `chip` of a node seeded `seed`; None: nominal)."""
        p = self.p
        core = p.static_w * self.v + p.idle_dyn_w * self.v2f
        return self.board_w(core[None, :], 0.0, chip, seed)[0]

    def static_w(self, chip: int | None = None, seed: int = 0) -> np.ndarray:
        """[C] leakage power at the idle temperature (what temperature scales: energy.ThermalLeakage)."""
        dv, leak = self.chip_factors(chip, seed)
        return self.p.static_w * self.v * (1 + dv) * leak

    def chip_factors(self, chip: int | None, seed: int) -> tuple[float, float]:
        """(relative voltage offset, leakage factor) of one chip: fixed per (seed, GPU index)."""
        p = self.p
        if chip is None or (p.chip_volt_spread == 0 and p.chip_leak_spread == 0):
            return 0.0, 1.0
        z = np.random.default_rng([int(seed), int(chip), 7]).standard_normal(2)
        return float(p.chip_volt_spread * z[0]), float(max(0.2, 1.0 + p.chip_leak_spread * z[1]))

    def board_w(self, core: np.ndarray, dram: np.ndarray | float, chip: int | None = None, seed: int = 0) -> np.ndarray:
        """[K, C] board power from the core's nominal power (static + dynamic, [K, C]) and the DRAM's:
        the chip's voltage offset scales the static part by V and the dynamic part by V^2, its leakage
        factor the static part; the regulators lose r I^2 (I = core power / V) on top."""
        p = self.p
        dv, leak = self.chip_factors(chip, seed)
        static = p.static_w * self.v[None, :]
        v = self.v[None, :] * (1 + dv)
        c = static * (1 + dv) * leak + (core - static) * (1 + dv) ** 2
        if p.vrm_loss_at_tdp > 0:
            c = c + p.vrm_loss_at_tdp * self.tdp_w * (c / (self.tdp_w * v)) ** 2
        return c + dram

    # ------------------------------------------------------------------ kernels
    def kernel_tables(self, works: list[Work]) -> KernelTables:
        p = self.p
        w = work_matrix(works)
        f_hz = self.clocks[None, :] * 1e6  # [1, C]
        dur = np.zeros((len(works), self.clocks.size))
        energy = np.zeros_like(dur)  # core dynamic energy above idle, W*ns
        e_dram = np.zeros_like(dur)  # DRAM energy, W*ns
        peak_tot: dict[str, np.ndarray] = {}
        factors = shape_factors(w, p)
        toggle = factors[2]
        for share, occ in phases(w, p):
            t, peak = self._phase(w, share, occ, f_hz, factors)
            dur += t
            safe = np.where(t > 0, t, 1.0)
            util = {k: np.minimum(v / safe, 1.0) for k, v in peak.items()}
            energy += t * self._dynamic_w(util, toggle)
            e_dram += t * p.dram_w * util["dram"]
            for k, v in peak.items():
                peak_tot[k] = peak_tot.get(k, 0.0) + v
        floor = np.maximum(w["min_ns"][:, None], 1.0)
        pad = np.maximum(floor - dur, 0.0)  # a tiny kernel idles out its launch-to-finish floor
        energy += pad * p.active_dyn_w * self.v2f[None, :]
        dur = dur + pad
        util = {k: np.minimum(v / dur, 1.0) for k, v in peak_tot.items()}
        core = (p.static_w * self.v + p.idle_dyn_w * self.v2f)[None, :] + energy / dur
        dram = e_dram / dur
        return KernelTables(self.clocks, dur, self.board_w(core, dram), util, core, dram)

    def _phase(self, w: dict, share: dict, occ: np.ndarray, f_hz: np.ndarray, factors: tuple | None = None):
        """Time [K, C] of one phase doing share[field] of each kernel's work at occupancy occ, and the
        time each resource would need at its peak rate (for utilisation and power)."""
        p = self.p
        aw = np.maximum(occ, 1e-3)[:, None]
        occ_c = aw * (1 + p.occupancy_half_compute) / (aw + p.occupancy_half_compute)
        occ_m = aw * (1 + p.occupancy_half_memory) / (aw + p.occupancy_half_memory)
        x = {f: w[f] * share.get(f, 1.0) for f in WORK_FIELDS}
        peak = {}
        comp = 0.0
        for wf, rate_f, _ in COMPUTE_UNITS:
            peak[wf] = (x[wf][:, None] / (getattr(p, rate_f) * p.sms)) / f_hz * 1e9
            comp = comp + peak[wf]  # pipelines share the warp schedulers' issue slots
        peak["shared"] = (
            ((x["shared_bytes"] + x["l1_bytes"])[:, None] / (p.shared_bytes_per_sm_cycle * p.sms)) / f_hz * 1e9
        )
        peak["l2"] = (x["l2_bytes"][:, None] / p.l2_bytes_per_cycle) / f_hz * 1e9
        dram_bytes = (x["dram_read_bytes"] + x["dram_write_bytes"])[:, None]
        assert isinstance(comp, np.ndarray)  # COMPUTE_UNITS is not empty
        t_bw = np.broadcast_to(dram_bytes / p.dram_gbps, comp.shape)  # ns (GB/s == bytes/ns)
        dram_eff, expose, _, issue_eff = factors if factors is not None else shape_factors(w, p)
        t_issue = dram_bytes / (p.dram_issue_bytes_per_cycle * issue_eff) / f_hz * 1e9
        peak["dram"] = t_bw
        t_bw = t_bw / dram_eff
        # Little's law: the resident warps keep only so many bytes in flight, each request waits a DRAM
        # latency of fixed ns plus SM/L2/crossbar cycles, so at low occupancy bandwidth is latency-bound
        # and slows with the clock even for memory-bound work
        in_flight = aw * p.sms * p.max_warps_per_sm * p.dram_bytes_in_flight_per_warp
        # (stores are posted: a warp does not wait for a write's round trip, so only reads are bound)
        latency = p.dram_latency_ns + p.dram_latency_cycles / f_hz * 1e9
        t_lat = x["dram_read_bytes"][:, None] * latency / in_flight
        parts = np.stack(
            [comp / occ_c, peak["shared"] / occ_c, peak["l2"] / occ_m, np.maximum(np.maximum(t_bw, t_issue), t_lat)]
        )
        top = parts.max(axis=0)
        hide = p.hide_max * aw / (aw + p.hide_half)
        t = top + (1.0 - hide) * expose * (parts.sum(axis=0) - top)
        busy = (
            dram_bytes[:, 0]
            + x["l2_bytes"]
            + x["shared_bytes"]
            + x["l1_bytes"]
            + sum(x[wf] for wf, _, _ in COMPUTE_UNITS)
        ) > 0
        t = t + np.where(busy[:, None], p.phase_fill_cycles / f_hz * 1e9, 0.0)
        t = t + np.where(dram_bytes > 0, p.phase_fill_ns, 0.0)  # the first DRAM round trips
        return t, peak

    def _dynamic_w(self, util: dict, toggle: np.ndarray | float = 1.0) -> np.ndarray:
        """[K, C] core power above idle while a phase runs at these utilisations (DRAM's is apart);
        `toggle` [K, 1] scales the units' switching power (how often the kernel's operands flip bits).
        The shared issue / register-file power saturates in the pipes' summed utilisation s:
        unit_w_issue (1 + h) s / (s + h), so two half-busy pipes draw less of it than two busy ones."""
        p = self.p
        units = np.zeros_like(util["dram"])
        pipes = np.zeros_like(units)
        for wf, _, wt in COMPUTE_UNITS:
            units = units + getattr(p, wt) * util[wf]
            pipes = pipes + util[wf]
        units = units + p.unit_w_shared * util["shared"] + p.unit_w_l2 * util["l2"]
        if p.unit_w_issue > 0:
            s = pipes + util["shared"]
            units = units + p.unit_w_issue * (1 + p.issue_half) * s / (s + p.issue_half)
        return (p.active_dyn_w + units * toggle) * self.v2f[None, :]

    def contention(self, tab: KernelTables) -> tuple[np.ndarray, np.ndarray]:
        """[K, C] slow-downs while a collective transfers on the same GPU: of the compute kernel (it
        loses the NCCL channels' SMs on its SM-bound part and HBM bandwidth on its DRAM-bound part),
        and of the transfer (HBM shared in proportion to demand once kernel + transfer exceed it)."""
        p = self.p
        u_c = np.zeros_like(tab.dur_ns)
        for wf, _, _ in COMPUTE_UNITS:
            u_c = u_c + tab.util[wf]
        u_c = np.minimum(np.maximum(u_c, tab.util["shared"]), 1.0)
        u_d = tab.util["dram"]
        x = p.comm_hbm_per_link_byte * p.link_gbps / p.dram_gbps
        f = p.comm_sm_fraction
        slow = 1.0 + u_c * f / (1.0 - f) + u_d * x
        cslow = np.maximum(1.0, u_d + x)
        return slow, cslow

    def clock_delay_ns(self, rng: np.random.Generator, ci: int) -> float:
        """How long a clock request to clocks[ci] takes to land: a lognormal body (its 5th-95th
        percentiles `clock_delay_ms`, longer for targets above the voltage knee, where the regulator
        must settle) plus, for a few requests, a Pareto-tailed stall."""
        p = self.p
        lo, hi = p.clock_delay_ms
        f_to = float(self.clocks[ci])
        scale = 1.0 + p.clock_target_slope * max(0.0, f_to - p.knee_mhz) / max(self.fmax - p.knee_mhz, 1e-9)
        if lo > 0 and hi > lo:
            x = math.sqrt(lo * hi) * math.exp(math.log(hi / lo) / (2 * 1.6449) * float(rng.standard_normal()))
        else:
            x = 0.5 * (lo + hi)
        x *= scale
        if p.clock_tail_prob > 0 and float(rng.random()) < p.clock_tail_prob:
            x += min(p.clock_tail_ms * (1.0 + float(rng.pareto(p.clock_tail_alpha))), p.clock_tail_max_ms)
        return x * 1e6

    # ------------------------------------------------------------------ communication
    def collective_ns(self, spec: CollectiveSpec, mhz: float) -> float:
        """Transfer time of one collective once every participant has arrived (ring algorithms)."""
        p = self.p
        n = max(len(spec.ranks), 1)
        kind = spec.kind
        if kind == "allreduce":
            moved, steps, bw = 2.0 * (n - 1) / n * spec.nbytes, 2 * (n - 1), p.link_gbps
        elif kind in ("allgather", "reducescatter", "alltoall"):
            moved, steps, bw = (n - 1) / n * spec.nbytes, n - 1, p.link_gbps
        elif kind == "sendrecv":
            moved, steps, bw = float(spec.nbytes), 1, p.p2p_gbps
        else:
            raise ValueError(
                f"collective kind {kind!r} is not one of allreduce, allgather, reducescatter, alltoall, sendrecv"
            )
        t_link = moved / bw
        # the SMs copy/reduce the data: clock-bound only below ~comm_clock_fraction of max
        t_sm = t_link * (p.comm_clock_fraction * self.fmax / float(mhz))
        return (
            p.comm_base_ns
            + steps * p.link_latency_us * 1e3
            + float(_pnorm([np.float64(t_link), np.float64(t_sm)], 4.0))
        )

    def comm_spin_w(self, ci: int) -> float:
        return self.p.comm_spin_w * float(self.v2f[ci])

    def memcpy_ns(self, kind: str, nbytes: float) -> float:
        p = self.p
        bw = p.dtod_gbps if kind == "DtoD" else p.pcie_gbps
        return 1500.0 + nbytes / bw


def shape_factors(w: dict[str, np.ndarray], p: SimPhysics) -> tuple[np.ndarray, ...]:
    """[K, 1] per kernel, fixed by its work vector (its shape), not random from run to run, each
    spread evenly around 1: the share of dram_gbps its access pattern achieves (channel and bank
    conflicts, row-buffer locality) and how much of its non-dominant resources' time its instruction
    schedule leaves exposed (how its code interleaves them), the switching power its units draw
    (it follows the operands' bit patterns, not only the work done) and the rate its SMs issue DRAM
    requests at (bytes per request: vector or scalar loads, coalescing). None shows in a counter."""
    k = len(w[WORK_FIELDS[0]])
    h = np.full(k, 0x9E3779B97F4A7C15, dtype=np.uint64)
    for f in WORK_FIELDS:  # splitmix64 over the fields' bit patterns
        h = _mix64(h ^ np.ascontiguousarray(w[f], dtype=np.float64).view(np.uint64))
    u1 = (h >> np.uint64(11)).astype(np.float64) / 2.0**53
    h2 = _mix64(h)
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / 2.0**53
    h3 = _mix64(h2)
    u3 = (h3 >> np.uint64(11)).astype(np.float64) / 2.0**53
    u4 = (_mix64(h3) >> np.uint64(11)).astype(np.float64) / 2.0**53
    spread = lambda s, u: (1.0 + s * (2 * u - 1))[:, None]  # noqa: E731
    return (
        spread(p.shape_dram_spread, u1),
        spread(p.shape_hide_spread, u2),
        spread(p.shape_power_spread, u3),
        spread(p.shape_issue_spread, u4),
    )


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def phases(w: dict[str, np.ndarray], p: SimPhysics) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """A kernel's phases, derived from its work vector by kind: [(share of each work field, occupancy)].

    - matrix products (tensor-core work the largest compute part): a main loop (the tensor work, the
      operand reads through DRAM/L2/shared, part of the fp32 work) and an epilogue (the output
      writes, the rest of the fp32 work: bias, activation, scaling) at `epilogue_occupancy`;
    - attention (tensor-core work and SFU work, i.e. exp): the two matrix products and, between
      them, the softmax (the SFU work, most fp32 and int work) that they do not overlap;
    - everything else: one phase.
    Shares missing from a phase's dict default to the whole field for single-phase kernels and to
    zero in multi-phase ones (each field's shares over a kernel's phases sum to 1).
    """
    tensor = (
        w["fp16_tensor_flop"] / p.fp16_tensor_flop_per_sm_cycle + w["int8_tensor_op"] / p.int8_tensor_op_per_sm_cycle
    )
    other = (
        w["fp32_flop"] / p.fp32_flop_per_sm_cycle
        + w["fp64_flop"] / p.fp64_flop_per_sm_cycle
        + w["int_op"] / p.int_op_per_sm_cycle
        + w["sfu_op"] / p.sfu_op_per_sm_cycle
    )
    mm = (tensor > 0) & (tensor >= other)
    attn = (tensor > 0) & (w["sfu_op"] > 0)
    mm = mm & ~attn
    one = np.ones_like(tensor)
    zero = np.zeros_like(tensor)
    aw = w["active_warps"]
    single = ~(mm | attn)
    # fields per phase as [K] shares; a kernel of one kind gets zero shares in the other kinds' phases
    e32 = p.epilogue_fp32_share
    wr = w["dram_write_bytes"]
    # the output tile crosses L2 once: the epilogue's L2 share is the written bytes, the operand
    # re-reads (most of a matrix product's L2 traffic) belong to the main loop
    l2_wr = np.where(w["l2_bytes"] > 0, np.minimum(wr / np.maximum(w["l2_bytes"], 1e-30), 1.0), 0.0)
    out = []
    s1 = {f: np.where(single, 1.0, 0.0) for f in WORK_FIELDS}
    out.append((s1, aw))
    main = {f: zero for f in WORK_FIELDS}
    main.update(
        fp16_tensor_flop=one,
        int8_tensor_op=one,
        fp32_flop=one * (1 - e32),
        dram_read_bytes=one,
        shared_bytes=one,
        l1_bytes=one,
        l2_bytes=1 - l2_wr,
        int_op=one,
        fp64_flop=one,
        sfu_op=one,
    )
    epi = {f: zero for f in WORK_FIELDS}
    epi.update(fp32_flop=one * e32, dram_write_bytes=one, l2_bytes=l2_wr)  # int work: the main loop's addresses
    # the main loop hides latency with instruction-level parallelism (a warp's tile is many independent
    # MMAs, operands copied stages ahead) more than with resident warps: it behaves like `mainloop_ilp`
    # times its occupancy; the epilogue (dependent stores) does not
    out.append(
        (
            {f: np.where(mm, v, 0.0) for f, v in main.items()},
            np.maximum(aw, np.minimum(aw * p.mainloop_ilp, p.mainloop_occupancy)),
        )
    )
    out.append(({f: np.where(mm, v, 0.0) for f, v in epi.items()}, aw * p.epilogue_occupancy))
    # attention: QK^T (half the tensor work), softmax, PV (the other half and the output)
    half = one * 0.5
    qk = {f: zero for f in WORK_FIELDS}
    qk.update(
        fp16_tensor_flop=half,
        int8_tensor_op=half,
        shared_bytes=half,
        l1_bytes=half,
        dram_read_bytes=one,
        l2_bytes=(1 - l2_wr),
        fp32_flop=one * 0.1,
        fp64_flop=one,
    )
    sm = {f: zero for f in WORK_FIELDS}
    sm.update(sfu_op=one, fp32_flop=one * 0.8, int_op=one)
    pv = {f: zero for f in WORK_FIELDS}
    pv.update(
        fp16_tensor_flop=half,
        int8_tensor_op=half,
        shared_bytes=half,
        l1_bytes=half,
        dram_write_bytes=one,
        l2_bytes=l2_wr,
        fp32_flop=one * 0.1,
    )
    for ph in (qk, sm, pv):
        out.append(({f: np.where(attn, v, 0.0) for f, v in ph.items()}, aw))
    return out


def _pnorm(parts, p: float):
    """Smooth maximum: (sum x^p)^(1/p), computed scaled so that large p does not overflow."""
    m = parts[0]
    for x in parts[1:]:
        m = np.maximum(m, x)
    safe = np.where(m > 0, m, 1.0)
    acc = 0.0
    for x in parts:
        acc = acc + (x / safe) ** p
    return np.where(m > 0, safe * acc ** (1.0 / p), 0.0)
