"""Tensor-parallel compute and all-reduce times on the virtual GPU beside an estimate from public figures.

    python benchmarks/tp_figures.py [--gpus a100,h100] [--tp 2,4,8] [--overlap domino,megatron]

For each cell it runs one training step of the `tp` workload (its default shape: 4 layers of a
4096-hidden GPT, 4 x 2048 tokens) on the virtual GPU, reads rank 0's Kineto trace and prints
- GEMM TFLOP/s: the GEMMs' tensor FLOPs (from the program's shapes) over their kernel time, and that
  as a share of the datasheet's dense bf16 peak;
- the TP all-reduces' bus bandwidth as nccl-tests defines it (2(n-1)/n x bytes / time), the median
  over the step's bf16 all-reduces;
- all-reduce time over GEMM time (sim) beside the range public figures give for the same bytes and
  FLOPs (GEMMs at 60-80 % of peak, all-reduces at the nccl-tests bus bandwidth range of the GPU),
  and all-reduce time over all compute-kernel time.
docs/workloads.md gives the sources and the arithmetic; tests/test_workloads_tp_figures.py checks
the same figures against the same ranges.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Public figures (docs/workloads.md, "TP compute and communication against public figures"):
# dense bf16 tensor-core peak from the datasheets (A100 SXM4: 312 TFLOP/s; H100 SXM5: 989 TFLOP/s),
# the share of it cuBLAS reaches on transformer-sized GEMMs, and nccl-tests' all_reduce_perf bus
# bandwidth within one NVSwitch node at the TP messages' sizes (8-64 MB).
PEAK_TFLOPS = {"a100": 312.0, "h100": 989.0}
GEMM_EFFICIENCY = (0.60, 0.80)
BUSBW_GBPS = {"a100": (170.0, 235.0), "h100": (300.0, 480.0)}


def gpu_config(name: str):
    from hydra import compose, initialize_config_dir

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("config", overrides=[f"gpu={name}"]).gpu


def figures(gpu: str, workload: dict) -> dict:
    """The measured figures of one training step of `workload` on the virtual `gpu` (see the module doc)."""
    from emo.device.sim import SimDevice
    from emo.device.sim.program import Op
    from emo.workloads import build_program

    program = build_program(workload, gpu=gpu)
    n = program.ranks
    gemm_flops = sum(
        program.kernels[op[2]].work.fp16_tensor_flop
        for op in program.ops[0]
        if op[0] == Op.LAUNCH and "gemm" in program.kernels[op[2]].name
    )
    dev = SimDevice(gpu_config(gpu))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            res = dev.run(program, 1, warmup=1, trace_dir=Path(tmp))
            ranks = []
            for f in res.trace_files:
                with gzip.open(f, "rt") as fh:
                    ranks.append(json.load(fh)["traceEvents"])
    finally:
        dev.close()
    kernels = [e for e in ranks[0] if e.get("cat") == "kernel"]

    def all_reduces(events):
        return [
            e
            for e in events
            if e.get("cat") == "kernel"
            and e["name"].startswith("ncclDevKernel_AllReduce")
            and e["args"].get("dtype") == "BFloat16"
        ]

    # an NCCL kernel starts when its rank launches it and waits there for its peers: the last rank to
    # arrive sees the transfer alone, so each collective's time is its shortest kernel over the ranks
    per_rank = [all_reduces(ev) for ev in ranks]
    ar = [min(same, key=lambda e: e["dur"]) for same in zip(*per_rank)]
    gemm_us = sum(e["dur"] for e in kernels if "gemm" in e["name"])
    compute_us = sum(e["dur"] for e in kernels if not e["name"].startswith("ncclDevKernel"))
    ar_us = sum(e["dur"] for e in ar)
    ar_bytes = [e["args"]["In msg nelems"] * 2 for e in ar]
    moved = 2.0 * (n - 1) / n
    busbw = statistics.median(moved * b / (e["dur"] * 1e3) for b, e in zip(ar_bytes, ar)) if ar else float("nan")
    out = {
        "gpu": gpu,
        "tp": n,
        "gemm_tflops": gemm_flops / (gemm_us * 1e6),
        "busbw_gbps": busbw,
        "ar_over_gemm": ar_us / gemm_us,
        "ar_over_compute": ar_us / compute_us,
        "step_ms": res.time_s * 1e3,
    }
    if gpu in PEAK_TFLOPS:
        peak, (bw_lo, bw_hi), (e_lo, e_hi) = PEAK_TFLOPS[gpu], BUSBW_GBPS[gpu], GEMM_EFFICIENCY
        ar_s = moved * sum(ar_bytes) * 1e-9  # GB moved per rank; / GB/s = s
        out["gemm_share_of_peak"] = out["gemm_tflops"] / peak
        out["estimate_ar_over_gemm"] = (
            ar_s / bw_hi / (gemm_flops / (e_lo * peak * 1e12)),
            ar_s / bw_lo / (gemm_flops / (e_hi * peak * 1e12)),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="a100,h100")
    ap.add_argument("--tp", default="2,4,8")
    ap.add_argument("--overlap", default="domino,megatron")
    a = ap.parse_args()
    print(
        f"{'cell':<22}{'GEMM TFLOP/s':>13}{'of peak':>9}{'busbw GB/s':>12}{'AR/GEMM':>9}"
        f"{'public est.':>13}{'AR/compute':>12}{'step ms':>9}"
    )
    for gpu in a.gpus.split(","):
        for overlap in a.overlap.split(","):
            for tp in map(int, a.tp.split(",")):
                f = figures(gpu, {"kind": "tp", "tp": tp, "overlap": overlap})
                lo, hi = f.get("estimate_ar_over_gemm", (float("nan"),) * 2)
                print(
                    f"{f'{gpu} TP{tp} {overlap}':<22}{f['gemm_tflops']:>13.0f}{f.get('gemm_share_of_peak', 0):>9.0%}"
                    f"{f['busbw_gbps']:>12.0f}{f['ar_over_gemm']:>9.2f}{f'{lo:.2f}-{hi:.2f}':>13}"
                    f"{f['ar_over_compute']:>12.2f}{f['step_ms']:>9.1f}"
                )


if __name__ == "__main__":
    main()
