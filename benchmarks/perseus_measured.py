"""EMO's time and energy model on Perseus's measured A100 plans (the SOSP'24 artifact's Merak runs).

For each model folder in Perseus's layout (N.sched.json + N.prof.json, plain or .gz), fit EMO's model
(emo.perseus.measured) on the even-numbered plans only and predict each odd-numbered plan's iteration
time and per-rank energy from its schedule alone (--fit-on odd: the other way round; --fit-on half:
fit the first half by number, predict the rest, an extrapolation along Perseus's frontier; --powers:
the fitted power of each rank computing and waiting, to see what the fit pins down). The naive predictor: the fastest fit plan (plan 0,
every instruction at the maximum clock) with each instruction's time scaled by the clock ratio and
each rank's energy by the compute-time-weighted squared clock ratio; the nearest fit plan (the even
plan whose clocks are closest) is printed beside it per model.

    python benchmarks/perseus_measured.py MODEL_DIR... [--plans] [--powers] [--fit-on odd|half] [--no-cap]

Last line: `perseus measured: time MAPE X %, energy MAPE Y % over N plans (M models); naive time A %,
energy B %` (MAPE over the predicted plans; energy over every plan and rank).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from emo import benchreport
from emo.errors import one_line
from emo.perseus.measured import fit, naive, nearest, powers_w, predict, read_folder

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("perseus-measured",)


def pct(pred, meas) -> np.ndarray:
    return 100.0 * np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)


def evaluate(folder: str, show_plans: bool, show_powers: bool, fit_on: str, capped: bool) -> dict[str, list]:
    layout, plans = read_folder(folder)
    half = (max(p.index for p in plans) + 1) // 2
    chosen = {
        "even": lambda i: i % 2 == 0,
        "odd": lambda i: i % 2 == 1,
        "half": lambda i: i < half,  # Perseus's frontier from its slowest plan up: predict the faster half
    }[fit_on]
    fitted = [p for p in plans if chosen(p.index)]
    held = [p for p in plans if not chosen(p.index)]
    if not held or not fitted:
        raise ValueError(f"{folder}: {len(plans)} plans, none to fit or none to predict with --fit-on {fit_on}")
    model = fit(layout, fitted, capped=capped)
    if show_powers:
        lo = float(min(np.concatenate(p.clocks).min() for p in fitted))
        for r in range(layout.world):
            (c_lo, w_lo), (c_hi, w_hi) = powers_w(model, r, lo), powers_w(model, r, model.fmax)
            cap = model.time[r, :, 2].min()
            print(
                f"  rank {r}: static {model.power[r, 0]:.0f} W; computing {c_lo:.0f} W at {lo:.0f} MHz,"
                f" {c_hi:.0f} W at {cap:.0f} MHz (its cap); waiting {w_lo:.0f} W at {lo:.0f} MHz, {w_hi:.0f} W at {model.fmax:.0f} MHz"
            )
    base = max(fitted, key=lambda p: float(np.mean(np.concatenate(p.clocks))))
    err: dict[str, list] = {k: [] for k in ("t", "e", "nt", "ne", "rt", "re", "bias_t", "bias_e")}
    for p in held:
        t, e = predict(model, p.clocks)
        nt, ne = naive(base, p.clocks)
        near = nearest(fitted, p.clocks)
        err["t"].append(pct(t, p.time_s))
        err["e"] += list(pct(e, p.energy_j))
        err["nt"].append(pct(nt, p.time_s))
        err["ne"] += list(pct(ne, p.energy_j))
        err["rt"].append(pct(near.time_s, p.time_s))
        err["re"] += list(pct(near.energy_j, p.energy_j))
        err["bias_t"].append(100 * (t / p.time_s - 1))
        err["bias_e"] += list(100 * (e / p.energy_j - 1))
        if show_plans:
            de = " ".join(f"{x:+.2f}" for x in 100 * (e / p.energy_j - 1))
            print(
                f"  plan {p.index}: time {p.time_s:.3f} s predicted {t:.3f} ({100 * (t / p.time_s - 1):+.2f} %), energy error per rank {de} %"
            )
    m = lambda k: float(np.mean(err[k]))
    print(
        f"{layout.model} (dp{layout.dp} pp{layout.pp} tp{layout.tp}, {layout.nmb} micro-batches): fit on {len(fitted)} plans ({fit_on}),"
        f" {len(held)} predicted: time MAPE {m('t'):.2f} % (max {max(err['t']):.2f}, bias {m('bias_t'):+.2f}),"
        f" energy MAPE {m('e'):.2f} % (max {max(err['e']):.2f}, bias {m('bias_e'):+.2f});"
        f" naive time {m('nt'):.2f} %, energy {m('ne'):.2f} %; nearest fit plan time {m('rt'):.2f} %, energy {m('re'):.2f} %"
        f" [lag {model.lag_s * 1e3:.0f} ms, tail {model.tail_s:.3f} s, caps {np.round(model.time[:, :, 2]).astype(int).tolist()} MHz]"
    )
    return err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("folders", nargs="+", metavar="MODEL_DIR")
    ap.add_argument("--plans", action="store_true", help="one line per predicted plan")
    ap.add_argument("--powers", action="store_true", help="the fitted powers per rank (identifiability)")
    ap.add_argument(
        "--fit-on",
        choices=("even", "odd", "half"),
        default="even",
        help="which plans to fit, the others are predicted (half: the first half by number)",
    )
    ap.add_argument("--no-cap", action="store_true", help="ablation: instruction times without a clock cap")
    a = ap.parse_args(argv)
    total: dict[str, list] = {}
    try:
        for f in a.folders:
            for k, v in evaluate(f, a.plans, a.powers, a.fit_on, not a.no_cap).items():
                total.setdefault(k, []).extend(v)
    except (ValueError, OSError) as e:
        print(f"perseus_measured: error: {one_line(e)}", file=sys.stderr)
        return 1
    m = lambda k: float(np.mean(total[k]))
    print(
        f"perseus measured: time MAPE {m('t'):.2f} %, energy MAPE {m('e'):.2f} % over {len(total['t'])} plans"
        f" ({len(a.folders)} models); naive time {m('nt'):.2f} %, energy {m('ne'):.2f} %"
    )
    return 0


if __name__ == "__main__":
    with benchreport.recording("perseus-measured"):
        sys.exit(main())
