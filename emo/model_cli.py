"""`emo model fit`: the open calibration interface from the command line.

    emo model fit --bench bench.csv --targets kernels.parquet [--counters dcgm|ncu] [--ref-mhz F] [--json]

Both files are long tables, one row per (name, clock): name, sm_mhz, time_s (optional), energy_j or
power_w, and counter columns as their source names them (emo.device.features). Each target's row
at the reference clock is its anchor; every other measured row is predicted and scored against the
mean-curve baseline and a plain anchored NNLS (emo.model.kernels).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def read_table(path: str | Path, option: str):
    """A CSV or Parquet table (by suffix); one line naming the file when it cannot be read."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{option} {path}: no such file")
    try:
        return pd.read_parquet(path) if path.suffix in (".parquet", ".pq") else pd.read_csv(path)
    except Exception as e:  # a malformed file: say which one
        raise ValueError(f"{option} {path}: cannot read it as {'Parquet' if path.suffix in ('.parquet', '.pq') else 'CSV'} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _pairs(items: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for it in items or []:
        a, sep, b = it.partition(",")
        if not sep or not a or not b:
            raise ValueError(f"--pair {it!r}: want two benchmark names, A,B")
        out.append((a, b))
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("model", help="the energy-latency model on tables from any source")
    sub = p.add_subparsers(dest="model_command", required=True)
    f = sub.add_parser("fit", help="fit on a benchmark table, predict and score target kernels", description=__doc__)
    f.add_argument("--bench", required=True, help="benchmark table (CSV or Parquet)")
    f.add_argument("--targets", required=True, help="target kernels table (CSV or Parquet)")
    f.add_argument("--counters", choices=("dcgm", "ncu", "emo", "gpupowermodel"),
                   help="read only this source's counter columns (default: every known name)")
    f.add_argument("--ref-mhz", type=int, help="reference (anchor) clock (default: the highest benchmark clock)")
    f.add_argument("--idle", help="name of the idle row (default: a row named idle, else estimated)")
    f.add_argument("--pair", action="append", metavar="A,B",
                   help="two benchmarks doing the same work at different occupancy (repeatable; default none)")
    f.add_argument("--overlap", choices=("roofline", "sum"), default="roofline")
    f.add_argument("--out", help="also write the per-target, per-clock predictions here (CSV or Parquet)")
    f.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    f.set_defaults(func=_cmd_fit)


def _cmd_fit(args) -> int:
    from emo.model.kernels import fit_predict

    res = fit_predict(read_table(args.bench, "--bench"), read_table(args.targets, "--targets"),
                      counters=args.counters, ref_mhz=args.ref_mhz, idle=args.idle, pairs=_pairs(args.pair),
                      overlap=args.overlap)
    if args.out:
        from emo.io import atomic_path

        out = Path(args.out)
        with atomic_path(out) as tmp:
            if out.suffix in (".parquet", ".pq"):
                res.predictions.to_parquet(tmp, index=False)
            else:
                res.predictions.to_csv(tmp, index=False)
    if args.json:
        json.dump(res.to_json(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    n = res.predictions["name"].nunique()
    print(f"{n} targets, reference {res.reference_mhz} MHz, features: {', '.join(res.features) or 'none'}")
    for note in res.notes:
        print(f"note: {note}")
    for q in ("time", "energy", "power"):
        row = {m: s.get(f"mape_{q}_pct") for m, s in res.scores.items()}
        if row["emo"] is not None:
            print(f"MAPE {q:6s} %: emo {row['emo']:.2f}  mean curve {row['mean_curve']:.2f}  nnls {row['nnls']:.2f}")
    return 0
