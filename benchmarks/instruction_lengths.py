"""How long each virtual pipeline workload's instructions are, beside a measured Perseus job's (issue 45).

    python benchmarks/instruction_lengths.py [--seed 0] [--only PP4,gpt3xl]

An instruction is what Perseus sets one clock for: one forward or backward of one micro-batch on one
stage (`emo.baselines.perseus_schedule.instructions`: its compute kernels, first start to last end).
Each workload is traced on the virtual A100 at the max clock, noise off, for 2 iterations after a
warm-up; a line per workload gives each stage's median forward / backward in ms. For `gpt3xl`
(`conf/workload/pp-gpt3xl.yaml`) a second line gives the same medians from Perseus's real run of
gpt3-xl at plan 0 (every instruction at the max clock; `time_breakdown` of
`perseus/A100/.../merak+gpt3-xl+...+mbs8+nmb128+.../0.prof.json.gz`, warm-up iteration left out)
and the virtual/measured ratios of each stage's forward + backward and of their mean.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emo import benchreport  # noqa: E402
from emo.baselines.perseus_schedule import instructions  # noqa: E402
from emo.device.backends import open_device  # noqa: E402  (the checkout, not an installed emo)
from emo.trace import read_trace  # noqa: E402
from emo.workflow.plan import compose  # noqa: E402

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("instruction-lengths",)
HERE = Path(__file__).resolve().parent
GPT3XL_RUN = (
    HERE.parent.parent
    / "shared/data/perseus-sosp24/perseus/A100/dp1+pp4+tp1"
    / "merak+gpt3-xl+custom:0,8,14,21,27+dp1+pp4+tp1+mbs8+nmb128+PointSolution/0.prof.json.gz"
)
WORKLOADS = {
    "PP2": ["workload=pp", "workload.pp=2"],
    "PP4": ["workload=pp", "workload.pp=4"],
    "PP8": ["workload=pp", "workload.pp=8"],
    "TP2xPP2xDP2": ["workload=hybrid", "workload.tp=2", "workload.pp=2", "workload.dp=2"],
    "gpt3xl": ["workload=pp-gpt3xl"],
}


def stage_medians(events, stage_of_rank: dict[int, int]) -> dict[tuple[int, str], float]:
    """Median instruction time (ms) per (stage, kind) over every traced instruction of its ranks."""
    ins = instructions(events)
    ins = ins[ins["rank"].isin(list(stage_of_rank))]
    out = {}
    for (rank, kind), g in ins.groupby(["rank", "kind"]):
        key = (stage_of_rank[int(rank)], str(kind))
        out.setdefault(key, []).extend(g["dur_ns"].to_numpy() / 1e6)
    return {k: float(np.median(v)) for k, v in out.items()}


def stage_of_ranks(wl) -> dict[int, int]:
    """Each rank's pipeline stage: Megatron's order (emo.workloads.pp.Grid), TP ranks adjacent, then
    the data-parallel replicas, then the stages; a plain pipeline's rank is its stage."""
    per_stage = int(wl.get("tp", 1)) * int(wl.get("dp", 1)) if wl["kind"] == "hybrid" else 1
    return {r: r // per_stage for r in range(per_stage * int(wl["pp"]))}


def virtual(overrides: list[str], seed: int, iterations: int = 2, warmup: int = 1) -> dict[tuple[int, str], float]:
    cfg = compose([*overrides, "gpu.noise=0", f"gpu.seed={seed}"])
    dev = open_device(cfg["gpu"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dev.run(cfg["workload"], iterations, warmup=warmup, trace_dir=Path(tmp))
            events = read_trace(Path(tmp))
    finally:
        dev.close()
    return stage_medians(events, stage_of_ranks(cfg["workload"]))


def measured_gpt3xl(path: Path = GPT3XL_RUN) -> dict[tuple[int, str], float]:
    """Median forward / backward (ms) per stage of Perseus's gpt3-xl run at plan 0."""
    ranks = json.loads(gzip.open(path).read())
    return {
        (r["rank"], kind): 1e3 * float(np.median(np.concatenate(r["time_breakdown"][kind][1:])))
        for r in ranks
        for kind in ("forward", "backward")
    }


def pair_ms(med: dict[tuple[int, str], float], stage: int) -> float:
    """One micro-batch's forward and backward on a stage: what a stage spends per micro-batch."""
    return med[(stage, "forward")] + med[(stage, "backward")]


def line(name: str, med: dict[tuple[int, str], float]) -> str:
    stages = sorted({s for s, _ in med})
    cells = [
        f"{med.get((s, 'forward'), float('nan')):.1f}/{med.get((s, 'backward'), float('nan')):.1f}" for s in stages
    ]
    return f"{name:<12} forward/backward ms per stage: {'  '.join(cells)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchreport.add_flag(ap)
    ap.add_argument("--seed", type=int, default=0, help="gpu.seed (the chip)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    a = ap.parse_args(argv)
    for name in a.only.split(","):
        if name not in WORKLOADS:
            print(f"instruction_lengths: --only: no workload {name!r} ({', '.join(WORKLOADS)})", file=sys.stderr)
            return 2
        med = virtual(WORKLOADS[name], a.seed)
        print(line(name, med), flush=True)
        if name == "gpt3xl" and GPT3XL_RUN.exists():
            real = measured_gpt3xl()
            print(line("measured", real))
            pair = [pair_ms(med, s) / pair_ms(real, s) for s in range(len(real) // 2)]
            mean = np.mean([pair_ms(med, s) for s in range(len(pair))]) / np.mean(
                [pair_ms(real, s) for s in range(len(pair))]
            )
            print(
                f"{'':<12} virtual/measured forward + backward per stage: {', '.join(f'{r:.2f}' for r in pair)}; "
                f"mean {mean:.3f}"
            )
    return 0


if __name__ == "__main__":
    with benchreport.recording("instruction-lengths"):
        sys.exit(main())
