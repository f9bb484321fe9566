"""`emo model fit`: the open calibration interface from the command line.

    emo model fit --bench bench.csv --targets kernels.parquet [--features all|A,B:total,...]
                  [--counters dcgm|ncu] [--select] [--ref-mhz F] [--json]

Both files are long tables, one row per (name, clock): name, sm_mhz, time_s (optional), energy_j or
power_w, and feature columns: counters as their source names them (emo.device.features) or any
numeric column (--features; emo.model.columns). Each target's row at the reference clock is its
anchor; every other measured row is predicted and scored against the mean-curve baseline and a
plain anchored NNLS (emo.model.kernels). --select chooses the model's form by cross-validation on
the benchmarks alone.
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
        raise ValueError(
            f"{option} {path}: cannot read it as {'Parquet' if path.suffix in ('.parquet', '.pq') else 'CSV'} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None


def check_table(df, option: str, path: str, *, curves: bool) -> None:
    """What the model cannot take from a file, named by file, row and column: a value that is not
    finite (NaN stays: a counter not measured), or, in a table of `curves` (the benchmarks), one
    clock only."""
    import numpy as np

    num = df.select_dtypes("number")
    bad = np.isinf(num.to_numpy(dtype=float))
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        who = f"{df['name'].iloc[i]} at {df['sm_mhz'].iloc[i]} MHz" if {"name", "sm_mhz"} <= set(df) else f"row {i + 1}"
        raise ValueError(f"{option} {path}: {who} has {num.columns[j]}={num.iat[i, j]} (must be finite)")
    if curves and "sm_mhz" in df and df["sm_mhz"].nunique() == 1:
        raise ValueError(f"{option} {path}: every row is at {df['sm_mhz'].iloc[0]} MHz; the model needs several clocks")


# the names fit_predict's messages start with -> the options and files the user gave
def _where(args) -> dict[str, str]:
    return {
        "bench and targets:": f"--bench {args.bench} and --targets {args.targets}:",
        "bench:": f"--bench {args.bench}:",
        "targets:": f"--targets {args.targets}:",
        "ref-mhz:": "--ref-mhz",
        "pairs:": "--pair",
        "overlap:": "--overlap",
        "features:": "--features",
        "counters:": "--counters",
    }


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
    f.add_argument(
        "--features",
        metavar="all|A,B,...",
        help="feature columns: all (every numeric column) or a comma list; NAME:ratio or NAME:total "
        "pins how a column is read (default: every numeric column, unknown names as ratios)",
    )
    f.add_argument(
        "--counters",
        choices=("dcgm", "ncu", "emo", "gpupowermodel"),
        help="read only this source's known counter names (default: every source's)",
    )
    f.add_argument(
        "--select",
        action="store_true",
        help="choose the model's form (mix, anchoring, overlap, smoothing) by cross-validation on the "
        "benchmarks only, and say which",
    )
    f.add_argument("--ref-mhz", type=int, help="reference (anchor) clock (default: the highest benchmark clock)")
    f.add_argument("--idle", help="name of the idle row (default: a row named idle, else estimated)")
    f.add_argument(
        "--pair",
        action="append",
        metavar="A,B",
        help="two benchmarks doing the same work at different occupancy (repeatable; default none)",
    )
    f.add_argument("--overlap", choices=("roofline", "sum"), default="roofline")
    f.add_argument("--out", help="also write the per-target, per-clock predictions here (CSV or Parquet)")
    f.add_argument("--force", action="store_true", help="let --out replace an existing file")
    f.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    f.set_defaults(func=_cmd_fit)


def _cmd_fit(args) -> int:
    from emo.model.kernels import fit_predict

    if args.out:  # before anything is read: never over an input, an existing file (without --force) or a device
        from emo.io import check_output

        check_output(args.out, "--out", inputs={"--bench": args.bench, "--targets": args.targets}, force=args.force)
    tables = {}
    for option, path in (("--bench", args.bench), ("--targets", args.targets)):
        tables[option] = read_table(path, option)
        check_table(tables[option], option, path, curves=option == "--bench")
    from emo.model.checks import check_fit_inputs  # units, shape, duplicates: the verdicts, or one line refusing

    verdicts = check_fit_inputs(tables, {"--bench": args.bench, "--targets": args.targets})
    try:
        res = fit_predict(
            tables["--bench"],
            tables["--targets"],
            features=args.features,
            counters=args.counters,
            ref_mhz=args.ref_mhz,
            idle=args.idle,
            pairs=_pairs(args.pair),
            overlap=args.overlap,
            select=args.select,
        )
    except ValueError as e:
        text = str(e)
        head = next((h for h in _where(args) if text.startswith(h)), None)
        raise (ValueError(_where(args)[head] + text.removeprefix(head)) if head else e) from None
    for w in res.warnings:  # one line each, on stderr, also with --json
        print(f"emo: warning: {w}", file=sys.stderr)
    if args.out:
        _write(res.predictions, Path(args.out))
    if args.json:
        from emo.errors import write_stdout

        write_stdout(json.dumps(res.to_json()) + "\n")
        return 0
    n = res.predictions["name"].nunique()
    print(f"{n} targets, reference {res.reference_mhz} MHz, features: {', '.join(res.features) or 'none'}")
    print(
        f"form: mix={res.form['mix']} anchor={res.form['anchor']} overlap={res.form['overlap']} "
        f"smooth={'on' if res.form['smooth'] else 'off'}{' (by cross-validation on the benchmarks)' if res.selection else ''}"
    )
    for name, how in res.normalisation.items():
        print(f"feature {name}: {how}")
    for line in [*verdicts, *(f"note: {note}" for note in res.notes)]:
        print(line)
    pred = res.predictions
    if not (~pred["anchor"] & pred.filter(like="measured_").notna().any(axis=1)).any():
        print("note: no target is measured away from its anchor clock: predictions only (--out), nothing scored")
    for q in ("time", "energy", "power"):
        row = {m: s.get(f"mape_{q}_pct") for m, s in res.scores.items()}
        if row["emo"] is not None:
            print(f"MAPE {q:6s} %: emo {row['emo']:.2f}  mean curve {row['mean_curve']:.2f}  nnls {row['nnls']:.2f}")
    return 0


def _write(predictions, out: Path) -> None:
    """--out, whole or not at all; a failure names the file the user asked for, not its temporary copy."""
    from emo.io import atomic_path

    try:
        with atomic_path(out) as tmp:
            if out.suffix in (".parquet", ".pq"):
                predictions.to_parquet(tmp, index=False)
            else:
                predictions.to_csv(tmp, index=False)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write ({e.strerror or e})") from None
