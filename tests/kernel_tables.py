"""Long tables for the open calibration interface (emo.model.kernels), measured on the virtual GPU:
the microbenchmark suite and a dozen kernels shaped like a training step's (GEMMs, attention,
elementwise, normalisation, optimizer, int8 convolution, FP64 stencil), each at several clocks,
with counters in DCGM form (activity ratios) or ncu form (totals per range)."""

from __future__ import annotations

import pandas as pd

from emo.device.nvml import NCU_METRICS
from emo.device.sim import SimDevice
from emo.device.sim.profiling import dcgm_fields
from emo.device.sim.program import Work
from emo.microbench import load_registry
from emo.workflow.plan import compose

KERNELS = {
    "gemm_bf16": Work(
        fp16_tensor_flop=1.4e11,
        dram_read_bytes=1.0e8,
        dram_write_bytes=3.4e7,
        l2_bytes=4e8,
        shared_bytes=2e9,
        fp32_flop=1e8,
        active_warps=0.5,
    ),
    "gemm_small": Work(
        fp16_tensor_flop=8.6e9,
        dram_read_bytes=3e7,
        dram_write_bytes=1e7,
        l2_bytes=1e8,
        shared_bytes=3e8,
        active_warps=0.25,
    ),
    "elementwise": Work(dram_read_bytes=2e8, dram_write_bytes=1e8, fp32_flop=2.5e7, int_op=5e7, active_warps=1.0),
    "layernorm": Work(
        dram_read_bytes=1e8, dram_write_bytes=1e8, fp32_flop=5e8, sfu_op=2.5e7, shared_bytes=2e8, active_warps=0.75
    ),
    "softmax": Work(dram_read_bytes=1e8, dram_write_bytes=1e8, sfu_op=5e7, fp32_flop=3e8, active_warps=0.6),
    "attention": Work(
        fp16_tensor_flop=5e10, shared_bytes=4e9, fp32_flop=2e9, sfu_op=1e8, dram_read_bytes=1e8, active_warps=0.4
    ),
    "stencil_fp64": Work(fp64_flop=2e10, dram_read_bytes=4e8, dram_write_bytes=1e8, active_warps=0.8),
    "reduction": Work(dram_read_bytes=4e8, int_op=1e8, shared_bytes=1e8, active_warps=0.5),
    "gather": Work(l2_bytes=5e8, dram_read_bytes=2e8, int_op=5e7, active_warps=0.3),
    "adam": Work(dram_read_bytes=6e8, dram_write_bytes=4e8, fp32_flop=1e9, sfu_op=5e7, active_warps=1.0),
    "conv_int8": Work(
        int8_tensor_op=1e11, dram_read_bytes=5e7, dram_write_bytes=2e7, shared_bytes=1e9, active_warps=0.5
    ),
    "hash_int": Work(int_op=5e10, l1_bytes=1e9, active_warps=0.9),
}


def _counters(dev: SimDevice, work: Work, form: str) -> dict[str, float]:
    if form == "dcgm":
        tab = dev.gp.kernel_tables([work])
        f = dev.clocks[dev.default_ci]
        return dcgm_fields([work], tab.dur_ns[:, dev.default_ci], f * 1e6, dev.phys)
    c = dev.profile_range([work]).counters
    return {NCU_METRICS[k][0]: v for k, v in c.items()}


def sim_tables(
    gpu: str = "a100",
    form: str = "dcgm",
    n_clocks: int = 10,
    step: int = 6,
    idle: bool = True,
    min_seconds: float = 0.05,
    overrides: tuple = (),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(bench, targets) long tables: name, sm_mhz, time_s, power_w, counter columns."""
    cfg = compose([f"gpu={gpu}", "tracking.enabled=false", *overrides])["gpu"]
    dev = SimDevice(cfg)
    top = dev.clocks.index(dev.default_clock())
    clocks = [dev.clocks[top - step * i] for i in range(n_clocks)]
    reg = load_registry()

    def rows(name: str, work: Work) -> list[dict]:
        c = _counters(dev, work, form)
        out = []
        for f in clocks:
            m = dev.measure_work(work, f, min_seconds, name=name)
            out.append({"name": name, "sm_mhz": f, "time_s": m.time_s, "power_w": m.energy_j / m.time_s, **c})
        return out

    bench = [r for n, e in reg.items() if idle or n != "idle" for r in rows(n, Work(**e["work"]))]
    targets = [r for n, w in KERNELS.items() for r in rows(n, w)]
    return pd.DataFrame(bench), pd.DataFrame(targets)
