"""A 12-job sweep run sequentially (one Snakemake run per job, one after another, as `emo run -m` did
before the one-DAG runner) and as one Snakemake DAG at -j 2, side by side, each into a fresh results
folder; the stage folders both write must be the same, byte for byte (but for the wall times stages
record: metrics.json, optimize's solve_s, gzip's header time). Both stop after validate (`--until
validate`: the sweep's summary plots are not compared) and both end by logging every job to MLflow.
Last line: `sweep speedup: X` (sequential wall time / one-DAG wall time).

Each runner logs into its fresh results folder's MLflow store, which MLflow creates and migrates
(about a second, in both).

    python benchmarks/sweep_scaling.py [--jobs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emo import benchreport

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("sweep-scaling",)
ROOT = Path(__file__).resolve().parents[1]
# 2 workloads x 3 methods x 2 budgets = 12 jobs: one calibration, two trace chains, 8 optimize, 12 validate
SWEEP = ["workload=tp", "workload.tp=2,4", "optimizer=emo,static,zeus", "budget=0.02,0.05"]

SEQUENTIAL = """
import sys
from emo.workflow import run, sweep
jobs = sweep.expand(sys.argv[2:], True)
sw = sweep.build(jobs)
cores = int(sys.argv[1])
for job in jobs:  # one Snakemake run per job, one after another (each may use every core)
    assert run.snakemake([job], cores, gpus=cores, until="validate") is None, job  # None: it succeeded
sweep.finish(sw, "sweep " + " ".join(sys.argv[2:]), sys.argv[2:], print_results=False)
"""


def timed(cmd: list[str], cwd: Path, log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"sweep_scaling: {' '.join(cmd[:4])} failed (rc {r.returncode}), see {log}")
    return time.perf_counter() - t0


# Recorded wall times are not results: the optimize stage's summary.json holds its solver's wall time.
WALL_TIME_KEYS = {"optimize": ("solve_s",)}


def same(a: Path, b: Path, stage: str) -> bool:
    """Byte for byte, but a .gz file by its content (gzip stamps its header with the time it was
    written) and a JSON file without the stage's recorded wall times."""
    read = (lambda p: gzip.decompress(p.read_bytes())) if a.suffix == ".gz" else (lambda p: p.read_bytes())
    x, y = read(a), read(b)
    if x == y or a.suffix != ".json" or stage not in WALL_TIME_KEYS:
        return x == y
    jx, jy = json.loads(x), json.loads(y)
    for k in WALL_TIME_KEYS[stage]:
        jx.pop(k, None), jy.pop(k, None)
    return jx == jy


def stage_files(results: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(results)): p
        for p in results.glob("*/*/**/*")
        if p.is_file()
        and p.name != "metrics.json"
        and "logs" not in p.parts
        and not p.parts[-2].startswith(".")
        and p.parts[len(results.parts)] not in ("mlartifacts",)
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchreport.add_flag(ap)
    ap.add_argument(
        "--jobs", type=int, default=2, help="jobs at once in the one-DAG run (and cores of each sequential run)"
    )
    ap.add_argument("--keep", type=Path, help="work here (kept) instead of a temporary folder")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="emo-sweep-"))
    seq, dag = work / "sequential", work / "one_dag"
    for d in (seq, dag):
        d.mkdir(parents=True, exist_ok=True)
        if any(d.iterdir()):
            sys.exit(f"sweep_scaling: {d} is not empty")
    py = sys.executable
    t_seq = timed([py, "-c", SEQUENTIAL, str(args.jobs), f"results={seq / 'results'}", *SWEEP], seq, seq / "log.txt")
    t_dag = timed(
        [
            py,
            "-m",
            "emo.cli",
            "run",
            "-m",
            "-j",
            str(args.jobs),
            "--until",
            "validate",
            f"results={dag / 'results'}",
            *SWEEP,
        ],
        dag,
        dag / "log.txt",
    )

    a, b = stage_files(seq / "results"), stage_files(dag / "results")
    differ = sorted(k for k in a.keys() & b.keys() if not same(a[k], b[k], k.split("/")[0]))
    missing = sorted(a.keys() ^ b.keys())
    results = sorted(k for k in a if k.startswith("validate/") and k.endswith("result.json"))
    print(f"sweep: {' '.join(SWEEP)} ({len(results)} jobs), work folder {work}")
    print(f"{'runner':<34}{'wall s':>8}")
    print(f"{'sequential (a Snakemake run per job)':<34}{t_seq:8.1f}")
    print(f"{f'one DAG, -j {args.jobs}':<34}{t_dag:8.1f}")
    print(
        f"stage files compared: {len(a.keys() & b.keys())}, differing: {len(differ)}, in one run only: {len(missing)}"
        f" (.gz by content; without {WALL_TIME_KEYS})"
    )
    for k in (differ + missing)[:10]:
        print(f"  not the same: {k}")
    if differ or missing or len(results) != 12:
        print("sweep_scaling: the two runners did not produce the same results", file=sys.stderr)
        return 1
    print(f"sweep speedup: {t_seq / t_dag:.2f}")
    return 0


if __name__ == "__main__":
    with benchreport.recording("sweep-scaling"):
        sys.exit(main())
