"""`emo compare`: the side-by-side table of what each method saved, read from the MLflow store, and the
plots a reader wants.

    emo compare [--uri sqlite:///results/mlflow.db] [--experiment emo] [--plots DIR] [--csv FILE]

The table: one row per GPU x workload x budget, one column per method, each cell `ES±sd/PL±sd` measured by
validate over the seeds run (`gpu.seed`; the latest run of each seed wins; `ES/PL` from one seed; `!`
over budget + 0.5 %). Static is the best measured static clock within budget when validate measured
the static curve; then EMO's margin over that curve at its own PL and whether EMO is ahead, by
emo.report.scoring's rule (ahead = beyond the combined spread of every method within budget). The plots (with --plots): per GPU x workload, energy vs time
per iteration with the static clocks' curve (measured by validate for optimizer=static) and each
method's point; and for EMO's policy, the timeline of one iteration per GPU with the critical path
and the chosen clocks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from emo.io import write_json
from emo.methods import METHODS as METHOD_ORDER
from emo.methods import describe, lead
from emo.report import scoring
from emo.report.runs import latest, read_result, stage_dir, static_curve, upstream  # noqa: F401  (also emo.cli.compare's names)

METRICS = (
    "es_pct",
    "pl_pct",
    "time_error_pct",
    "energy_error_pct",
    "t_ori_s",
    "e_ori_j",
    "t_opt_s",
    "e_opt_j",
    "explore_time_s",
    "explore_energy_j",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="table (and plots) of ES/PL per workload x method x budget from MLflow")
    p.add_argument("--uri", help="MLflow tracking URI (default: the tracking config's, sqlite:///results/mlflow.db)")
    p.add_argument("--experiment", help="MLflow experiment (default: the tracking config's, emo)")
    p.add_argument("--plots", metavar="DIR", help="write energy-vs-time and timeline plots (PNG) here")
    p.add_argument("--csv", metavar="FILE", help="also write the long table (one row per run) as CSV")
    p.add_argument("--force", action="store_true", help="let --csv replace an existing file")
    p.add_argument("overrides", nargs="*", help="Hydra overrides selecting the tracking config, e.g. results=out")
    p.set_defaults(func=main)


# --------------------------------------------------------------------------- reading
def workload_label(params: dict) -> str:
    """A short name for a workload from its flattened config params (e.g. TP4, PP8 parameter): its
    kind's label (emo.workloads.WorkloadKind.label), or the kind's name when EMO knows no such kind."""
    from emo.workloads import find

    name = params.get("workload.kind", "?")
    kind = find(name)
    own = {k.removeprefix("workload."): v for k, v in params.items() if k.startswith("workload.")}
    return kind.label(own) if kind is not None else name


def load_runs(uri: str, experiment: str) -> pd.DataFrame:
    """Every MLflow run with validate's metrics: one row each, newest first."""
    from emo.workflow.tracking import search

    return runs_table(search(uri, experiment, "metrics.`validate.es_pct` > -1e30"))


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """MLflow's search_runs frame -> workload, method, budget, metrics, the validate folder's hash."""
    if df.empty:
        return pd.DataFrame(
            columns=[
                "run_id",
                "workload",
                "method",
                "budget",
                "gpu",
                "seed",
                "validate_hash",
                "graph_hash",
                "optimize_hash",
                *METRICS,
            ]
        )
    rows = []
    for _, r in df.iterrows():
        params = {k[len("params.") :]: v for k, v in r.items() if k.startswith("params.") and isinstance(v, str)}
        row = {
            "run_id": r["run_id"],
            "workload": workload_label(params),
            "method": params.get("optimizer.name", "emo"),
            "budget": float(params.get("budget", "nan")),
            "gpu": params.get("gpu.name", "?"),
            "seed": int(params.get("gpu.seed", 0) or 0),
            "validate_hash": r.get("tags.emo.validate.hash"),
            "graph_hash": r.get("tags.emo.graph.hash"),
            "optimize_hash": r.get("tags.emo.optimize.hash"),
            "results": params.get("results"),
        }
        for m in METRICS:
            v = r.get(f"metrics.validate.{m}")
            row[m] = float(v) if v is not None and not pd.isna(v) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


