"""The model on single kernels of the virtual GPUs: docs/model.md's table.

    python benchmarks/kernel_model_table.py

The 24 microbenchmarks (+ idle) and 12 training-step kernels of tests/kernel_tables.py at 10 clocks,
measured on each virtual GPU with its noise on (gpu.noise=1, gpu.seed=0), fitted and predicted by
emo.model.kernels.fit_predict: time / energy MAPE % of EMO, the mean benchmark curve and the plain
anchored NNLS, per counter form (DCGM ratios, ncu totals), with and without an idle row.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from kernel_tables import sim_tables  # noqa: E402

from emo.model.kernels import fit_predict  # noqa: E402

NAMES = {"a100": "A100", "h100": "H100", "rtx3080ti": "RTX 3080 Ti"}


def cell(s: dict) -> str:
    return f"{s['mape_time_pct']:.2f} / {s['mape_energy_pct']:.2f}"


def main() -> None:
    print("| GPU, counters | EMO | mean curve | plain anchored NNLS |\n|---|---|---|---|")
    for gpu, name in NAMES.items():
        for form in ("dcgm", "ncu"):
            bench, targets = sim_tables(gpu=gpu, form=form)
            for idle in (True, False):
                b = bench if idle else bench[bench["name"] != "idle"]
                r = fit_predict(b, targets, counters=form).scores
                label = f"{name}, {'DCGM' if form == 'dcgm' else 'ncu'} form" + ("" if idle else ", no idle row")
                print(f"| {label} | {cell(r['emo'])} | {cell(r['mean_curve'])} | {cell(r['nnls'])} |", flush=True)


if __name__ == "__main__":
    main()
