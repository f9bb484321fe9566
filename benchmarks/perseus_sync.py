"""What Perseus's synchronize costs a pipeline, with each P2P receive posted early or paired.

    python benchmarks/perseus_sync.py [--seed 0]

Perseus's controller calls `torch.cuda.synchronize()` at the start of every forward and backward
instruction before it changes the clock (docs/baselines.md). On the virtual A100, noise off, each
pipeline runs a host-triggered policy that holds the max clock at every instruction, with and
without that synchronize, under both receive patterns of the PP workloads (`workload.recv`:
`paired`, Megatron's 1F1B, and `early`). A line per workload and pattern: the iteration time
without and with the synchronize and their ratio; the last line is `sync cost on PP4: paired X,
early Y` (ratios).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emo import benchreport  # noqa: E402
from emo.device.backends import open_device  # noqa: E402  (the checkout, not an installed emo)
from emo.policy import FrequencyPolicy, Step, Trigger  # noqa: E402
from emo.workflow.plan import compose  # noqa: E402

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("perseus-sync",)
SCOPES = ("forward_step", "backward_step")  # Perseus's instructions
WORKLOADS = {
    "PP2": ["workload=pp", "workload.pp=2"],
    "PP4": ["workload=pp", "workload.pp=4"],
    "PP8": ["workload=pp", "workload.pp=8"],
    "TP2xPP2xDP2": ["workload=hybrid"],
}
ITERATIONS = 3


def iteration_s(overrides: list[str], synchronize: bool) -> float:
    cfg = compose([*overrides, "gpu.noise=0"])
    wl, dev = cfg["workload"], open_device(cfg["gpu"])
    ranks = int(wl.get("tp", 1)) * int(wl["pp"]) * int(wl.get("dp", 1)) if wl["kind"] == "hybrid" else int(wl["pp"])
    top = dev.default_clock()
    steps = [Step(0.0, top)] * (2 * int(wl["microbatches"]))  # one per instruction
    try:
        dev.set_policy(
            FrequencyPolicy(
                gpu=dev.name, steps={r: list(steps) for r in range(ranks)}, trigger=Trigger(SCOPES, synchronize)
            )
        )
        return dev.run(wl, ITERATIONS, warmup=1).time_s / ITERATIONS
    finally:
        dev.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchreport.add_flag(ap)
    ap.add_argument("--seed", type=int, default=0, help="gpu.seed (the chip)")
    args = ap.parse_args()
    cost = {}
    for name, over in WORKLOADS.items():
        for recv in ("paired", "early"):
            o = [*over, f"workload.recv={recv}", f"gpu.seed={args.seed}"]
            free, synced = iteration_s(o, False), iteration_s(o, True)
            cost[(name, recv)] = synced / free
            print(
                f"{name:<12} recv={recv:<7} {1e3 * free:8.2f} ms without, {1e3 * synced:8.2f} ms with the "
                f"synchronize: x{synced / free:.3f}",
                flush=True,
            )
    print(f"sync cost on PP4: paired {cost[('PP4', 'paired')]:.3f}, early {cost[('PP4', 'early')]:.3f}")
    return 0


if __name__ == "__main__":
    with benchreport.recording("perseus-sync"):
        sys.exit(main())
