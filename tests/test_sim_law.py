"""The virtual GPU's power law is not the model's: non-additive activity power, per-chip variation,
temperature-dependent leakage, counters that are not exact, NVML utilisation as NVML defines it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from emo.device.sim import SimDevice
from emo.device.sim.program import CollectiveSpec, KernelSpec, Op, Program, Work

ROOT = Path(__file__).resolve().parents[1]
GEMM = KernelSpec(
    "gemm",
    Work(
        fp16_tensor_flop=2e11,
        dram_read_bytes=5e8,
        dram_write_bytes=1e8,
        l2_bytes=1e9,
        shared_bytes=4e9,
        fp32_flop=1e8,
        active_warps=0.35,
    ),
)


def gpu_cfg(name: str = "a100", **over) -> dict:
    cfg = yaml.safe_load((ROOT / "conf" / "gpu" / f"{name}.yaml").read_text())
    cfg.pop("defaults", None)
    cfg.update(over)
    return cfg


def test_activity_power_is_not_additive() -> None:
    """Power above idle of a kernel using two pipes differs from the sum of each pipe's alone (the
    shared issue power saturates; the regulators' loss grows with the square of the current)."""
    gp = SimDevice(gpu_cfg(noise=0.0)).gp
    fp32, sfu = Work(fp32_flop=4e10, active_warps=1.0), Work(sfu_op=5e9, active_warps=1.0)
    both = Work(fp32_flop=4e10, sfu_op=5e9, active_warps=1.0)
    tab = gp.kernel_tables([fp32, sfu, both])
    idle = gp.idle_power_w()
    e = (tab.power_w - idle[None, :]) * tab.dur_ns  # dynamic energy [K, C]
    top = -1
    assert abs(e[2, top] / (e[0, top] + e[1, top]) - 1) > 0.01


def test_each_chip_draws_its_own_power_and_the_seed_fixes_it() -> None:
    a, b = SimDevice(gpu_cfg(seed=0)), SimDevice(gpu_cfg(seed=0))
    idle = [float(a.idle_w_g[g][-1]) for g in range(8)]
    assert max(idle) / min(idle) > 1.03  # leakage and voltage differ between chips
    assert idle == [float(b.idle_w_g[g][-1]) for g in range(8)]
    assert SimDevice(gpu_cfg(seed=1)).idle_w_g[0][-1] != idle[0]


def test_a_warm_die_leaks_more() -> None:
    """The same kernel loop costs more energy once the die has warmed up under load, and the die
    cools back while it idles."""
    dev = SimDevice(gpu_cfg(noise=0.0))
    cold = dev.measure_work(GEMM.work, 1410, min_seconds=0.3)
    dev.measure_work(GEMM.work, 1410, min_seconds=20.0)  # warm up: several time constants
    theta = dev.meters[0].thermal.theta
    warm = dev.measure_work(GEMM.work, 1410, min_seconds=0.3)
    assert theta > 20.0 and warm.energy_j > 1.02 * cold.energy_j
    assert warm.time_s == pytest.approx(cold.time_s, rel=0.02)  # leakage costs energy, not time
    dev.sleep(30.0)
    assert dev.meters[0].thermal.theta < 0.05 * theta


def test_ncu_counters_vary_per_replay_pass_but_instruction_counts_are_exact() -> None:
    dev = SimDevice(gpu_cfg())
    a, b = dev.profile_range([GEMM]).counters, dev.profile_range([GEMM]).counters
    assert a["tensor_inst"] == b["tensor_inst"] and a["fma_inst"] == b["fma_inst"]
    assert a["sm_active_cycles"] != b["sm_active_cycles"] and a["dram_read_bytes"] != b["dram_read_bytes"]
    assert a["dram_read_bytes"] == pytest.approx(5e8, rel=0.05)
    exact = SimDevice(gpu_cfg(noise=0.0)).profile_range([GEMM]).counters
    assert exact["dram_read_bytes"] == pytest.approx(5e8, rel=1e-9)


def test_dcgm_ratios_are_sampled_not_exact() -> None:
    dev = SimDevice(gpu_cfg(counters="dcgm"))
    a, b = dev.profile_range([GEMM]).counters, dev.profile_range([GEMM]).counters
    assert a != b and all(0.0 <= v <= 1.0 for v in a.values())


def test_nvml_utilisation_counts_a_waiting_nccl_kernel() -> None:
    """GPU 1 launches its all-reduce at once and spins in it while GPU 0 computes: NVML reports it
    busy (one or more kernels executing), although it runs no compute kernel."""
    p = Program(name="wait", ranks=2, ops=[[], []])
    c = p.collective(CollectiveSpec("allreduce", (0, 1), 1 << 20))
    k = p.kernel(GEMM)
    p.ops[0] = [(Op.ITER,)] + [(Op.LAUNCH, 7, k)] * 40 + [(Op.COLLECTIVE, 7, c), (Op.DEVICE_SYNC,)]
    p.ops[1] = [(Op.ITER,), (Op.COLLECTIVE, 20, c), (Op.DEVICE_SYNC,)]
    dev = SimDevice(gpu_cfg(noise=0.0))
    dev.simulate(p, 10)  # ~0.4 s: two of NVML's 1/6 s sample periods
    assert dev.utilization(1)["gpu"] > 0.95 and dev.utilization(0)["gpu"] > 0.95
    assert not dev.last_sim.ranks[1].kernels  # no compute kernel ran there
    samples = dev.utilization_samples(1)["gpu"]
    assert samples and min(v for _, v in samples) > 0.9


def test_waiting_power_sits_near_published_idle_readings() -> None:
    """A100 idle at the max clock: tens of watts (Perseus's profiler assumes 70 W blocked on P2P),
    and it falls with the clock mostly through the voltage."""
    dev = SimDevice(gpu_cfg())
    c = dev.clocks
    hi, lo = float(dev.idle_w[c.index(1410)]), float(dev.idle_w[c.index(705)])
    assert 50.0 < hi < 75.0 and 0.6 * hi < lo < hi
    spin = hi + dev.gp.comm_spin_w(c.index(1410))
    assert hi < spin < hi + 30.0
