"""EMO's optimiser vs lowtime (Perseus' Phillips–Dessouky solver) on the same pack DAG.

The DAG: 1F1B pipelines whose packs carry measured A100 clock sweeps (Perseus' GPT-3 and BLOOM
stage profiles in ../shared/data/dvfs, each pass split into packs), or with --synthetic DVFS-shaped
packs. Both solve at pack granularity (one clock per pack, the finest either can use) and EMO also
at its own granularity (20 ms windows: what a clock applier with ε can follow). Every solution is
checked with the same exact what-if pass; energies and solve times are printed with their ratios.
Then EMO alone on an 8-GPU pipeline of >= 50k packs.

    python benchmarks/optimizer_vs_lowtime.py [--budget 0.05] [--microbatches 6] [--split 4]

Last line: `speedup vs lowtime: X` (lowtime's solve time / EMO's, pack level, worst instance).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from emo.optimize import make_items, optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test instances
from optimize_instances import large_pipeline, perseus_profile, pipeline_problem

from emo import benchreport  # noqa: E402
from emo.optimize.problem import units
from emo.optimize.solvers.perseus import lowtime_version, optimize_perseus

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("optimizer-vs-lowtime",)
ROOT = Path(__file__).resolve().parents[1]
DVFS = ROOT.parent / "shared" / "data" / "dvfs" / "perseus_stage_profiles"


def timed(solver, *args, **kw):
    """The solver's solution, with its wall time (solve_s) measured here, side by side."""
    t0 = time.perf_counter()
    sol = solver(*args, **kw)
    sol.solve_s = time.perf_counter() - t0
    return sol


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--budget", type=float, default=0.05)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=6)
    ap.add_argument("--split", type=int, default=4, help="packs per pass")
    ap.add_argument("--large-microbatches", type=int, default=64)
    ap.add_argument("--large-packs-per-pass", type=int, default=50)
    a = ap.parse_args()
    if lowtime_version() is None:
        print("lowtime is not installed: pip install 'emo[baselines]'")
        return 1
    print(f"lowtime {lowtime_version()}, budget {a.budget:.0%}, {os.cpu_count()} CPUs")
    speedups = []
    for name in ("gpt3-175b+a100_sxm_bf16", "bloom+a100_sxm_bf16"):
        t, e, cl = perseus_profile(DVFS / f"{name}.csv", stages=a.stages, clock_stride=3)
        p = pipeline_problem(t, e, cl, microbatches=a.microbatches, idle_w=70.0, split=a.split, link_ns=50e3)
        base = optimize(p, 0.0, items=make_items(p, 20.0), kicks=0).baseline()
        print(
            f"\n{name}: {a.stages} stages x {a.microbatches} microbatches, {int((p.device >= 0).sum())} packs, "
            f"{p.n_clocks} clocks, iteration {p.makespan0_ns * 1e-6:.1f} ms, {base.energy_j:.1f} J at max clock"
        )
        pack_items = make_items(p, 0.0, replicate=False, windows=units(p, "pack"))
        rows = []
        lt = timed(optimize_perseus, p, a.budget, level="pack")
        rows.append(("lowtime, per pack", lt))
        em = timed(optimize, p, a.budget, items=pack_items)
        rows.append(("EMO, per pack", em))
        # the same time as lowtime reached, for a like-for-like energy
        same = timed(optimize, p, max(0.0, lt.makespan_ns / p.makespan0_ns - 1), items=pack_items)
        rows.append(("EMO, per pack, lowtime's time", same))
        rows.append(("EMO, 20 ms windows", timed(optimize, p, a.budget)))
        rows.append(("lowtime, per pass (Perseus)", timed(optimize_perseus, p, a.budget, level="pass")))
        print(f"  {'method':32s} {'energy J':>9s} {'saving %':>8s} {'slowdown %':>10s} {'solve s':>8s}")
        for label, s in rows:
            print(
                f"  {label:32s} {s.energy_j:9.2f} {100 * (1 - s.energy_j / base.energy_j):8.2f} "
                f"{100 * (s.makespan_ns / p.makespan0_ns - 1):10.3f} {s.solve_s:8.2f}"
                + (
                    f"  (PD iterations {s.info['pd_iterations']}, Rust panics {s.info['rust_panics']})"
                    if "pd_iterations" in s.info
                    else ""
                )
            )
        ratio = same.energy_j / lt.energy_j
        sp = lt.solve_s / max(em.solve_s, 1e-9)
        speedups.append(sp)
        print(
            f"  energy EMO/lowtime at lowtime's time: {ratio:.4f}; at the budget: {em.energy_j / lt.energy_j:.4f}; "
            f"solve time lowtime/EMO: {sp:.1f}x"
        )

    print(f"\nlarge: 8-GPU pipeline, {a.large_microbatches} microbatches x {a.large_packs_per_pass} packs per pass")
    t0 = time.perf_counter()
    big = large_pipeline(stages=8, microbatches=a.large_microbatches, packs_per_pass=a.large_packs_per_pass)
    t1 = time.perf_counter()
    packs = int((big.device >= 0).sum())
    print(f"  {packs} packs, {big.n} nodes, iteration {big.makespan0_ns * 1e-9:.2f} s, built in {t1 - t0:.1f} s")
    for b in (0.0, a.budget):
        t1 = time.perf_counter()
        s = optimize(big, b)
        t2 = time.perf_counter()
        sm = s.summary()
        print(
            f"  budget {b:.0%}: solved in {t2 - t1:.1f} s ({sm['items']} windows), saving "
            f"{100 * sm['predicted_saving']:.2f} %, slowdown {100 * sm['predicted_slowdown']:.3f} %"
        )
    print(f"50k-pack optimizer time s: {t2 - t1:.1f}")
    print(f"speedup vs lowtime: {min(speedups):.1f}")
    return 0


if __name__ == "__main__":
    with benchreport.recording("optimizer-vs-lowtime"):
        sys.exit(main())
