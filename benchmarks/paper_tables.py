"""Reproduce the shape of the paper's Tables III and IV on the virtual A100: measured energy saving
(ES %) and performance loss (PL %) of EMO and the baselines (static, Zeus, Perseus, GEEPAFS).

    python benchmarks/paper_tables.py [--quick] [--results DIR] [--cores N] [--methods emo,static,...]

Cells: Table III, tensor parallelism TP 2/4/8 at budgets 2 % and 5 %; Table IV, pipeline parallelism
PP 2/4/8 with uniform and parameter partitions at 0 %, and CPU-offloaded MoE decode at 0 %. Every cell
is the whole pipeline (`emo run`: trace, graph, pack, profile, fit, optimize, validate) and every
number is measured by validate on the virtual GPU, never predicted. --quick: TP2, PP2 (both
partitions) and offload only. Stage folders are content-hashed, so a second run reuses what it can.

A cell counts for EMO when its measured PL is within the budget + 0.5 % and its ES is above every
baseline that also kept within budget + 0.5 % (a baseline over it is marked `!` and does not count).
Last line: `EMO ahead in N of M cells`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emo.plan import compose, plan  # noqa: E402

from emo.methods import METHODS  # noqa: E402
TOLERANCE_PCT = 0.5


def cells(quick: bool) -> list[tuple[str, str, list[str], float]]:
    """(table, label, workload overrides, budget)."""
    out = []
    for tp in (2,) if quick else (2, 4, 8):
        for b in (0.02, 0.05):
            out.append(("III", f"TP{tp}", ["workload=tp", f"workload.tp={tp}"], b))
    for pp in (2,) if quick else (2, 4, 8):
        for part in ("uniform", "parameter"):
            out.append(("IV", f"PP{pp} {part}", ["workload=pp", f"workload.pp={pp}", f"workload.partition={part}"], 0.0))
    out.append(("IV", "offload", ["workload=offload"], 0.0))
    return out


def run_cell(overrides: list[str], cores: int, timeout_s: float, log: Path) -> dict | str:
    """The cell's validate metrics; runs `emo run` in its own process group (killed on timeout) when
    the result is not there yet. A string says why there is none."""
    result = Path(plan(compose(overrides))["validate"].out("result.json"))
    if not result.exists():
        with open(log, "a") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "emo.cli", "run", "-c", str(cores), *overrides],
                                    stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=log.parent)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return f"timeout {timeout_s:.0f} s"
        result = Path(plan(compose(overrides))["validate"].out("result.json"))  # code may have changed meanwhile
        if rc != 0 or not result.exists():
            return "failed"
    return json.loads(result.read_text())["metrics"]


def ahead(row: dict[str, dict | None], budget_pct: float) -> tuple[bool, str]:
    emo = row.get("emo")
    if emo is None:
        return False, "EMO did not finish"
    if emo["pl_pct"] > budget_pct + TOLERANCE_PCT:
        return False, f"EMO PL {emo['pl_pct']:.2f} % over budget"
    beaten = [m for m, r in row.items() if m != "emo" and r is not None
              and r["pl_pct"] <= budget_pct + TOLERANCE_PCT and r["es_pct"] >= emo["es_pct"]]
    return (not beaten), ("" if not beaten else "behind " + ", ".join(beaten))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="TP2, PP2 and offload only")
    ap.add_argument("--results", default=str(ROOT / "results" / "paper_tables"), help="stage folders (reused); the pipeline's log goes to paper_tables.log there")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--track", action="store_true", help="also log to MLflow (slower)")
    ap.add_argument("--cell-timeout", type=float, default=900.0, help="seconds per method x cell (the pipeline)")
    args = ap.parse_args()
    args.results = str(Path(args.results).resolve())
    methods = [m for m in args.methods.split(",") if m]
    missing = [m for m in methods if not (ROOT / "conf" / "optimizer" / f"{m}.yaml").exists()]
    if missing:
        print(f"skipping methods without conf/optimizer/<name>.yaml: {', '.join(missing)}", file=sys.stderr)
        methods = [m for m in methods if m not in missing]
    common = [f"results={args.results}", f"tracking.enabled={str(args.track).lower()}", "validate.pareto_points=0"]

    Path(args.results).mkdir(parents=True, exist_ok=True)
    log = Path(args.results) / "paper_tables.log"
    rows = []
    for table, label, wl, budget in cells(args.quick):
        row: dict[str, dict | None] = {}
        for m in methods:
            t0 = time.perf_counter()
            got = run_cell(wl + [f"optimizer={m}", f"budget={budget}"] + common, args.cores, args.cell_timeout, log)
            row[m] = got if isinstance(got, dict) else None
            print(f"cell {label:<14} {budget:>4.0%} {m:<8} "
                  + (got if isinstance(got, str) else f"ES {got['es_pct']:6.2f} %  PL {got['pl_pct']:5.2f} %")
                  + f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        rows.append((table, label, budget, row))

    width = 15
    print(f"{'table':<6}{'workload':<16}{'budget':>7}  " + "".join(f"{m + ' ES/PL %':>{width}}" for m in methods) + "  EMO ahead")
    n_ahead = 0
    for table, label, budget, row in rows:
        budget_pct = 100 * budget
        cells_txt = []
        for m in methods:
            r = row[m]
            if r is None:
                cells_txt.append(f"{'-':>{width}}")
                continue
            flag = "!" if r["pl_pct"] > budget_pct + TOLERANCE_PCT else " "
            cells_txt.append(f"{r['es_pct']:>{width - 8}.1f}/{r['pl_pct']:>5.1f}{flag}")
        ok, why = ahead(row, budget_pct) if "emo" in methods else (False, "EMO not run")
        n_ahead += ok
        print(f"{table:<6}{label:<16}{budget:>7.0%}  " + "".join(cells_txt) + f"  {'yes' if ok else 'no'} {why}")
    print(f"EMO ahead in {n_ahead} of {len(rows)} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
