"""The virtual GPU as the device protocol sees it: configs, counters, determinism, traces, profiling."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from emo.device import COUNTERS, Device
from emo.device.backends import open_device
from emo.device.sim import SimDevice
from emo.device.sim.program import CollectiveSpec, KernelSpec, Op, Program, Work
from emo.policy import FrequencyPolicy

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("a100", "h100", "rtx3080ti", "v100")

GEMM = KernelSpec(
    "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
    Work(fp16_tensor_flop=2e11, dram_read_bytes=5e8, active_warps=0.5),
    op_name="aten::mm",
    grid=(128, 4, 1),
    block=(256, 1, 1),
)
ADD = KernelSpec(
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
    Work(dram_read_bytes=4e8, dram_write_bytes=2e8),
    op_name="aten::add",
)


def gpu_cfg(name: str = "a100", **over) -> dict:
    cfg = yaml.safe_load((ROOT / "conf" / "gpu" / f"{name}.yaml").read_text())
    cfg.pop("defaults", None)
    cfg.update(over)
    return cfg


def tp_like(ranks: int = 2, layers: int = 3) -> Program:
    """Two streams per rank, event record/wait, an all-reduce per layer, a sync per iteration."""
    p = Program(name="tp-like", ranks=ranks, ops=[[] for _ in range(ranks)], streams={7: "compute", 20: "nccl"})
    g, a = p.kernel(GEMM), p.kernel(ADD)
    colls = [p.collective(CollectiveSpec("allreduce", tuple(range(ranks)), 32 << 20)) for _ in range(layers)]
    for r in range(ranks):
        ops = [(Op.ITER,), (Op.MEMCPY, 7, "HtoD", 1 << 20, False), (Op.BEGIN, "## forward ##")]
        for i in range(layers):
            ops += [
                (Op.CPU, 4000, "aten::view"),
                (Op.LAUNCH, 7, g),
                (Op.LAUNCH, 7, a),
                (Op.RECORD, i, 7),
                (Op.WAIT, 20, i),
                (Op.COLLECTIVE, 20, colls[i]),
                (Op.RECORD, 100 + i, 20),
                (Op.WAIT, 7, 100 + i),
            ]
        ops += [(Op.END,), (Op.STREAM_SYNC, 7), (Op.EVENT_SYNC, 100 + layers - 1), (Op.DEVICE_SYNC,)]
        p.ops[r] = ops
    return p


# --------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name", MODELS)
def test_gpu_configs_compose_with_hydra_and_build(name: str) -> None:
    from hydra import compose, initialize_config_dir

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"gpu={name}"]).gpu
    dev = open_device(cfg)
    assert isinstance(dev, Device) and dev.name == name
    clocks = dev.supported_clocks()
    assert clocks == sorted(clocks) and dev.default_clock() == clocks[-1]
    dur = dev.gp.kernel_tables([GEMM.work]).dur_ns[0]
    assert all(dur[i] >= dur[i + 1] for i in range(len(dur) - 1))  # faster at higher clocks


def test_v100_has_its_irregular_clock_table() -> None:
    clocks = SimDevice(gpu_cfg("v100")).supported_clocks()
    assert {1380, 945, 802, 1530, 135} <= set(clocks)
    assert len(set(b - a for a, b in zip(clocks, clocks[1:]))) == 2  # alternating 7/8 MHz steps


def test_bad_physics_key_is_a_one_line_error() -> None:
    cfg = gpu_cfg()
    cfg["physics"]["dram_gpbs"] = 1.0
    with pytest.raises(ValueError, match="dram_gpbs") as e:
        SimDevice(cfg)
    assert "\n" not in str(e.value)
    cfg = gpu_cfg()
    cfg["physics"]["clock_delay_ms"] = [15, 5]
    with pytest.raises(ValueError, match="clock_delay_ms"):
        SimDevice(cfg)


def test_voltage_flat_below_the_knee() -> None:
    dev = SimDevice(gpu_cfg())
    v = dev.gp.volt_rel([300, 700, 1000, 1200, 1410])
    assert v[0] == v[1] == v[2] < v[3] < v[4] == pytest.approx(1.0)


# --------------------------------------------------------------------------- counters
def test_energy_counter_is_in_millijoules_and_updates_every_100_ms() -> None:
    dev = SimDevice(gpu_cfg())
    dev.sleep(0.05)
    readings, times = [], []
    for _ in range(100):  # 1 s in 10 ms steps, idle
        dev.sleep(0.01)
        readings.append(dev.energy_j(0))
        times.append(dev.time_s())
    assert all(abs(r * 1000 - round(r * 1000)) < 1e-6 for r in readings)
    changes = [times[i] for i in range(1, len(readings)) if readings[i] != readings[i - 1]]
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    assert len(changes) in (9, 10) and all(gap == pytest.approx(0.1, abs=0.011) for gap in gaps)
    idle_w = (readings[-1] - readings[0]) / (times[-1] - times[0])
    assert 30 < idle_w < 150  # an idle A100 board
    assert dev.power_w(0) == pytest.approx(idle_w, rel=0.15)


def test_energy_keeps_accumulating_across_calls() -> None:
    dev = SimDevice(gpu_cfg())
    prog = tp_like()
    r1 = dev.run(prog, 3)
    e_mid, t_mid = dev.energy_j(0), dev.time_s()
    r2 = dev.run(prog, 3)
    assert dev.time_s() > t_mid + r2.time_s and dev.energy_j(0) > e_mid > 0
    assert r1.energy_per_device_j[0] > 0


def test_run_result_energy_matches_the_power_times_time() -> None:
    dev = SimDevice(gpu_cfg())
    p = Program(
        name="steady", ranks=1, ops=[[(Op.ITER,)] + [(Op.LAUNCH, 7, 0)] * 10 + [(Op.STREAM_SYNC, 7)]], kernels=[GEMM]
    )
    dev.set_power_limit(600.0)  # this GEMM draws ~503 W: above the 500 W TDP the controller would throttle it
    res = dev.run(p, 60)
    tab = dev.gp.kernel_tables([GEMM.work])
    p_kernel = tab.power_w[0, -1]
    assert res.energy_j / res.time_s == pytest.approx(p_kernel, rel=0.02)


# --------------------------------------------------------------------------- determinism
def run_traced(tmp: Path, seed: int, noise: float = 1.0):
    dev = SimDevice(gpu_cfg(seed=seed, noise=noise))
    dev.set_policy(FrequencyPolicy("a100", {0: [], 1: []}))
    res = dev.run(tp_like(), 4, warmup=1, trace_dir=tmp)
    return res, [gzip.decompress(f.read_bytes()) for f in res.trace_files]


def test_same_seed_same_trace_and_energy_other_seed_differs(tmp_path: Path) -> None:
    a, ta = run_traced(tmp_path / "a", 7)
    b, tb = run_traced(tmp_path / "b", 7)
    c, tc = run_traced(tmp_path / "c", 8)
    assert ta == tb and a.energy_j == b.energy_j and a.time_s == b.time_s
    assert ta != tc and a.energy_j != c.energy_j


# --------------------------------------------------------------------------- traces
@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    dev = SimDevice(gpu_cfg())
    res = dev.run(tp_like(), 3, warmup=2, trace_dir=out)
    docs = [json.loads(gzip.decompress(f.read_bytes())) for f in res.trace_files]
    return res, docs


def test_one_kineto_file_per_rank_with_distributed_info(trace) -> None:
    res, docs = trace
    assert [f.name for f in res.trace_files] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    for r, d in enumerate(docs):
        assert d["distributedInfo"]["backend"] == "nccl"
        assert (d["distributedInfo"]["rank"], d["distributedInfo"]["world_size"]) == (r, 2)
        assert d["deviceProperties"][0]["name"] == "NVIDIA A100-SXM4-80GB" and d["schemaVersion"] == 1
        assert isinstance(d["baseTimeNanoseconds"], int)


def test_trace_has_the_categories_and_fields_torch_profiler_writes(trace) -> None:
    _, docs = trace
    ev = docs[0]["traceEvents"]
    cats = Counter(e.get("cat") for e in ev if e.get("ph") == "X")
    assert {"cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "cuda_sync", "Trace"} <= set(cats)
    names = {e["name"] for e in ev if e.get("cat") == "cuda_runtime"}
    assert {
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cudaEventRecord",
        "cudaStreamWaitEvent",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaDeviceSynchronize",
    } <= names
    steps = sorted(e["name"] for e in ev if e["name"].startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    syncs = {e["name"]: e for e in ev if e.get("cat") == "cuda_sync"}
    assert set(syncs) == {"Stream Sync", "Event Sync", "Context Sync", "Stream Wait Event"}
    wait = syncs["Stream Wait Event"]["args"]
    assert wait["wait_on_cuda_event_record_corr_id"] > 0 and wait["wait_on_stream"] in (7, 20)
    kern = next(e for e in ev if e.get("cat") == "kernel" and e["name"] == GEMM.name)
    assert {"External id", "device", "stream", "correlation", "grid", "block"} <= set(kern["args"])
    assert kern["pid"] == 0 and kern["tid"] == 7 and kern["args"]["grid"] == [128, 4, 1]
    assert isinstance(kern["ts"], float)


def test_every_launch_has_a_flow_to_its_kernel(trace) -> None:
    _, docs = trace
    ev = docs[1]["traceEvents"]
    starts = {e["id"]: e for e in ev if e.get("ph") == "s"}
    ends = {e["id"]: e for e in ev if e.get("ph") == "f"}
    gpu = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")}
    launches = {e["args"]["correlation"]: e for e in ev if e.get("name") in ("cudaLaunchKernel", "cudaMemcpyAsync")}
    assert set(starts) == set(ends) == set(gpu) == set(launches)
    for c, k in gpu.items():
        assert k["ts"] >= launches[c]["ts"] and ends[c]["ts"] == k["ts"] and ends[c]["bp"] == "e"
        assert k["args"]["External id"] == launches[c]["args"]["External id"]


def test_nccl_kernels_carry_collective_args_and_end_together(trace) -> None:
    _, docs = trace
    per_rank = []
    for d in docs:
        nccl = sorted(
            (e for e in d["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")),
            key=lambda e: e["ts"],
        )
        assert nccl[0]["name"] == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
        a = nccl[0]["args"]
        assert a["Collective name"] == "allreduce" and a["dtype"] == "BFloat16" and a["Group size"] == 2
        assert a["In msg nelems"] == (32 << 20) // 2 and a["Process Group Ranks"] == "[0, 1]"
        per_rank.append([round(e["ts"] + e["dur"], 3) for e in nccl])
        assert any(e["name"] == "record_param_comms" for e in d["traceEvents"])
        assert any(e["name"] == "nccl:all_reduce" for e in d["traceEvents"])
    assert per_rank[0] == pytest.approx(per_rank[1], abs=0.002)  # shared clock: the ends agree


# --------------------------------------------------------------------------- microbenchmarks and profiling
def test_run_microbenchmark_from_the_registry() -> None:
    dev = SimDevice(gpu_cfg())
    hi = dev.run_microbenchmark("hmma_bf16_high", 1410, min_seconds=0.3)
    lo = dev.run_microbenchmark("hmma_bf16_high", 705, min_seconds=0.3)
    assert lo.time_s / hi.time_s == pytest.approx(2.0, rel=0.02)
    assert lo.energy_j < hi.energy_j and hi.sm_mhz == 1410
    idle_hi = dev.run_microbenchmark("idle", 1410, min_seconds=0.3)
    assert idle_hi.time_s == pytest.approx(1e-3, rel=0.05)
    with pytest.raises(ValueError, match="not in the registry"):
        dev.run_microbenchmark("nope", 1410)
    with pytest.raises(ValueError, match="supported clock"):
        dev.run_microbenchmark("idle", 1411)


def test_profile_range_reports_table_ii_counters_and_costs_time() -> None:
    dev = SimDevice(gpu_cfg())
    t0 = dev.time_s()
    res = dev.profile_range([GEMM, ADD])
    assert tuple(res.counters) == COUNTERS
    # instruction counts are exact; bytes carry their replay pass's error (noise_counter_ncu, 1 %)
    assert res.counters["tensor_inst"] > 0 and res.counters["dram_read_bytes"] == pytest.approx(9e8, rel=0.03)
    assert res.passes > 1 and res.cost_s > 0 and dev.time_s() == pytest.approx(t0 + res.cost_s)


def test_counter_noise_keeps_it_monotonic_and_unbiased() -> None:
    p = Program(
        name="steady", ranks=1, ops=[[(Op.ITER,)] + [(Op.LAUNCH, 7, 0)] * 10 + [(Op.STREAM_SYNC, 7)]], kernels=[GEMM]
    )
    clean = SimDevice(gpu_cfg(noise=0.0)).run(p, 100)
    dev = SimDevice(gpu_cfg(noise=1.0))  # the published sizes (conf/gpu physics noise_*)
    noisy = dev.run(p, 100)
    assert noisy.energy_j != clean.energy_j
    assert noisy.energy_j == pytest.approx(clean.energy_j, rel=0.03)  # ~20 updates: noise averages down
    readings = []
    for _ in range(30):
        dev.sleep(0.05)
        readings.append(dev.energy_j(0))
    assert readings == sorted(readings)
