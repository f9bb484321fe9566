"""The model on single kernels of the virtual GPUs: docs/model.md's table.

    python benchmarks/kernel_model_table.py [--step 6] [--gpus a100,h100,rtx3080ti] [--by-clock] [--pairs]

The 24 microbenchmarks (+ idle) and 12 training-step kernels of tests/kernel_tables.py at 10 clocks,
measured on each virtual GPU with its noise on (gpu.noise=1, gpu.seed=0), fitted and predicted by
emo.model.kernels.fit_predict: time / energy MAPE % of EMO (its default form, and the form chosen by
cross-validation on the benchmarks, `emo model fit --select`), the mean benchmark curve and the
plain anchored NNLS, per counter form (DCGM ratios, ncu totals), with and without an idle row;
beside it EMO with the whole-curve energy anchor (the open interface's form before the anchor set the
work energy only; the same as the default without an idle row). --step: clocks this many steps
apart from the top (6: 10 clocks down to ~600 MHz on the A100; 8: down to 330 MHz); --by-clock:
also the energy MAPE per clock of both anchors and the mean curve; --pairs: give the fit the suite's
same-work pairs (each kernel's _low and _high occupancy, `emo model fit --pair`).

`E given true T` is EMO's energy error given the true time: its energy prediction with its own predicted time
replaced by the measured one, E + P_run (T_measured - T_predicted) (the default form's energy is
running power over the time plus the mix's work energy, and with an idle row and no pairs P_run is
the idle row's power). It isolates the power law from the time model: a simulator whose power were
exactly running power x time + linear work energy would give ~0 here. Rows without an idle row: n/a.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("kernel-model-table",)
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from kernel_tables import sim_tables  # noqa: E402

from emo import benchreport  # noqa: E402
from emo.model.kernels import fit_predict  # noqa: E402
from emo.model.shapes import Form  # noqa: E402

NAMES = {"a100": "A100", "h100": "H100", "rtx3080ti": "RTX 3080 Ti"}


def cell(s: dict) -> str:
    return f"{s['mape_time_pct']:.2f} / {s['mape_energy_pct']:.2f}"


def energy_given_time(res, bench) -> float:
    """MAPE % of EMO's energy with the measured time substituted (see the module docstring)."""
    idle = bench[bench["name"] == "idle"].set_index("sm_mhz")["power_w"]
    p = res.predictions[~res.predictions["anchor"]].dropna(subset=["measured_energy_j"])
    p_run = p["sm_mhz"].map(idle)
    e = p["emo_energy_j"] + p_run * (p["measured_time_s"] - p["emo_time_s"])
    return float(((e / p["measured_energy_j"] - 1).abs() * 100).mean())


def by_clock(res, label: str) -> dict:
    p = res.predictions[~res.predictions["anchor"]]
    err = (p[f"{label}_energy_j"] / p["measured_energy_j"] - 1).abs() * 100
    return err.groupby(p["sm_mhz"]).mean().round(2).to_dict()


def main() -> None:
    ap = argparse.ArgumentParser()
    benchreport.add_flag(ap)
    ap.add_argument("--step", type=int, default=6)
    ap.add_argument("--gpus", default=",".join(NAMES))
    ap.add_argument("--by-clock", action="store_true")
    ap.add_argument("--pairs", action="store_true")
    args = ap.parse_args()
    print(
        "| GPU, counters | EMO | EMO --select | EMO, whole-curve anchor | mean curve | plain anchored NNLS | EMO E given true T |\n"
        "|---|---|---|---|---|---|---|"
    )
    for gpu in args.gpus.split(","):
        for form in ("dcgm", "ncu"):
            bench, targets = sim_tables(gpu=gpu, form=form, step=args.step)
            for idle in (True, False):
                b = bench if idle else bench[bench["name"] != "idle"]
                names = set(b["name"])
                pairs = [
                    (n, n[:-4] + "_high")
                    for n in sorted(names)
                    if args.pairs and n.endswith("_low") and n[:-4] + "_high" in names
                ]
                res = fit_predict(b, targets, counters=form, pairs=pairs)
                r = res.scores
                chosen = fit_predict(b, targets, counters=form, pairs=pairs, select=True).scores["emo"]
                whole = fit_predict(b, targets, counters=form, pairs=pairs, form=Form(anchor="curve"))
                gt = f"{energy_given_time(res, b):.2f}" if idle else "n/a"
                label = f"{NAMES[gpu]}, {'DCGM' if form == 'dcgm' else 'ncu'} form" + ("" if idle else ", no idle row")
                print(
                    f"| {label} | {cell(r['emo'])} | {cell(chosen)} | {cell(whole.scores['emo'])} | "
                    f"{cell(r['mean_curve'])} | {cell(r['nnls'])} | {gt} |",
                    flush=True,
                )
                if args.by_clock:
                    print(
                        f"  energy MAPE % by clock: emo {by_clock(res, 'emo')}\n  whole-curve {by_clock(whole, 'emo')}\n"
                        f"  mean curve {by_clock(res, 'mean_curve')}",
                        flush=True,
                    )


if __name__ == "__main__":
    with benchreport.recording("kernel-model-table"):
        main()
