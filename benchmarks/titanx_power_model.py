"""Microbenchmark power model on real data: GTX Titan X (Guerreiro et al., hpc-ulisboa/gpupowermodel).

Fit on the 101 microbenchmark configurations (utilisations at the default clocks + power at 16 core
x 4 memory clocks) and the idle run; predict the 35 applications' power at all 64 clock pairs from
their utilisations. MAPE per application and overall, against two baselines:
  absolute: EMO's mix from utilisations vs the mean power curve of the microbenchmarks;
  anchored (last line): both shapes scaled to the application's measured power at the default
  clocks (975 MHz core, 3505 MHz memory), i.e. the model only has to say how power scales.
Then the same data through the open calibration interface (emo.model.kernels, what `emo model fit`
runs): long tables at the default memory clock, 16 core clocks, anchored at 1164 MHz (the highest,
the interface's default) and at 975 MHz, with and without the idle row, in the default form and the
form chosen by cross-validation on the benchmarks (--select), against the mean curve and a plain
anchored NNLS.

    python benchmarks/titanx_power_model.py [DATA_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from emo import benchreport
from emo.model.gpupowermodel import long_table, read_power_curves
from emo.model.kernels import fit_predict
from emo.model.power import evaluate_power_model

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("titanx-power-model",)
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dvfs" / "gpupowermodel_titanx"
MICRO = "TitanX__titanx_micro_names_peak_idle_HPCAandCF.csv"
APPS = "TitanX__titanx_real_allFsPower_HPCAandCF.csv"


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchreport.add_flag(p)
    p.add_argument(
        "data", nargs="?", type=Path, default=DATA, help=f"folder holding {MICRO} and {APPS} (default: {DATA})"
    )
    data = p.parse_args(argv[1:]).data
    try:
        micro, apps = read_power_curves(data / MICRO), read_power_curves(data / APPS)
    except (FileNotFoundError, ValueError) as e:
        print(f"titanx_power_model: error: {e}", file=sys.stderr)
        return 2
    table = evaluate_power_model(micro, apps)
    print(
        f"GTX Titan X: {len(micro.names) - 1} microbenchmarks + idle, {len(apps.names)} applications, "
        f"{len(micro.clocks)} (core, memory) clock pairs, default {micro.default_mhz}"
    )
    print(table.round(2).to_string())
    mean = table.mean()
    print(f"overall absolute MAPE %: emo {mean['emo']:.2f} vs mean-curve baseline {mean['baseline']:.2f}")
    print(
        f"apps where emo beats the baseline: absolute {(table['emo'] < table['baseline']).sum()}/{len(table)}, "
        f"anchored {(table['emo_anchored'] < table['baseline_anchored']).sum()}/{len(table)}"
    )
    bench, targets = long_table(micro), long_table(apps)
    for ref in (None, micro.default_mhz[0]):
        for label, b in (("", bench), (", no idle row", bench[bench["name"] != "Idle"])):
            sc = fit_predict(b, targets, ref_mhz=ref)
            sel = fit_predict(b, targets, ref_mhz=ref, select=True).scores["emo"]["mape_power_pct"]
            print(
                f"open interface, anchor {sc.reference_mhz} MHz{label}, power MAPE %: emo {sc.scores['emo']['mape_power_pct']:.2f} "
                f"(--select {sel:.2f}) vs mean curve {sc.scores['mean_curve']['mape_power_pct']:.2f}, "
                f"plain NNLS {sc.scores['nnls']['mape_power_pct']:.2f}"
            )
    print(f"titanx MAPE %: emo {mean['emo_anchored']:.2f} vs baseline {mean['baseline_anchored']:.2f}")
    return 0


if __name__ == "__main__":
    with benchreport.recording("titanx-power-model"):
        sys.exit(main(sys.argv))