# Why a static cell need not be the static run's own result line (issue 47: 7.7/4.4 beside 7.27/4.68)
STATIC_NOTE = (
    "static: the best clock the static run's validate measured within budget + 0.5 % (its curve of every clock); "
    "the run's own line (emo run) is its pick, the clock the model predicts best, measured once in its own run: "
    "another clock, or the same one measured again, so the two can differ"
)


def measures_curve(name: str) -> bool:
    """A method whose validate measured the static curve (Method.measures_static_curve)."""
    m = describe(name) if isinstance(name, str) else None
    return m is not None and m.measures_static_curve


def rival(name: str) -> bool:
    """A method scored against the lead (an ablation is not; a method unknown here is)."""
    m = describe(name)
    return m is None or m.rival


def table(runs: pd.DataFrame, curves: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Rows GPU x workload x budget: how many seeds, a column per method (`ES±sd/PL±sd` over them), EMO's margin
    over the static curve, and whether EMO is ahead. `curves`: static validate hash -> the clocks it
    measured (emo.report.scoring.static_points), when the stage folders are at hand."""
    r = latest(runs)
    if r.empty:
        return pd.DataFrame()
    curves = curves or {}
    methods = [m for m in METHOD_ORDER if m in set(r["method"])] + sorted(set(r["method"]) - set(METHOD_ORDER))
    static = (
        r[r["method"].map(measures_curve) & r["validate_hash"].isin(list(curves))]
        if "validate_hash" in r
        else r.iloc[:0]
    )
    first = lead()
    rows = []
    for (gpu, wl, budget), cell in r.groupby(["gpu", "workload", "budget"], sort=True):
        mine = static[(static["gpu"] == gpu) & (static["workload"] == wl)]
        row = cell_row(cell, seed_curves(mine, budget, curves), curves, 100 * budget, first)
        rows.append({"gpu": gpu, "workload": wl, "budget": budget, **row})
    t = pd.DataFrame(rows).set_index(["gpu", "workload", "budget"])
    t = t.reindex(columns=["seeds", *methods, "EMO - static curve", "EMO ahead"]).fillna("-")
    t.columns.name = "ES% / PL%"
    return t


def seed_curves(static: pd.DataFrame, budget: float, curves: dict[str, pd.DataFrame]) -> dict[int, pd.DataFrame]:
    """Seed -> the static curve of that seed among one GPU x workload's static runs: the one measured
    at `budget` (its own pick is a point of it), else another budget's run of the same seed (the
    clocks it measured are the same)."""
    return {
        int(row["seed"]): curves[row["validate_hash"]]
        for _, row in static.sort_values("budget", key=lambda b: b == budget, kind="stable").iterrows()
    }


def cell_row(cell: pd.DataFrame, seed_curve: dict[int, pd.DataFrame], curves: dict, bpct: float, first: str) -> dict:
    """One row of the table from a cell's runs at a budget of `bpct` %: seeds, each method's score,
    the margin of `first` (EMO) over the static curve and the verdict."""
    scores = {m: method_score(m, g, curves, bpct) for m, g in cell.groupby("method")}
    emo = cell[(cell["method"] == first) & cell["seed"].isin(list(seed_curve))]
    return {
        "seeds": cell["seed"].nunique(),
        **{m: s.text(bpct) for m, s in scores.items()},
        "EMO - static curve": curve_margin(emo, seed_curve),
        "EMO ahead": verdict(scores, bpct, first),
    }


def method_score(method: str, runs: pd.DataFrame, curves: dict[str, pd.DataFrame], bpct: float) -> scoring.Score:
    """ES/PL over one method's seeds in a cell; a static run by the best clock of its own curve
    within the budget (was: by the seed's curve of any budget), where that curve is at hand."""
    points = [(row["es_pct"], row["pl_pct"]) for _, row in runs.iterrows()]
    if measures_curve(method):
        points = [
            scoring.best_static(curves[row["validate_hash"]], bpct)[:2] if row.get("validate_hash") in curves else pt
            for pt, (_, row) in zip(points, runs.iterrows())
        ]
    return scoring.score([p[0] for p in points], [p[1] for p in points])


def curve_margin(emo: pd.DataFrame, seed_curve: dict[int, pd.DataFrame]) -> str:
    """EMO's ES margin over its seeds' static curves at its own PL (`±sd` over several seeds); `-`
    without a curve."""
    if not len(emo):
        return "-"
    mg = scoring.margins(
        [(row["es_pct"], row["pl_pct"]) for _, row in emo.iterrows()],
        [seed_curve[int(sd)] for sd in emo["seed"]],
    )
    return f"{mg.es:+.2f}±{mg.es_sd:.2f}" if mg.n > 1 else f"{mg.es:+.2f}"


def verdict(scores: dict[str, scoring.Score], bpct: float, first: str) -> str:
    """Whether `first` (EMO) is ahead of its rivals in a cell (an ablation is no rival), and why not."""
    rivals = {m: v for m, v in scores.items() if rival(m)}
    ok, why = scoring.ahead(rivals, bpct, first)
    n = scores[first].n if first in scores else 0
    if first in rivals and len(rivals) == 1:
        return "- (no baseline measured)"
    return ("yes" if ok else f"no: {why}") + (" (n = 1 seed: no spread)" if n == 1 else "")


def static_points(runs: pd.DataFrame, results: Path) -> dict[str, pd.DataFrame]:
    """Static validate hash -> every clock it measured (its curve and its own pick) as PL/ES %."""
    out = {}
    for _, row in runs[runs["method"].map(measures_curve) & runs["validate_hash"].notna()].iterrows():
        f = stage_dir(results, "validate", row["validate_hash"]) / "pareto.parquet"
        if f.exists():
            out[row["validate_hash"]] = scoring.static_points(pd.read_parquet(f), row.to_dict())
    return out


def results_rows(jobs: list[tuple[dict, str]]) -> pd.DataFrame:
    """The runs table from validate's result.json files ((resolved config, validate folder) per job)
    instead of MLflow: what the pipeline's own summary rule reads. A job validate could not measure
    (a recorded trace) has no row."""
    from emo.workflow.tracking import flatten

    frames = []
    for cfg, vdir in jobs:
        res = read_result(Path(vdir) / "result.json")
        if "metrics" not in res:
            continue
        row = {
            "run_id": Path(vdir).name,
            "tags.emo.validate.hash": Path(vdir).name,
            **{f"params.{k}": v for k, v in flatten(cfg).items()},
            **{f"metrics.validate.{k}": v for k, v in res["metrics"].items()},
        }
        frames.append(row)
    return runs_table(pd.DataFrame(frames))


# --------------------------------------------------------------------------- the pipeline's summary
def write_summary(jobs: list[tuple[str, dict, str]], out: Path) -> dict[str, list[str]]:
    """A sweep's shareable summary from its jobs' (name, resolved config, validate folder): the table
    (`compare.tsv`), ES/PL and prediction errors per job (`jobs.tsv`), the plots (`plots/`) and which
    plots belong to which job (`plots.json`, validate hash -> file names: MLflow attaches them)."""
    from emo.report.plots import plot_energy_time, plot_timeline, slug
    from emo.workflow.plan import plan

    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    results = Path(jobs[0][2]).parents[1]
    jobs = [j for j in jobs if "metrics" in read_result(Path(j[2]) / "result.json")]  # measured ones
    runs = results_rows([(cfg, vdir) for _, cfg, vdir in jobs])
    runs["job"] = [name for name, _, _ in jobs]
    table(runs, static_points(runs, results)).to_csv(out / "compare.tsv", sep="\t")
    cols = [
        "job",
        "gpu",
        "workload",
        "method",
        "budget",
        "es_pct",
        "pl_pct",
        "time_error_pct",
        "energy_error_pct",
        "validate_hash",
    ]
    runs[cols].to_csv(out / "jobs.tsv", sep="\t", index=False, float_format="%.3f")
    index: dict[str, list[str]] = {h: [] for h in runs["validate_hash"]}
    for path in plot_energy_time(runs, results, out / "plots"):
        gpu_wl = path.stem.removeprefix("energy_time_")
        for _, row in runs.iterrows():
            if f"{slug(row['gpu'])}_{slug(row['workload'])}" == gpu_wl:
                index[row["validate_hash"]].append(path.name)
    for (_name, cfg, vdir), (_, row) in zip(jobs, runs.iterrows()):
        plans = plan(cfg)
        p = plot_timeline(
            plans["graph"].dir,
            plans["optimize"].dir,
            Path(vdir),
            out / "plots",
            f"{row['workload']} on {row['gpu']}: {row['method']}, budget {row['budget']:.0%}",
        )
        if p:
            index[row["validate_hash"]].append(p.name)
    write_json(out / "plots.json", index)
    return index


# --------------------------------------------------------------------------- command
def results_dir(uri: str, runs: pd.DataFrame) -> Path:
    """Where the stage folders are: the runs' `results` param, else beside the SQLite store."""
    given = runs["results"].dropna() if "results" in runs else pd.Series(dtype=str)
    if len(given):
        return Path(given.iloc[0])
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent
    return Path("results")


def main(args: argparse.Namespace) -> int:
    uri, experiment = tracking_store(args)
    if args.csv:
        from emo.io import check_output

        check_output(args.csv, "--csv", force=args.force)
    runs = load_runs(uri, experiment)
    if runs.empty:
        print("emo compare: no validated runs yet", file=sys.stderr)
        return 1
    curves = static_points(runs, results_dir(uri, runs))
    t = table(runs, curves)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(t.to_string())
    if curves and any(measures_curve(m) for m in t.columns):
        print(STATIC_NOTE)
    if args.csv:
        write_csv(args.csv, runs)
    if args.plots:
        for p in write_plots(Path(args.plots), results_dir(uri, runs), runs):
            print(f"wrote {p}", file=sys.stderr)
    return 0


def tracking_store(args: argparse.Namespace) -> tuple[str, str]:
    """The MLflow URI and experiment: the options', else the tracking config's; an SQLite store that
    is not there is a one-line error."""
    uri, experiment = args.uri, args.experiment
    if uri is None or experiment is None:
        from emo.sections import TrackingConfig, typed
        from emo.workflow.plan import compose
        from emo.workflow.tracking import tracking_uri

        tracking = typed(TrackingConfig, compose(args.overrides)["tracking"])
        uri, experiment = uri or tracking_uri(tracking), experiment or tracking.experiment
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise FileNotFoundError(f"{uri.removeprefix('sqlite:///')}: no MLflow store (run `emo run` first)")
    return uri, experiment


def write_csv(path: str, runs: pd.DataFrame) -> None:
    """The long table (the latest run of each seed and cell) as CSV, written whole or not at all."""
    from emo.io import atomic_path

    try:
        with atomic_path(path) as tmp:
            latest(runs).drop(columns=["results"]).to_csv(tmp, index=False)
    except OSError as e:
        raise ValueError(f"--csv {path}: cannot write ({e.strerror or e})") from None


def write_plots(out: Path, results: Path, runs: pd.DataFrame) -> list[Path]:
    """Energy vs time per GPU x workload, and the timeline of each validated run, into `out`."""
    from emo.report.plots import plot_energy_time, plot_timeline

    out.mkdir(parents=True, exist_ok=True)
    written = plot_energy_time(runs, results, out)
    for _, row in latest(runs)[lambda d: d["validate_hash"].notna()].iterrows():
        dirs = stage_dirs(results, row)
        p = plot_timeline(
            dirs["graph"],
            dirs["optimize"],
            stage_dir(results, "validate", row["validate_hash"]),
            out,
            f"{row['workload']} on {row['gpu']}: {row['method']}, budget {row['budget']:.0%}",
        )
        if p:
            written.append(p)
    return written


def stage_dirs(results: Path, row: pd.Series) -> dict[str, Path | None]:
    """The graph and optimize folders of a run: by the hashes MLflow tagged, else from its validate folder."""
    hashes = {st: row.get(f"{st}_hash") for st in ("graph", "optimize")}
    return {
        st: stage_dir(results, st, h) if isinstance(h, str) else upstream(results, "validate", row["validate_hash"], st)
        for st, h in hashes.items()
    }
