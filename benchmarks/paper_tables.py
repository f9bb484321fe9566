"""The paper's Tables III and IV, scored as a sceptical reviewer would: measured energy saving (ES %)
and performance loss (PL %) of EMO and the baselines (static, Zeus, Perseus, GEEPAFS) on the virtual
A100 with its noise on, every cell over several seeds, beside the measured static-clock curve.

    python benchmarks/paper_tables.py [--quick] [--seeds 5] [--results DIR] [--cores N] [--methods emo,static,...]
                                      [--ablations | --no-ablations] [--no-run]

Cells: tensor parallelism TP 2/4/8 at budgets 0, 2 and 5 %; pipeline parallelism PP 2/4/8 with
uniform and parameter partitions at 0 %, PP4 uniform at 2 and 5 % too; CPU-offloaded MoE decode at
0 %; hybrid TP2 x PP2 x DP2 at 0 and 2 %. --quick: TP4 at 2 %, PP4 uniform and the hybrid at 0 % (all
seeds, all methods). --cells "PP4 uniform@2,TP4@5": only those cells (label@budget %).

--ablations (on by default, off by default with --quick): extra columns for the labelled ablations
(emo.methods.ABLATIONS; docs/baselines.md): perseus+emo-search (lowtime inside EMO's search and
polish), emo-dp (EMO's DP alone), emo-pass (one window per pass), emo-grid (the paper's 20 ms grid).
They are scored like the methods but never count as EMO's rivals in `EMO ahead`.

Every (cell, seed, method) is a job of the whole pipeline (trace, graph, pack, profile, fit,
optimize, validate) and all of them run as one Snakemake DAG on `--cores` cores; stage folders are
content-hashed, so a second run reuses what it can. A seed is `gpu.seed`: the device's noise, so
the trace, the profile and every measurement differ between seeds. Scoring (emo.report.scoring):
  - mean and spread (sample standard deviation over the seeds) of ES and PL per method;
  - static is the best *measured* static clock with PL within budget + 0.5 %, per seed, from the
    static curve validate measures (`validate.pareto_points` clocks) and static's own policy;
  - a method over budget + 0.5 % is marked `!` and counts for nothing;
  - EMO is ahead in a cell when it is within budget and its mean ES exceeds every other method's
    within budget by more than their combined spread;
  - EMO's margin over the static curve: its ES minus the measured curve's ES at EMO's measured PL,
    per seed (the energy slack saved, not a slower clock); above the curve when the mean margin
    exceeds its spread. The curve is the measured clocks' monotone fit (scoring.frontier); `the bar`
    line checks it: static's own pick, re-measured in its own run, against its sweep's curve.
  - `slack`: the slack a clock can follow, from the first seed's what-if: slack windows (per GPU
    stream, runs of ops off the critical path) lasting at least the median clock-request latency
    calibrate measured, their slack summed, as a share of GPU busy time.
Last line: `EMO ahead in N of M cells; above the static curve in K of M`. Every per-seed number is
also written to paper_tables.json in the results folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = (
    "paper-tables",
    "paper-tables-ablations",
    "paper-tables-quick",
    "paper-tables-quick-ablations",
    "paper-tables-cells",
)


def results_section(argv: list[str]) -> str:
    """paper-tables[-quick][-ablations], or paper-tables-cells for some cells (--cells): the section of
    docs/results.md a run with these flags writes."""
    if any(a == "--cells" or a.startswith("--cells=") for a in argv):
        return "paper-tables-cells"
    return "paper-tables" + "-quick" * ("--quick" in argv) + "-ablations" * ("--ablations" in argv)


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from emo import benchreport  # noqa: E402
from emo.methods import METHODS, describe, lead  # noqa: E402  (the checkout, not an installed emo)
from emo.report import scoring  # noqa: E402
from emo.workflow.run import jobs_config  # noqa: E402
from emo.workflow.sweep import build  # noqa: E402

CURVE_POINTS = 48  # static clocks validate measures: every supported clock from half the max clock up on the A100


def cells(quick: bool) -> list[tuple[str, str, list[str], float]]:
    """(table, label, workload overrides, budget)."""
    if quick:
        return [
            ("III", "TP4", ["workload=tp", "workload.tp=4"], 0.02),
            ("IV", "PP4 uniform", ["workload=pp", "workload.pp=4", "workload.partition=uniform"], 0.0),
            ("V", "TP2xPP2xDP2", ["workload=hybrid", "workload.tp=2", "workload.pp=2", "workload.dp=2"], 0.0),
        ]
    out = []
    for tp in (2, 4, 8):
        for b in (0.0, 0.02, 0.05):
            out.append(("III", f"TP{tp}", ["workload=tp", f"workload.tp={tp}"], b))
    for pp in (2, 4, 8):
        for part in ("uniform", "parameter"):
            out.append(
                ("IV", f"PP{pp} {part}", ["workload=pp", f"workload.pp={pp}", f"workload.partition={part}"], 0.0)
            )
    for b in (0.02, 0.05):  # a pipeline at the budgets a user runs it at (`emo run workload=pp`: 2 %)
        out.append(("IV", "PP4 uniform", ["workload=pp", "workload.pp=4", "workload.partition=uniform"], b))
    out.append(("IV", "offload", ["workload=offload"], 0.0))
    for b in (0.0, 0.02):
        out.append(("V", "TP2xPP2xDP2", ["workload=hybrid", "workload.tp=2", "workload.pp=2", "workload.dp=2"], b))
    return out


def run_all(jobs: list[list[str]], cores: int, log: Path) -> int:
    """Every job's validate result, as one Snakemake DAG (no summary, no MLflow hooks); --keep-going so
    one failed job leaves the others' results."""
    sw = build(jobs)
    targets = [j.result for j in sw.jobs if not Path(j.result).exists()]
    if not targets:
        return 0
    argv = [
        sys.executable,
        "-m",
        "snakemake",
        *targets,
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(log.parent),
        *jobs_config(jobs, log.parent / "paper_tables.jobs.json"),
        "--cores",
        str(cores),
        "--resources",
        f"gpu={cores}",
        "--no-hooks",
        "--rerun-incomplete",
        "--nolock",
        "--keep-going",
        "--quiet",
        "all",
    ]
    with open(log, "a") as fh:
        return subprocess.run(argv, check=False, stdout=fh, stderr=subprocess.STDOUT, cwd=log.parent).returncode


