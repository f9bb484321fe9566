"""What each capture costs a run on the virtual GPU: the traced iteration time over the untraced one,
for `trace.capture` full (torch.profiler's CPU and CUDA activities) and light (CUPTI activity
records), per workload, over seeds (the device's noise).

    python benchmarks/trace_overhead.py [--seeds 3] [--overhead-us 2.0]

One line per workload, `WORKLOAD: full xA±s, light xB±s (untraced T ms)`; docs/gpu.md quotes them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("trace-overhead",)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from emo import benchreport  # noqa: E402

WORKLOADS = {  # label -> workload overrides
    "tp2 (default)": [],
    "gpt step (tp2, d 1024, seq 2048, batch 2)": [
        "workload.model.hidden=1024",
        "workload.model.heads=16",
        "workload.model.seq=2048",
        "workload.model.batch=2",
    ],
    "pp4": ["workload=pp", "workload.pp=4"],
    "offload": ["workload=offload"],
}


def iteration_s(cfg, capture: str | None, iterations: int) -> float:
    from omegaconf import OmegaConf

    from emo.device.sim.device import SimDevice
    from emo.workloads import build_program

    dev = SimDevice(cfg.gpu)
    try:
        prog = build_program(OmegaConf.to_container(cfg.workload, resolve=True), gpu=cfg.gpu.name)
        with tempfile.TemporaryDirectory() as d:
            r = dev.run(prog, iterations, warmup=1, trace_dir=Path(d) if capture else None, capture=capture or "full")
    finally:
        dev.close()
    return float(np.mean(r.iteration_times_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--overhead-us", type=float, default=None, help="gpu.physics.trace_overhead_us (default: the GPU's)"
    )
    ap.add_argument("--iterations", type=int, default=4)
    args = ap.parse_args()
    from hydra import compose, initialize_config_dir

    from emo.config import register

    register()
    extra = [f"gpu.physics.trace_overhead_us={args.overhead_us}"] if args.overhead_us is not None else []
    for label, ov in WORKLOADS.items():
        ratios: dict[str, list[float]] = {"full": [], "light": []}
        plain = []
        for seed in range(args.seeds):
            with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
                cfg = compose("config", overrides=["gpu=a100", f"gpu.seed={seed}", *ov, *extra])
            t0 = iteration_s(cfg, None, args.iterations)
            plain.append(t0)
            for cap in ratios:
                ratios[cap].append(iteration_s(cfg, cap, args.iterations) / t0)
        parts = [f"{c} x{np.mean(v):.4f}±{np.std(v, ddof=1) if len(v) > 1 else 0:.4f}" for c, v in ratios.items()]
        print(f"{label}: {', '.join(parts)} (untraced {1e3 * np.mean(plain):.2f} ms)", flush=True)


if __name__ == "__main__":
    with benchreport.recording("trace-overhead"):
        main()
