"""EMO's DP vs the exact MILP (HiGHS) on small instances: the optimality gap in energy.

Instances: random multi-GPU DAGs (host threads, side streams, point-to-point links; DVFS-shaped
packs), 1F1B pipelines built from measured A100/A40 stage clock sweeps (Perseus' profiles in
../shared/data/dvfs), and with --virtual a tensor-parallel workload traced, packed and fitted on the
virtual GPU (emo run ... --until fit). Budgets 0, 2 %, 5 %.

    python benchmarks/dp_gap.py [--virtual] [--seeds 8]

Last line: `worst gap %: X` (goal <= 1).
"""
from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from emo.optimize import make_items, optimize, solve_exact
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test instances
from optimize_instances import perseus_profile, pipeline_problem, random_problem

ROOT = Path(__file__).resolve().parents[1]
DVFS = ROOT.parent / "shared" / "data" / "dvfs" / "perseus_stage_profiles"


def instances(seeds: int, virtual: bool):
    for seed in range(seeds):
        gpus = 1 + seed % 3
        p, _ = random_problem(seed, gpus=gpus, kernels=10)
        yield f"random s{seed} g{gpus}", p, make_items(p, p.makespan0_ns / 6e6)
    for name in ("gpt3-175b+a100_sxm_bf16", "bloom+a100_sxm_bf16", "gpt3-175b+a40_bf16", "bloom+a40_bf16"):
        path = DVFS / f"{name}.csv"
        if not path.exists():
            print(f"(skipping {name}: {path} missing)")
            continue
        t, e, cl = perseus_profile(path, stages=3, clock_stride=4)
        p = pipeline_problem(t, e, cl, microbatches=3, idle_w=70.0, split=2, link_ns=50e3)
        yield f"pipeline {name.split('+')[0]} {name.split('+')[1][:4]}", p, make_items(p, p.makespan0_ns / 10e6)
    if virtual:
        yield from virtual_instances()


def virtual_instances():
    from emo.model.predict import load_pack_tables
    from emo.optimize.pipeline.tables import baseline_timing, iteration_items, problem_from_tables

    res = Path(tempfile.mkdtemp(prefix="emo_dp_gap_"))
    for wl in (["workload=tp", "workload.tp=2", "workload.model.layers=2"],):
        cmd = ["emo", "run", f"results={res}", *wl, "model.clocks_stride=8", "model.min_seconds=0.2",
               "model.repeats=1", "tracking.enabled=false", "--until", "fit", "-c", "2"]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            print(f"(virtual instance skipped: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
            return
        pack = Path(glob.glob(str(res / "pack" / "*" / "packs.parquet"))[0]).parent
        fit = Path(glob.glob(str(res / "fit" / "*" / "model.parquet"))[0]).parent
        t = load_pack_tables(pack, fit)
        p = problem_from_tables(t, 0.5)
        yield "virtual tp=2 (sim)", p, iteration_items(p, baseline_timing(p, t), 20.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--virtual", action="store_true", help="also a TP workload traced on the virtual GPU")
    ap.add_argument("--budgets", default="0,0.02,0.05")
    a = ap.parse_args()
    budgets = [float(b) for b in a.budgets.split(",")]
    print(f"{'instance':34s} {'nodes':>6s} {'items':>5s} {'budget':>6s} {'E_dp J':>10s} {'E_exact J':>10s} "
          f"{'gap %':>7s} {'t_dp s':>7s} {'t_milp s':>8s}")
    gaps = []
    for name, p, items in instances(a.seeds, a.virtual):
        for b in budgets:
            t0 = time.perf_counter()
            dp = optimize(p, b, items=items)
            t1 = time.perf_counter()
            ex = solve_exact(p, b, items=items, time_limit_s=120)
            t2 = time.perf_counter()
            if not ex.info["milp_message"].startswith("Optimization terminated successfully"):
                print(f"{name:34s} MILP not optimal ({ex.info['milp_message']}): skipped")
                continue
            if not dp.feasible:
                print(f"{name:34s} DP result misses the deadline: counted as a 100 % gap")
                gaps.append(100.0)
                continue
            gap = 100.0 * (dp.energy_j - ex.energy_j) / ex.energy_j
            gaps.append(gap)
            print(f"{name:34s} {p.n:6d} {items.k:5d} {b:6.2f} {dp.energy_j:10.3f} {ex.energy_j:10.3f} "
                  f"{gap:7.3f} {t1 - t0:7.2f} {t2 - t1:8.2f}")
    g = np.array(gaps)
    print(f"instances x budgets: {len(g)}; mean gap {g.mean():.3f} %, gaps > 1 %: {int((g > 1).sum())}")
    print(f"worst gap %: {g.max():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