def changes_clocks(result: dict) -> bool:
    """A run whose plan the model predicted to move the energy or the time: every plan but one that
    stays at the max clock (which the model predicts exactly, as the baseline)."""
    m = result["metrics"]
    return "es_pred_pct" in m and (abs(m["es_pred_pct"]) > 1e-9 or abs(m["pl_pred_pct"]) > 1e-9)


def prediction_errors(result: dict) -> tuple[float, float, float]:
    """Predicted - measured ES (points), and the predicted energy's error (%) of the max-clock
    baseline and of the plan: which of the two a saving's error comes from."""
    m, p = result["metrics"], result["predicted"]
    return (
        m["es_pred_pct"] - m["es_pct"],
        100 * (p["baseline_energy_j"] / m["e_ori_j"] - 1),
        100 * (p["energy_j"] / m["e_opt_j"] - 1),
    )


def prediction_text(method: str, errs: list[tuple[float, float, float]]) -> str:
    """One method's prediction errors: predicted - measured ES in points (positive: the saving was
    predicted too large; "over" the issue's 0.5-point goal), and the mean signed energy errors."""
    d, base, plan = (np.array(x) for x in zip(*errs))
    a = np.abs(d)
    return (
        f"{method} predictions: mean |dES| {a.mean():.2f} points, bias {d.mean():+.2f} points over {len(d)} "
        f"clock-changing plans ({int((a > PREDICTION_GOAL).sum())} over {PREDICTION_GOAL}, "
        f"{int((d > 0).sum())} too optimistic); energy predicted {base.mean():+.2f} % at the max clock, "
        f"{plan.mean():+.2f} % under the plan"
    )


PREDICTION_GOAL = 0.5  # points of ES


def load(result: str) -> dict | None:
    p = Path(result)
    return json.loads(p.read_text()) if p.exists() else None


def followable_slack_pct(graph_dir: Path, latency_ms: float) -> float:
    """Slack a clock can follow: the what-if's slack windows (per GPU stream, runs of ops off the
    critical path) lasting at least the clock-request latency, their slack summed, as a share of the
    GPU's busy time."""
    from emo.graph.graph import GPU_NODE_KINDS, Graph
    from emo.graph.whatif import compile_graph, slack_windows, whatif

    graph = Graph.load(graph_dir)
    res = whatif(compile_graph(graph))
    gpu = graph.nodes["kind"].isin(GPU_NODE_KINDS).to_numpy()
    busy = float((res.finish_ns[gpu] - res.start_ns[gpu]).sum())
    w = slack_windows(graph, res)
    long = w[(w["end_ns"] - w["start_ns"]) >= latency_ms * 1e6]
    return 100.0 * float(long["slack_ns"].sum()) / busy if busy > 0 else 0.0


