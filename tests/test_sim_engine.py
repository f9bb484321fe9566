"""The virtual GPU's event semantics: clock changes, streams and events, syncs, collectives, power cap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from emo.device.sim import SimDevice
from emo.device.sim.program import CollectiveSpec, KernelSpec, Op, Program, Work
from emo.policy import FrequencyPolicy, Step

ROOT = Path(__file__).resolve().parents[1]

GEMM = KernelSpec(
    "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
    Work(fp16_tensor_flop=2e11, dram_read_bytes=5e8, active_warps=0.5),
    op_name="aten::mm",
)
BIG_GEMM = KernelSpec("sm80_xmma_gemm_big", Work(fp16_tensor_flop=2.5e13, active_warps=0.5), op_name="aten::mm")
ADD = KernelSpec("vectorized_elementwise_kernel", Work(dram_read_bytes=4e8, dram_write_bytes=2e8), op_name="aten::add")


def gpu_cfg(name: str = "a100", **over) -> dict:
    cfg = yaml.safe_load((ROOT / "conf" / "gpu" / f"{name}.yaml").read_text())
    cfg.pop("defaults", None)
    cfg.update(over)
    return cfg


def steady_cfg(**over) -> dict:
    """No noise and clock requests that land within 5-12 ms: for tests of the event mechanics."""
    cfg = gpu_cfg(noise=0.0, **over)
    cfg["physics"].update(clock_delay_ms=[5.0, 12.0], clock_tail_prob=0.0, clock_target_slope=0.0)
    return cfg


def one_rank(ops_fn) -> Program:
    p = Program(name="t", ranks=1, ops=[[]], streams={7: "compute", 20: "side"})
    p.ops[0] = ops_fn(p)
    return p


def kernels(res, rank=0):
    """(name-index, stream, start, end) of the kernels, in start order."""
    return sorted((k[1], k[2], k[3], k[4]) for k in res.ranks[rank].kernels)


# --------------------------------------------------------------------------- clocks
def test_clock_change_lands_after_a_heavy_tailed_latency() -> None:
    """A request lands after a lognormal body (5th-95th percentile clock_delay_ms) plus, for a few, a
    Pareto-tailed stall: the tail reaches far beyond the body, unlike a uniform 5-15 ms."""
    delays = []
    for seed in range(12):
        dev = SimDevice(gpu_cfg(seed=seed))
        prog = one_rank(lambda p: [(Op.ITER,)] + [(Op.LAUNCH, 7, p.kernel(GEMM))] * 60 + [(Op.DEVICE_SYNC,)])
        dev.set_policy(FrequencyPolicy("a100", {0: [Step(0.0, 1410), Step(20.0, 1005)]}))
        res = dev.simulate(prog, 1, policy=dev.policy)
        g = res.gpus[0]
        t_iter = res.ranks[0].iter_t[0]
        assert g.clock_ci[-1] == dev.clocks.index(1005)
        delays.append((g.clock_t[-1] - t_iter) / 1e6 - 20.0)
    assert all(d > 0 for d in delays) and np.std(delays) > 1.0, delays  # random, not a constant
    dev = SimDevice(gpu_cfg())
    rng = np.random.default_rng(1)
    ci = dev.clocks.index(1005)
    x = np.array([dev.gp.clock_delay_ns(rng, ci) for _ in range(20000)]) / 1e6
    lo, hi = dev.phys.clock_delay_ms
    assert np.percentile(x, 5) == pytest.approx(lo, rel=0.1)  # 1005 MHz is below the knee: the plain body
    assert np.percentile(x, 50) == pytest.approx(np.sqrt(lo * hi), rel=0.1)
    assert np.percentile(x, 100 * (1 - dev.phys.clock_tail_prob / 3)) > 2.5 * hi  # the tail: stalls reach far
    assert x.max() <= hi * 5 + dev.phys.clock_tail_max_ms
    up = np.array([dev.gp.clock_delay_ns(rng, len(dev.clocks) - 1) for _ in range(5000)]) / 1e6
    assert np.median(up) == pytest.approx((1 + dev.phys.clock_target_slope) * np.median(x), rel=0.1)


def test_last_request_wins_even_if_it_lands_first() -> None:
    finals = set()
    for seed in range(10):
        dev = SimDevice(gpu_cfg(seed=seed))
        prog = one_rank(lambda p: [(Op.ITER,)] + [(Op.LAUNCH, 7, p.kernel(GEMM))] * 80 + [(Op.DEVICE_SYNC,)])
        pol = FrequencyPolicy("a100", {0: [Step(10.0, 900), Step(11.0, 1200)]})
        res = dev.simulate(prog, 1, policy=pol)
        finals.add(dev.clocks[res.gpus[0].clock_ci[-1]])
    assert finals == {1200}


def test_kernel_spanning_a_clock_change_runs_at_each_clock_in_turn() -> None:
    dev = SimDevice(steady_cfg())
    prog = one_rank(lambda p: [(Op.ITER,), (Op.LAUNCH, 7, p.kernel(BIG_GEMM)), (Op.DEVICE_SYNC,)])
    res = dev.simulate(prog, 1, policy=FrequencyPolicy("a100", {0: [Step(30.0, 705)]}))
    ((_, _, start, end),) = kernels(res)
    tab = dev.gp.kernel_tables([BIG_GEMM.work]).dur_ns[0]
    d_hi, d_lo = tab[dev.clocks.index(1410)], tab[dev.clocks.index(705)]
    land = res.gpus[0].clock_t[-1]
    assert start < land < end
    expected = land + (1.0 - (land - start) / d_hi) * d_lo
    assert end == pytest.approx(expected, rel=1e-9)
    assert d_hi < end - start < d_lo


def test_power_cap_throttles_the_clock() -> None:
    dev = SimDevice(gpu_cfg())
    prog = one_rank(lambda p: [(Op.ITER,)] + [(Op.LAUNCH, 7, p.kernel(GEMM))] * 20 + [(Op.STREAM_SYNC, 7)])
    free = dev.run(prog, 40, warmup=1)
    dev.set_power_limit(250.0)
    capped = dev.run(prog, 40, warmup=1)
    assert capped.time_s > 1.3 * free.time_s
    # the controller acts over time: the window's first ~100 ms overshoot the limit a little
    assert capped.energy_j / capped.time_s < 1.03 * 250.0 < free.energy_j / free.time_s
    dev.set_power_limit(None)
    dev.sleep(0.5)  # the controller climbs back over time (test_sim_physics), here while idle
    again = dev.run(prog, 40, warmup=1)
    assert again.time_s == pytest.approx(free.time_s, rel=0.01)
    with pytest.raises(ValueError, match="power limit"):
        dev.set_power_limit(-5)


# --------------------------------------------------------------------------- streams, events, syncs
def test_wait_event_orders_streams_and_sync_blocks_the_host() -> None:
    def ops(p):
        g, a = p.kernel(GEMM), p.kernel(ADD)
        return [
            (Op.ITER,),
            (Op.LAUNCH, 7, g),
            (Op.RECORD, 1, 7),
            (Op.WAIT, 20, 1),
            (Op.LAUNCH, 20, a),
            (Op.STREAM_SYNC, 20),
            (Op.CPU, 1000, "after_sync"),
        ]

    dev = SimDevice(gpu_cfg())
    res = dev.simulate(one_rank(ops), 1)
    (k0, s0, a0, e0), (k1, s1, a1, e1) = kernels(res)
    assert (s0, s1) == (7, 20) and a1 >= e0  # the add waited for the GEMM through the event
    cpu = [c for c in res.ranks[0].cpu_ops if c[0] == "after_sync"][0]
    assert cpu[1] >= e1  # the host resumed only after stream 20 drained
    kinds = {h[0] for h in res.ranks[0].host}
    assert {0, 3, 4, 5} <= kinds


def test_event_sync_and_device_sync_block_until_done() -> None:
    def ops(p):
        g = p.kernel(GEMM)
        return [
            (Op.ITER,),
            (Op.LAUNCH, 7, g),
            (Op.RECORD, 3, 7),
            (Op.LAUNCH, 7, g),
            (Op.EVENT_SYNC, 3),
            (Op.CPU, 1000, "after_event"),
            (Op.DEVICE_SYNC,),
            (Op.CPU, 1000, "after_device"),
        ]

    res = SimDevice(gpu_cfg()).simulate(one_rank(ops), 1)
    (_, _, _, e0), (_, _, _, e1) = kernels(res)
    cpu = {c[0]: c[1] for c in res.ranks[0].cpu_ops}
    assert e0 <= cpu["after_event"] < e1 <= cpu["after_device"]


def test_compute_kernels_share_the_sms_but_copies_overlap() -> None:
    def ops(p):
        g = p.kernel(GEMM)
        return [
            (Op.ITER,),
            (Op.LAUNCH, 7, g),
            (Op.LAUNCH, 20, g),
            (Op.MEMCPY, 21, "HtoD", 1 << 26, False),
            (Op.DEVICE_SYNC,),
        ]

    res = SimDevice(gpu_cfg()).simulate(one_rank(ops), 1)
    (_, _, a0, e0), (_, _, a1, e1) = kernels(res)
    assert a1 >= e0  # one compute kernel at a time
    (copy,) = res.ranks[0].copies
    assert copy[4] < e0  # the copy ran during the first kernel


def test_blocking_memcpy_blocks_the_host() -> None:
    def ops(p):
        return [
            (Op.ITER,),
            (Op.LAUNCH, 7, p.kernel(GEMM)),
            (Op.MEMCPY, 7, "DtoH", 1 << 20, True),
            (Op.CPU, 1000, "after"),
        ]

    res = SimDevice(gpu_cfg()).simulate(one_rank(ops), 1)
    (copy,) = res.ranks[0].copies
    cpu = [c for c in res.ranks[0].cpu_ops if c[0] == "after"][0]
    assert cpu[1] >= copy[5] > kernels(res)[0][3]


# --------------------------------------------------------------------------- collectives and multi-rank
def two_rank_program(compute: int, coll_bytes: int, late_ns: int = 0, chunks: int = 4) -> Program:
    p = Program(name="tp2", ranks=2, ops=[[], []], streams={7: "compute", 20: "nccl"})
    g = p.kernel(GEMM)
    colls = [p.collective(CollectiveSpec("allreduce", (0, 1), coll_bytes)) for _ in range(chunks)]
    for r in range(2):
        ops = [(Op.ITER,)]
        if r == 1 and late_ns:
            ops.append((Op.CPU, late_ns, "late_dataloader"))
        for c in range(chunks):
            ops += [(Op.LAUNCH, 7, g)] * compute
            ops += [(Op.RECORD, c, 7), (Op.WAIT, 20, c), (Op.COLLECTIVE, 20, colls[c])]
        ops += [(Op.DEVICE_SYNC,)]
        p.ops[r] = ops
    return p


def test_collective_waits_for_the_slowest_rank() -> None:
    dev = SimDevice(gpu_cfg())
    res = dev.simulate(two_rank_program(compute=1, coll_bytes=64 << 20, late_ns=5_000_000, chunks=1), 1)
    c0, c1 = res.ranks[0].colls[0], res.ranks[1].colls[0]
    assert c0[4] == c1[4]  # both end together
    assert c1[3] - c0[3] > 4.5e6  # rank 0 arrived ~5 ms earlier and waited
    xfer = dev.gp.collective_ns(CollectiveSpec("allreduce", (0, 1), 64 << 20), 1410)
    assert c0[4] == pytest.approx(c1[3] + xfer)


def test_tp_program_is_slower_at_a_low_clock_where_compute_is_critical() -> None:
    def iter_time(prog, mhz):
        dev = SimDevice(gpu_cfg())
        if mhz:
            dev.set_policy(FrequencyPolicy.static("a100", 2, mhz))
        return dev.run(prog, 3, warmup=1).time_s

    compute_bound = two_rank_program(compute=8, coll_bytes=8 << 20)
    comm_bound = two_rank_program(compute=1, coll_bytes=1 << 30)
    assert iter_time(compute_bound, 1005) / iter_time(compute_bound, None) > 1.25
    assert iter_time(comm_bound, 1005) / iter_time(comm_bound, None) < 1.08


def test_missing_participant_is_reported_not_hung() -> None:
    p = Program(name="broken", ranks=2, ops=[[], []])
    c = p.collective(CollectiveSpec("allreduce", (0, 1), 1 << 20))
    p.ops[0] = [(Op.ITER,), (Op.COLLECTIVE, 20, c), (Op.DEVICE_SYNC,)]
    p.ops[1] = [(Op.ITER,), (Op.DEVICE_SYNC,)]
    with pytest.raises(ValueError, match="never finish|unfinished"):
        SimDevice(gpu_cfg()).simulate(p, 1)


def test_bad_ops_fail_with_one_line() -> None:
    p = one_rank(lambda p: [(Op.ITER,), (Op.LAUNCH, 7, 99)])
    with pytest.raises(ValueError, match="rank 0: bad op") as e:
        SimDevice(gpu_cfg()).simulate(p, 1)
    assert "\n" not in str(e.value)


def test_collectives_hardly_care_about_the_sm_clock_above_half_of_max() -> None:
    gp = SimDevice(gpu_cfg()).gp
    spec = CollectiveSpec("allreduce", (0, 1, 2, 3), 256 << 20)
    t_max, t_60, t_25 = (gp.collective_ns(spec, f) for f in (1410, 855, 345))
    assert t_60 / t_max < 1.06
    assert t_25 / t_max > 1.4
    p2p = CollectiveSpec("sendrecv", (0, 1), 64 << 20)
    assert gp.collective_ns(p2p, 1410) == pytest.approx(8e3 + 3e3 + (64 << 20) / 150.0, rel=0.02)


def test_waiting_for_a_peer_costs_only_idle_like_power() -> None:
    dev = SimDevice(gpu_cfg())
    res = dev.simulate(two_rank_program(compute=1, coll_bytes=1 << 20, late_ns=50_000_000, chunks=1), 1)
    wait = [x for x in res.gpus[0].xsegs if x[1] - x[0] > 40e6]
    assert wait and all(w[2] < 0.1 * dev.tdp_w for w in wait)  # NCCL spinning on top of the idle board


def test_policy_is_applied_like_the_runtime_applier() -> None:
    """Steps due within lead_ms of t = 0 are issued lead_ms before the expected end of the previous
    iteration (period_ms); requests not yet issued when the next iteration starts are dropped."""
    prog = one_rank(lambda p: [(Op.ITER,)] + [(Op.LAUNCH, 7, p.kernel(GEMM))] * 40 + [(Op.DEVICE_SYNC,)])
    dev = SimDevice(steady_cfg())
    base = dev.simulate(prog, 3)
    period_ms = (base.ranks[0].iter_t[2] - base.ranks[0].iter_t[1]) / 1e6
    pol = FrequencyPolicy(
        "a100",
        {0: [Step(0.0, 1005), Step(period_ms / 2, 1410), Step(10 * period_ms, 705)]},
        period_ms=period_ms,
        lead_ms=15.0,
    )
    res = SimDevice(steady_cfg()).simulate(prog, 4, policy=pol)
    marks = res.ranks[0].iter_t
    g = res.gpus[0]
    lands = {(round(t), ci) for t, ci in zip(g.clock_t[1:], g.clock_ci[1:])}
    ci1005 = SimDevice(gpu_cfg()).clocks.index(1005)
    assert ci1005 in g.clock_ci and SimDevice(gpu_cfg()).clocks.index(705) not in g.clock_ci  # never issued
    # from the second iteration on, 1005 lands within 10 ms before the iteration starts (issued 15 ms early)
    for m in marks[2:]:
        before = [t for t, ci in zip(g.clock_t, g.clock_ci) if ci == ci1005 and m - 16e6 < t <= m + 2e6]
        assert before, (m, sorted(lands))


def test_a_collective_launched_twice_by_one_rank_is_an_error() -> None:
    p = Program(name="twice", ranks=2, ops=[[], []])
    c = p.collective(CollectiveSpec("allreduce", (0, 1), 1 << 20))
    p.ops[0] = [(Op.ITER,), (Op.COLLECTIVE, 20, c), (Op.COLLECTIVE, 21, c), (Op.DEVICE_SYNC,)]
    p.ops[1] = [(Op.ITER,), (Op.CPU, 10_000_000, "late"), (Op.COLLECTIVE, 20, c), (Op.DEVICE_SYNC,)]
    with pytest.raises(ValueError, match="launched twice"):
        SimDevice(gpu_cfg()).simulate(p, 1)
