"""At which clock-request latency Perseus and EMO cross on a pipeline cell (issue 45, item 4).

    python benchmarks/latency_crossing.py --results DIR [--cell PP4] [--seed 0] [--latencies 0,1,2,5,10,15]

Takes EMO's plan that a finished sweep made for the cell (`emo run -m results=DIR optimizer=emo
gpu.seed=S ...`, budget 0: its optimize folder's policy.json) and measures it again with the
validate stage's protocol on a virtual A100 whose every clock request lands after a constant L ms
(`gpu.physics.clock_delay_ms=[L,L]`, no target slope, no stalls), for each L given; with --a100 once
more with the A100's own latency (the fit to Perseus's runs, conf/gpu/a100.yaml), as `a100`. Perseus
profiles and plans inside validate (as its code does, online), so it runs whole at each latency; its
plan does not use the latency. EMO's plan is held fixed: its leads stay the ones it planned from the
latency its calibrate stage measured, so at a latency far from that one EMO is not re-planned.

A line per latency: ES / PL of both (`!`: over budget + the scoring's tolerance, counts for
nothing), and which is ahead within the budget; the last line gives the latency at which Perseus's
counted saving meets EMO's (linear between the two latencies around the first change of sign).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emo import benchreport  # noqa: E402
from emo.device.backends import open_device  # noqa: E402  (the checkout, not an installed emo)
from emo.methods import ONLINE, PL_TOLERANCE_PCT  # noqa: E402
from emo.sections import Config, typed  # noqa: E402
from emo.validate import validate  # noqa: E402
from emo.workflow.plan import compose, plan  # noqa: E402

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("latency-crossing",)
CELLS = {
    "PP4": ["workload=pp", "workload.pp=4", "workload.partition=uniform"],
    "TP2xPP2xDP2": ["workload=hybrid", "workload.tp=2", "workload.pp=2", "workload.dp=2"],
    "gpt3xl": ["workload=pp-gpt3xl"],
}
METHODS = ("emo", "perseus")


def constant_latency(ms: float) -> list[str]:
    return [
        f"gpu.physics.clock_delay_ms=[{ms},{ms}]",
        "gpu.physics.clock_target_slope=0",
        "gpu.physics.clock_tail_prob=0",
    ]


def measure(overrides: list[str], policy: Path | None) -> tuple[float, float]:
    cfg = compose(overrides)
    result, _, _ = validate(typed(Config, cfg), policy, lambda: open_device(cfg["gpu"]))
    m = result["metrics"]
    return float(m["es_pct"]), float(m["pl_pct"])


def counted(es: float, pl: float, budget_pct: float) -> float | None:
    """The saving the scoring counts: none over budget + tolerance."""
    return es if pl <= budget_pct + PL_TOLERANCE_PCT else None


def crossing(lat: list[float], lead: list[float | None]) -> tuple[float, float] | None:
    """Where Perseus's lead over EMO (its counted ES minus EMO's; None: Perseus over budget) first
    stops being positive, scanning up from the lowest latency: (x, x) linear between the two latencies
    around a change of sign, (a, b) when Perseus leaves the budget between a and b; None when it is
    not ahead at the lowest latency or stays ahead throughout."""
    if not lead or lead[0] is None or lead[0] <= 0:
        return None
    for i in range(1, len(lat)):
        a, b = lead[i - 1], lead[i]
        if b is None:
            return (lat[i - 1], lat[i])
        if b <= 0:
            x = float(np.interp(0.0, [b, a], [lat[i], lat[i - 1]]))  # type: ignore[list-item]
            return (x, x)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchreport.add_flag(ap)
    ap.add_argument("--results", type=Path, required=True, help="the sweep's results folder")
    ap.add_argument("--cell", default="PP4", choices=sorted(CELLS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=0.0)
    ap.add_argument("--latencies", default="0,1,2,5,10,15", help="constant latencies (ms), comma-separated")
    ap.add_argument(
        "--emo-policy",
        type=Path,
        default=None,
        help="EMO's policy.json (default: the sweep's, by the configuration's hash)",
    )
    ap.add_argument("--a100", action="store_true", help="and the A100's own latency (what the sweep measured)")
    a = ap.parse_args(argv)
    lat = sorted(float(x) for x in a.latencies.split(","))
    base = [*CELLS[a.cell], f"gpu.seed={a.seed}", f"budget={a.budget}", f"results={a.results}"]
    policies: dict[str, Path | None] = {}
    for m in METHODS:
        if m in ONLINE:  # it profiles and plans while validate runs it: nothing to take over
            policies[m] = None
            continue
        if m == "emo" and a.emo_policy is not None:
            policies[m] = a.emo_policy
            continue
        p = plan(compose([*base, f"optimizer={m}"]))["optimize"].dir / "policy.json"
        if not p.exists():
            print(
                f"latency_crossing: {p}: no {m} plan for {a.cell} seed {a.seed}: run the sweep first", file=sys.stderr
            )
            return 2
        policies[m] = p
    budget_pct = 100 * a.budget
    lead: list[float | None] = []
    rows = [(f"{x:g} ms", constant_latency(x)) for x in lat] + ([("a100", [])] if a.a100 else [])
    for label, over in rows:
        got = {m: measure([*base, f"optimizer={m}", *over], policies[m]) for m in METHODS}
        cnt = {m: counted(*got[m], budget_pct) for m in METHODS}
        e, p = cnt["emo"], cnt["perseus"]
        ahead = "-" if e is None and p is None else "emo" if p is None or (e is not None and e > p) else "perseus"
        cells = "  ".join(
            f"{m} ES {es:6.2f} PL {pl:5.2f}{' !' if cnt[m] is None else '  '}" for m, (es, pl) in got.items()
        )
        print(f"{a.cell} seed {a.seed} latency {label:>6}: {cells}  ahead: {ahead}", flush=True)
        if label != "a100":
            lead.append(None if p is None else p - (e if e is not None else 0.0))
    x = crossing(lat, lead)
    if x is None:
        never = lead[0] is None or lead[0] <= 0
        print(f"crossing: none in {a.latencies} ms (Perseus {'never ahead' if never else 'ahead throughout'})")
    elif x[0] == x[1]:
        print(f"crossing: Perseus's counted saving meets EMO's at {x[0]:.1f} ms")
    else:
        print(f"crossing: Perseus leaves the budget between {x[0]:g} and {x[1]:g} ms")
    return 0


if __name__ == "__main__":
    with benchreport.recording("latency-crossing"):
        sys.exit(main())