def slack_text(job) -> str:
    """The cell's followable slack (first seed) at the median clock-request latency calibrate measured."""
    if job is None or not (job.plans["graph"].dir / "nodes.parquet").exists():
        return "-"
    cal = Path(job.plans["calibrate"].out("calibration.json"))
    lat = json.loads(cal.read_text()).get("clock_latency_ms") if cal.exists() else None
    if not lat:
        return "-"
    return f"{followable_slack_pct(job.plans['graph'].dir, float(lat['p50'])):.1f}%"


def static_curve(result: dict | None, vdir: Path) -> pd.DataFrame | None:
    """One seed's measured static curve as PL/ES % against its own max-clock baseline, static's own
    policy (a measured clock too) included; None when it was not measured."""
    if result is None or not (vdir / "pareto.parquet").exists():
        return None
    return scoring.static_points(pd.read_parquet(vdir / "pareto.parquet"), result["metrics"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--quick", action="store_true", help="one TP, one PP and one hybrid cell")
    ap.add_argument(
        "--seeds", type=int, default=None, help="seeds per cell (gpu.seed = 0 .. N-1); default 5, 3 with --quick"
    )
    ap.add_argument(
        "--results",
        default=str(ROOT / "results" / "paper_tables"),
        help="stage folders (reused); the pipeline's log goes to paper_tables.log there",
    )
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--methods", default=",".join(m for m in METHODS if describe(m).rival))
    ap.add_argument(
        "--ablations",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add the ablation columns (default: on, off with --quick)",
    )
    ap.add_argument("--no-run", action="store_true", help="score what the results folder holds; run nothing")
    ap.add_argument("--cells", default="", help='only these cells, as label@budget %%: "PP4 uniform@2,TP4@5"')
    args = ap.parse_args()
    t_start = time.perf_counter()
    results = Path(args.results).resolve()
    methods = [m for m in args.methods.split(",") if m]
    known = tuple(METHODS)
    unknown = sorted(set(methods) - set(known))
    if unknown:
        print(f"--methods: {', '.join(unknown)} not one of {', '.join(known)}", file=sys.stderr)
        return 2
    if args.ablations if args.ablations is not None else not args.quick:
        methods += [m for m in METHODS if not describe(m).rival and m not in methods]  # the ablations
    if args.seeds is None:
        # a cell on the curve is "below" by chance when its mean is over one sample sd away:
        # P(t(n-1) > sqrt(n)) is 11 % at 3 seeds, 4.5 % at 5 (docs/validate.md)
        args.seeds = 3 if args.quick else 5
    if args.seeds < 1:
        print("--seeds: want at least 1", file=sys.stderr)
        return 2
    curved = next(m for m in METHODS if describe(m).measures_static_curve)  # static: its validate measures the curve
    if curved not in methods:
        methods.append(curved)  # the static curve is the bar every cell is scored against
    common = [f"results={results}", "tracking.enabled=false", f"validate.pareto_points={CURVE_POINTS}"]
    seeds = list(range(args.seeds))
    table = cells(args.quick)
    if args.cells:
        want = {x.strip() for x in args.cells.split(",") if x.strip()}
        table = [c for c in table if f"{c[1]}@{100 * c[3]:g}" in want]
        if len(table) != len(want):
            names = ", ".join(sorted({f"{c[1]}@{100 * c[3]:g}" for c in cells(args.quick)}))
            print(f"--cells: {args.cells!r} names cells this table does not have; it has {names}", file=sys.stderr)
            return 2
    grid = [(c, s, m) for c in table for s in seeds for m in methods]
    jobs = [c[2] + [f"optimizer={m}", f"budget={c[3]}", f"gpu.seed={s}"] + common for c, s, m in grid]
    results.mkdir(parents=True, exist_ok=True)
    log = results / "paper_tables.log"
    print(
        f"{len(jobs)} jobs ({len(grid) // (len(seeds) * len(methods))} cells x {len(seeds)} seeds x "
        f"{len(methods)} methods) on {args.cores} cores; log {log}",
        file=sys.stderr,
        flush=True,
    )
    rc = 0 if args.no_run else run_all(jobs, args.cores, log)
    if rc:
        print(f"the pipeline failed for some jobs (exit {rc}): see {log}; scoring what finished", file=sys.stderr)
    sw = build(jobs)
    folder = {(c[1], c[3], s, m): Path(j.result).parent for (c, s, m), j in zip(grid, sw.jobs)}
    first = lead()  # the method the table judges (emo.methods: Method.lead)
    emo_job = {(c[1], c[3]): j for (c, s, m), j in zip(grid, sw.jobs) if s == seeds[0] and m == first}
    got = {key: load(str(vdir / "result.json")) for key, vdir in folder.items()}

    width = {m: max(22, len(m) + 11) for m in methods}
    print(
        f"{'table':<6}{'workload':<14}{'budget':>7}  "
        + "".join(f"{m + ' ES/PL %':>{width[m]}}" for m in methods)
        + f"{'EMO - static curve':>20}{'slack':>8}  EMO ahead"
    )
    n_ahead = n_above = n_below = 0
    record, bar = [], []  # bar: (static's own pick, its sweep's curve) per static run
    errors: dict[str, list[tuple[float, float, float]]] = {}  # prediction_errors per method, its clock-changing plans
    for tab, label, _, budget in table:
        bpct = 100 * budget
        per: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in methods}
        curves, emo_points = [], []
        for s in seeds:
            curve = static_curve(got[(label, budget, s, curved)], folder[(label, budget, s, curved)])
            for mth in methods:
                r = got[(label, budget, s, mth)]
                if r is None:
                    continue
                es, pl = r["metrics"]["es_pct"], r["metrics"]["pl_pct"]
                if describe(mth).measures_static_curve and curve is not None:
                    bar.append(((es, pl), curve[curve["sm_mhz"] >= 0]))  # the sweep alone (the own pick is -1)
                    es, pl, _mhz = scoring.best_static(curve, bpct)
                per[mth][0].append(es)
                per[mth][1].append(pl)
                record.append({"cell": label, "budget": budget, "seed": s, "method": mth, "es_pct": es, "pl_pct": pl})
                # static's pick comes from the curve, not its own run
                if not describe(mth).measures_static_curve and changes_clocks(r):
                    errors.setdefault(mth, []).append(prediction_errors(r))
            r = got[(label, budget, s, first)] if first in methods else None
            if r is not None and curve is not None:
                curves.append(curve)
                emo_points.append((r["metrics"]["es_pct"], r["metrics"]["pl_pct"]))
        scores = {m: scoring.score(*per[m]) for m in methods if per[m][0]}
        texts = []
        for m in methods:
            s = scores.get(m)
            texts.append(f"{'-' if s is None else s.text(bpct):>{width[m]}}")
        margin_txt = f"{'-':>20}"
        if emo_points:
            mg = scoring.margins(emo_points, curves)
            n_above += scoring.above(mg)
            n_below += scoring.below(mg)
            margin_txt = f"{mg.es:>+14.2f}±{mg.es_sd:.2f}"
        ok, why = scoring.ahead({m: v for m, v in scores.items() if describe(m).rival}, bpct, first)  # rivals only
        n_ahead += ok
        print(
            f"{tab:<6}{label:<14}{budget:>7.0%}  "
            + "".join(texts)
            + margin_txt
            + f"{slack_text(emo_job.get((label, budget))):>8}"
            + f"  {'yes' if ok else 'no'} {why}",
            flush=True,
        )
    (results / "paper_tables.json").write_text(json.dumps(record, indent=1))
    n = len(table)
    if bar:  # a fair bar scores a static clock, re-measured, 0 within the spread
        d = [es - scoring.static_es_at(c, pl) for (es, pl), c in bar]
        print(
            f"the bar: static's own pick, re-measured in its own run, scores {np.mean(d):+.2f}±{scoring.spread(d):.2f} "
            f"(median {np.median(d):+.2f}) points of ES against the curve of its sweep, over {len(d)} runs"
        )
    for m, d in errors.items():
        print(prediction_text(m, d))
    print(
        f"{len(seeds)} seeds per cell; spread = sample standard deviation; `!` = PL over budget + "
        f"{scoring.TOLERANCE_PCT} %; below the static curve by more than the spread in {n_below} of {n}; "
        f"{time.perf_counter() - t_start:.0f} s",
        file=sys.stderr,
    )
    print(f"EMO ahead in {n_ahead} of {n} cells; above the static curve in {n_above} of {n}")
    return 0


if __name__ == "__main__":
    with benchreport.recording(results_section):
        sys.exit(main())
