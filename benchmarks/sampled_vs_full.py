"""A job planned from one data-parallel replica's traces against the same job planned from every
rank's, both validated on the virtual GPU with every rank measured (emo.sampling, docs/scale.md).

Default: TP2 x PP4 x DP16 (128 GPUs) on the virtual A100, budget 2 %, seeds 0 1 2, each seed in a
process of its own (--parallel). Per seed, one calibration; then each path runs the chain (trace,
graph, pack, profile, fit, optimize, validate) in-process in a fresh folder. Both paths use the same
shortened settings, so they differ only in the ranks traced and planned from: no settle, one level
clock, 3 untraced iterations, profile's baselines over >= 1 s (BASELINE_SECONDS patched from 5 s),
validate over >= 1 s, and the optimizer's local search at 100 predictor evaluations (default 400;
the all-ranks plan's 128 GPUs cost the predictor 16 times the sampled plan's 8 per evaluation).
One line per run, then per path the mean and spread over seeds, and the per-seed difference.

    python benchmarks/sampled_vs_full.py [--seeds 0 1 2] [--parallel 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

JOB = [
    "workload=hybrid",
    "workload.tp=2",
    "workload.pp=4",
    "workload.dp=16",
    "gpu.settle_s=0",
    "model.level_fractions=[0.7]",
    "validate.min_seconds=1",
    "trace.untraced_iterations=3",
    "optimizer.predictor_evaluations=100",
]

CHAIN = """
import json, sys, time
from pathlib import Path
import emo.model.profiling as profiling
profiling.BASELINE_SECONDS = 1.0  # (the docstring's shortened measurements)
from emo.stages import STAGES, declaration, run_in_place
from emo.workflow.plan import compose
out, cal = Path(sys.argv[1]), Path(sys.argv[2])
cfg = compose(sys.argv[3:] + ["results=" + str(out)])
t0 = time.perf_counter()
if not (cal / "calibration.json").exists():
    run_in_place("calibrate", cfg, {}, cal)
done = {"calibrate": cal}
for stage in STAGES:
    if stage == "calibrate":
        continue
    wanted = declaration(stage).inputs_for(cfg)
    run_in_place(stage, cfg, {k: done[up] / f for k, (up, f) in wanted.items()}, out / stage)
    done[stage] = out / stage
r = json.load(open(done["validate"] / "result.json"))
s = json.load(open(done["optimize"] / "summary.json"))
m = r["metrics"]
print(json.dumps({
    "es": m["es_pct"], "pl": m["pl_pct"], "es_pred": m.get("es_pred_pct"), "pl_pred": m.get("pl_pred_pct"),
    "schedules": (s.get("sample") or {}).get("schedules", len(json.load(open(done["optimize"] / "policy.json"))["steps"])),
    "ranks_measured": len(r["optimized"]["energy_per_device_j"]),
    "check": {k: v for k, v in m.items() if k.startswith(("energy_vs_class", "unsampled"))},
    "wall_s": time.perf_counter() - t0,
}))
"""


def one_seed(root: Path, seed: int) -> dict[str, dict]:
    """Both paths of one seed, the sampled one first, on one calibration."""
    out = {}
    for ranks in ("replica", "all"):
        folder = root / f"seed{seed}-{ranks}"
        cal = root / f"seed{seed}-calibrate"
        cmd = [sys.executable, "-c", CHAIN, str(folder), str(cal), *JOB, f"gpu.seed={seed}", f"trace.ranks={ranks}"]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"sampled_vs_full: seed {seed}, trace.ranks={ranks} failed:\n{p.stderr[-3000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        out[ranks] = r
        print(
            f"seed {seed}, trace.ranks={ranks}: ES {r['es']:.2f} %, PL {r['pl']:.2f} % "
            f"(predicted ES {r['es_pred']:.2f} %, PL {r['pl_pred']:.2f} %), {r['schedules']} schedules, "
            f"{r['ranks_measured']} ranks measured{' ' + json.dumps(r['check']) if r['check'] else ''}; "
            f"{time.perf_counter() - t0:.0f} s at load {load:.1f}",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=3, help="seeds run at once")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a fresh temporary one)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="emo-sampled-"))
    rows: dict[str, dict[int, dict]] = {"all": {}, "replica": {}}
    with ThreadPoolExecutor(args.parallel) as pool:
        for seed, got in zip(args.seeds, pool.map(lambda s: one_seed(root, s), args.seeds)):
            for ranks, r in got.items():
                rows[ranks][seed] = r
    for ranks, by_seed in rows.items():
        es = [r["es"] for r in by_seed.values()]
        pl = [r["pl"] for r in by_seed.values()]
        sd = lambda x: statistics.stdev(x) if len(x) > 1 else 0.0
        print(
            f"trace.ranks={ranks}: ES {statistics.mean(es):.2f} ± {sd(es):.2f} %, "
            f"PL {statistics.mean(pl):.2f} ± {sd(pl):.2f} % (mean ± sd over seeds {', '.join(map(str, by_seed))})"
        )
    d_es = [rows["replica"][s]["es"] - rows["all"][s]["es"] for s in args.seeds]
    d_pl = [rows["replica"][s]["pl"] - rows["all"][s]["pl"] for s in args.seeds]
    print(
        "sampled - all, per seed: ES "
        + ", ".join(f"{x:+.2f}" for x in d_es)
        + " points; PL "
        + ", ".join(f"{x:+.2f}" for x in d_pl)
        + " points"
    )


if __name__ == "__main__":
    main()
