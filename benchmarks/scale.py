"""Trace to policy for a TP8 x PP8 x DPd job (64 to 1,024 virtual GPUs) traced on one data-parallel
replica (64 ranks, `trace.ranks=replica`; emo.sampling, docs/scale.md): time and peak memory against
the GPU count.

Per size, each stage runs in a process of its own (as under Snakemake), and its wall time and peak
resident memory are measured (os.wait4's ru_maxrss of that process). One line per size:

    N GPUs: T s, M GB, K schedules (...)

T: EMO's work from the sampled traces to the policy for every rank: the graph, pack, profile, fit
and optimize stages, less the time the virtual GPU spends simulating the job inside profile (its
whole-job runs at a few static clocks; on hardware that is the job running on its GPUs for seconds,
not EMO's computing). M: the largest peak resident memory of those stages' processes (profile's
includes the simulated job's). K: the distinct clock schedules in the policy. In parentheses: the
virtual GPU's share (the trace stage, which runs and traces the whole job, and profile's simulation),
which does grow with the GPU count, as the job itself does; and the load average.

The device measurements are shortened alike at every size (they cost simulation time in proportion
to the GPUs): no settle (gpu.settle_s=0), one level clock (model.level_fractions=[0.7]), 3 untraced
iterations (trace.untraced_iterations=3) and profile's baselines over >= 3 iterations rather than
>= 5 s (BASELINE_SECONDS patched to 0.1 s in the profile process). Calibration runs once, first,
outside the timings (it is per GPU model, never per job).

    python benchmarks/scale.py [--sizes 64 128 256 512 1024] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = [
    "workload=hybrid",
    "workload.tp=8",
    "workload.pp=8",
    "workload.microbatches=8",
    "trace.ranks=replica",
    "trace.untraced_iterations=3",
    "gpu.settle_s=0",
    "model.level_fractions=[0.7]",
]

STAGE = """
import json, sys, time
from pathlib import Path
stage, out, inputs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
import emo.model.profiling as profiling
profiling.BASELINE_SECONDS = 0.1  # >= 3 iterations per clock (the docstring's shortened measurements)
from emo.device.sim.device import SimDevice
sim = [0.0]
plain = SimDevice.simulate
def timed(self, *a, **k):
    t = time.perf_counter()
    try:
        return plain(self, *a, **k)
    finally:
        sim[0] += time.perf_counter() - t
SimDevice.simulate = timed
from emo.stages import run_in_place
from emo.workflow.plan import compose
cfg = compose(sys.argv[4:] + ["results=" + str(out.parent)])
t0 = time.perf_counter()
metrics = run_in_place(stage, cfg, inputs, out)
print(json.dumps({"wall_s": time.perf_counter() - t0, "sim_s": sim[0], "metrics": metrics}, default=str))
"""

ANALYSIS = ("graph", "pack", "profile", "fit", "optimize")


def run_stage(stage: str, root: Path, cal: Path, overrides: list[str]) -> dict:
    from emo.stages import declaration
    from emo.workflow.plan import compose

    wanted = declaration(stage).inputs_for(compose(overrides))
    inputs = {k: str((cal if up == "calibrate" else root / up) / f) for k, (up, f) in wanted.items()}
    out = cal if stage == "calibrate" else root / stage
    p = subprocess.Popen(
        [sys.executable, "-c", STAGE, stage, str(out), json.dumps(inputs), *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # wait4 for this child's own rusage (its peak RSS), then read what it wrote
    stdout, stderr = p.stdout.read(), p.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"scale: {stage} failed (rc {p.returncode}):\n{stderr[-3000:]}")
    r = json.loads(stdout.strip().splitlines()[-1])
    r["rss_gb"] = usage.ru_maxrss / 1e6  # KiB on Linux
    r["cpu_s"] = usage.ru_utime + usage.ru_stime  # what the machine's load does not inflate
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--out", default=None, help="folder for the stage outputs (default: a fresh temporary one)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="emo-scale-"))
    cal = root / "calibrate"
    if not (cal / "calibration.json").exists():
        run_stage("calibrate", root, cal, JOB + ["workload.dp=1"])
    for n in args.sizes:
        if n % 64 or not 1 <= n // 64 <= 16:
            sys.exit(f"scale: {n} GPUs is not TP8 x PP8 x DP with DP in 1, 2, 4, 8, 16")
        ov = JOB + [f"workload.dp={n // 64}"]
        job = root / f"gpus{n}"
        load = os.getloadavg()[0]
        st = {s: run_stage(s, job, cal, ov) for s in ("trace", *ANALYSIS)}
        t = sum(st[s]["wall_s"] for s in ANALYSIS) - st["profile"]["sim_s"]
        m = max(st[s]["rss_gb"] for s in ANALYSIS)
        k = json.loads((job / "optimize" / "summary.json").read_text())["sample"]["schedules"]
        sim = st["trace"]["wall_s"] + st["profile"]["sim_s"]
        per = ", ".join(f"{s} {st[s]['wall_s'] - (st[s]['sim_s'] if s == 'profile' else 0):.0f}" for s in ANALYSIS)
        cpu = sum(st[s]["cpu_s"] for s in ANALYSIS if s != "profile")
        per_cpu = ", ".join(f"{s} {st[s]['cpu_s']:.0f}" for s in ANALYSIS if s != "profile")
        print(
            f"{n} GPUs: {t:.0f} s, {m:.2f} GB, {k} schedules "
            f"({per} s; graph+pack+fit+optimize {cpu:.0f} s of CPU ({per_cpu} s); "
            f"virtual GPU simulating the job {sim:.0f} s, trace stage {st['trace']['rss_gb']:.2f} GB; "
            f"load {load:.1f} at start, {os.getloadavg()[0]:.1f} at end)",
            flush=True,
        )


if __name__ == "__main__":
    main()
