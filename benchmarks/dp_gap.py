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

from emo import benchreport  # noqa: E402

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("dp-gap",)
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


def large_instances():
    """Instances of >= 200 nodes, where HiGHS rarely proves optimality in its time limit but still
    bounds the optimum from below: the gap to that bound is an upper bound on the DP's true gap."""
    for seed in range(3):
        p, _ = random_problem(100 + seed, gpus=3, kernels=40)
        yield f"random-large s{100 + seed} g3", p, make_items(p, p.makespan0_ns / 12e6)
    path = DVFS / "gpt3-175b+a100_sxm_bf16.csv"
    if path.exists():
        t, e, cl = perseus_profile(path, stages=4, clock_stride=4)
        p = pipeline_problem(t, e, cl, microbatches=8, idle_w=70.0, split=4, link_ns=50e3)
        yield "pipeline-large gpt3 a100", p, make_items(p, p.makespan0_ns / 16e6)


def milp_objective(p, items, sol) -> float:
    """A solution's value in the MILP's own objective (milp.formulation: energies + the linearised
    idle cost of the iteration's length), comparable with HiGHS' bound."""
    rows = np.arange(items.k)
    per_ms = items.idle_energy[:, p.ref].sum() / (p.makespan0_ns * 1e-6)
    return float(items.energy[rows, sol.choice].sum() + per_ms * max(sol.makespan_ns, p.makespan0_ns) * 1e-6)


def virtual_instances():
    from emo.model.predict import load_pack_tables
    from emo.optimize.pipeline.tables import baseline_timing, iteration_items, problem_from_tables

    res = Path(tempfile.mkdtemp(prefix="emo_dp_gap_"))
    for wl in (["workload=tp", "workload.tp=2", "workload.model.layers=2"],):
        cmd = [
            "emo",
            "run",
            f"results={res}",
            *wl,
            "model.clocks_stride=8",
            "model.min_seconds=0.2",
            "model.repeats=1",
            "tracking.enabled=false",
            "--until",
            "fit",
            "-c",
            "2",
        ]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            print(
                f"(virtual instance skipped: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})"
            )
            return
        pack = Path(glob.glob(str(res / "pack" / "*" / "packs.parquet"))[0]).parent
        fit = Path(glob.glob(str(res / "fit" / "*" / "model.parquet"))[0]).parent
        t = load_pack_tables(pack, fit)
        p = problem_from_tables(t, 0.5)
        yield "virtual tp=2 (sim)", p, iteration_items(p, baseline_timing(p, t), 20.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--virtual", action="store_true", help="also a TP workload traced on the virtual GPU")
    ap.add_argument("--budgets", default="0,0.02,0.05")
    ap.add_argument("--large-limit-s", type=float, default=60.0, help="HiGHS time limit on the large instances")
    a = ap.parse_args()
    budgets = [float(b) for b in a.budgets.split(",")]
    print(
        f"{'instance':34s} {'nodes':>6s} {'items':>5s} {'budget':>6s} {'E_dp J':>10s} {'E_exact J':>10s} "
        f"{'gap %':>7s} {'t_dp s':>7s} {'t_milp s':>8s}"
    )
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
            print(
                f"{name:34s} {p.n:6d} {items.k:5d} {b:6.2f} {dp.energy_j:10.3f} {ex.energy_j:10.3f} "
                f"{gap:7.3f} {t1 - t0:7.2f} {t2 - t1:8.2f}"
            )
    bound_gaps = []
    print(f"\nlarge instances (HiGHS limited to {a.large_limit_s:.0f} s): gap to its best and to its lower bound")
    for name, p, items in large_instances():
        for b in budgets:
            t0 = time.perf_counter()
            dp = optimize(p, b, items=items)
            t1 = time.perf_counter()
            ex = solve_exact(p, b, items=items, time_limit_s=a.large_limit_s)
            t2 = time.perf_counter()
            if not dp.feasible:
                print(f"{name:34s} DP result misses the deadline: counted as a 100 % gap")
                bound_gaps.append(100.0)
                continue
            mine, bound = milp_objective(p, items, dp), ex.info["milp_bound_j"]
            to_bound = 100.0 * (mine - bound) / bound
            to_best = 100.0 * (mine - ex.info["milp_objective_j"]) / ex.info["milp_objective_j"]
            bound_gaps.append(to_bound)
            print(
                f"{name:34s} {p.n:6d} {items.k:5d} {b:6.2f} gap to MILP best {to_best:7.3f} %, to its bound "
                f"{to_bound:7.3f} % (MILP gap {100 * ex.info['milp_gap']:.3f} %)  t_dp {t1 - t0:.2f} s, t_milp {t2 - t1:.1f} s"
            )
    g = np.array(gaps)
    print(f"instances x budgets: {len(g)}; mean gap {g.mean():.3f} %, gaps > 1 %: {int((g > 1).sum())}")
    if bound_gaps:
        print(f"large: worst gap to the MILP's lower bound %: {max(bound_gaps):.3f} (an upper bound on the true gap)")
    print(f"worst gap %: {g.max():.3f}")
    return 0


if __name__ == "__main__":
    with benchreport.recording("dp-gap"):
        sys.exit(main())
