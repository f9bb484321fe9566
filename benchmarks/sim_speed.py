"""How fast the virtual GPU simulates: kernel events per second on a program of >= 1M kernel launches.

    python benchmarks/sim_speed.py [--kernels 1000000] [--gpu a100] [--trace]

The program is emo.workloads' tensor-parallel training step (8 GPUs, 32 layers, Domino overlap:
two streams per GPU, event record/wait, an all-reduce per chunk), repeated until the launch count is
reached. "Simulation" is everything `SimDevice.simulate` does: the kernel x clock tables, the
discrete-event run and the energy integration. Writing the Kineto traces is timed separately
(--trace), as it is a separate step. The last line is `kernel events/s: N` (wall clock).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import yaml

from emo import benchreport
from emo.device.sim import SimDevice
from emo.workloads import build_program

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("sim-speed",)
ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchreport.add_flag(ap)
    ap.add_argument("--kernels", type=int, default=1_000_000, help="at least this many kernel launches")
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--trace", action="store_true", help="also time writing the Kineto traces")
    args = ap.parse_args()

    cfg = yaml.safe_load((ROOT / "conf" / "gpu" / f"{args.gpu}.yaml").read_text())
    cfg.pop("defaults", None)
    dev = SimDevice(cfg)
    t0 = time.perf_counter()
    program = build_program({"kind": "tp", "tp": args.tp, "model": {"layers": args.layers}}, gpu=args.gpu)
    t_build = time.perf_counter() - t0
    per_iter = program.kernel_launches()
    iterations = max(1, math.ceil(args.kernels / per_iter))
    ops = sum(len(o) for o in program.ops) * iterations
    print(
        f"program: tp={args.tp} layers={args.layers} on {args.gpu}: {per_iter} launches/iteration "
        f"x {iterations} iterations ({ops} host ops), built in {t_build:.2f} s"
    )

    wall0, cpu0 = time.perf_counter(), time.process_time()
    res = dev.simulate(program, iterations)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    n = res.kernel_count
    print(
        f"simulated {n} kernels, {(res.t_end - res.t_start) * 1e-9:.2f} s of virtual time, "
        f"{sum(dev.energy_j(g) for g in range(program.ranks)):.0f} J on the counters"
    )
    print(
        f"simulation: {wall:.2f} s wall ({dev.last_sim_seconds:.2f} s event loop), {cpu:.2f} s CPU "
        f"-> {n / cpu:.0f} kernel events per CPU second"
    )
    if args.trace:
        from emo.device.sim.kineto import write_traces

        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            files = write_traces(res, program, dev, Path(tmp))
            dt = time.perf_counter() - t0
            size = sum(f.stat().st_size for f in files)
        print(f"trace writing: {dt:.2f} s for {len(files)} files, {size / 1e6:.0f} MB gzipped")
    print(f"kernel events/s: {n / wall:.0f}")


if __name__ == "__main__":
    with benchreport.recording("sim-speed"):
        main()
