"""`emo compare`: the side-by-side table of what each method saved, read from the MLflow store, and the
plots a reader wants.

    emo compare [--uri sqlite:///results/mlflow.db] [--experiment emo] [--plots DIR] [--csv FILE]

The table: one row per GPU x workload x budget, one column per method, each cell `ES% / PL%` measured by
validate (the latest run of that cell wins). The plots (with --plots): per GPU x workload, energy vs time
per iteration with the static clocks' curve (measured by validate for optimizer=static) and each
method's point; and for EMO's policy, the timeline of one iteration per GPU with the critical path
and the chosen clocks.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from emo.io import write_json

METHOD_ORDER = ("emo", "static", "zeus", "perseus", "geepafs")
METRICS = ("es_pct", "pl_pct", "time_error_pct", "energy_error_pct", "t_ori_s", "e_ori_j", "t_opt_s", "e_opt_j",
           "explore_time_s", "explore_energy_j")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="table (and plots) of ES/PL per workload x method x budget from MLflow")
    p.add_argument("--uri", help="MLflow tracking URI (default: the tracking config's, sqlite:///results/mlflow.db)")
    p.add_argument("--experiment", help="MLflow experiment (default: the tracking config's, emo)")
    p.add_argument("--plots", metavar="DIR", help="write energy-vs-time and timeline plots (PNG) here")
    p.add_argument("--csv", metavar="FILE", help="also write the long table (one row per run) as CSV")
    p.add_argument("overrides", nargs="*", help="Hydra overrides selecting the tracking config, e.g. results=out")
    p.set_defaults(func=main)


# --------------------------------------------------------------------------- reading
def workload_label(params: dict) -> str:
    """A short name for a workload from its flattened config params (e.g. TP4, PP8 parameter)."""
    kind = params.get("workload.kind", "?")
    if kind == "tp":
        return f"TP{params.get('workload.tp', '?')}"
    if kind == "pp":
        return f"PP{params.get('workload.pp', '?')} {params.get('workload.partition', '')}".strip()
    if kind == "recorded":
        return f"recorded {Path(params.get('workload.path', '?')).name}"
    if kind == "command":
        return f"command {params.get('workload.command', '?')}"
    return kind


def load_runs(uri: str, experiment: str) -> pd.DataFrame:
    """Every MLflow run with validate's metrics: one row each, newest first."""
    from emo.tracking import search

    return runs_table(search(uri, experiment, "metrics.`validate.es_pct` > -1e30"))


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """MLflow's search_runs frame -> workload, method, budget, metrics, the validate folder's hash."""
    if df.empty:
        return pd.DataFrame(columns=["run_id", "workload", "method", "budget", "gpu", "validate_hash", *METRICS])
    rows = []
    for _, r in df.iterrows():
        params = {k[len("params."):]: v for k, v in r.items() if k.startswith("params.") and isinstance(v, str)}
        row = {"run_id": r["run_id"], "workload": workload_label(params),
               "method": params.get("optimizer.name", "emo"), "budget": float(params.get("budget", "nan")),
               "gpu": params.get("gpu.name", "?"), "validate_hash": r.get("tags.emo.validate.hash"),
               "results": params.get("results")}
        for m in METRICS:
            v = r.get(f"metrics.validate.{m}")
            row[m] = float(v) if v is not None and not pd.isna(v) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def latest(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (gpu, workload, method, budget): the newest (runs come newest first)."""
    return runs.drop_duplicates(["gpu", "workload", "method", "budget"], keep="first").reset_index(drop=True)


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows GPU x workload x budget, a column per method, cells `ES% / PL%`."""
    r = latest(runs)
    if r.empty:
        return pd.DataFrame()
    r = r.assign(cell=[f"{es:5.1f} / {pl:4.1f}" for es, pl in zip(r["es_pct"], r["pl_pct"])])
    methods = [m for m in METHOD_ORDER if m in set(r["method"])] + sorted(set(r["method"]) - set(METHOD_ORDER))
    t = r.pivot_table(index=["gpu", "workload", "budget"], columns="method", values="cell", aggfunc="first")
    t = t.reindex(columns=methods).fillna("-")
    t.index = t.index.set_names(["gpu", "workload", "budget"])
    t.columns.name = "ES% / PL%"
    return t


def results_rows(jobs: list[tuple[dict, str]]) -> pd.DataFrame:
    """The runs table from validate's result.json files ((resolved config, validate folder) per job)
    instead of MLflow: what the pipeline's own summary rule reads."""
    from emo.tracking import flatten

    frames = []
    for cfg, vdir in jobs:
        res = json.loads((Path(vdir) / "result.json").read_text())
        row = {"run_id": Path(vdir).name, "tags.emo.validate.hash": Path(vdir).name,
               **{f"params.{k}": v for k, v in flatten(cfg).items()},
               **{f"metrics.validate.{k}": v for k, v in res["metrics"].items()}}
        frames.append(row)
    return runs_table(pd.DataFrame(frames))


# --------------------------------------------------------------------------- stage folders
def stage_dir(results: Path, stage: str, stage_hash: str) -> Path:
    return results / stage / stage_hash


def upstream(results: Path, stage: str, stage_hash: str, want: str) -> Path | None:
    """The folder of stage `want` that the given stage folder was computed from (following the
    `covers.inputs` hashes of each folder's config.json), or None when it is not in the chain."""
    if stage == want:
        return stage_dir(results, stage, stage_hash)
    cfg = stage_dir(results, stage, stage_hash) / "config.json"
    if not cfg.exists():
        return None
    for up, h in json.loads(cfg.read_text())["covers"]["inputs"].items():
        found = upstream(results, up, h, want)
        if found is not None:
            return found
    return None


# --------------------------------------------------------------------------- plots
def plot_energy_time(runs: pd.DataFrame, results: Path, out: Path) -> list[Path]:
    """Per workload: the static clocks' energy-time curve and each method's measured point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    r = latest(runs)
    for (gpu, wl), group in r.groupby(["gpu", "workload"]):
        fig, ax = plt.subplots(figsize=(6.4, 4.8))
        static = group[(group["method"] == "static") & group["validate_hash"].notna()]
        for h in static["validate_hash"]:
            p = stage_dir(results, "validate", h) / "pareto.parquet"
            if p.exists():
                c = pd.read_parquet(p).sort_values("sm_mhz")
                ax.plot(c["time_s"] * 1e3, c["energy_j"], "-o", color="0.6", ms=3, label="static clocks")
                for _, pt in c.iloc[[0, -1]].iterrows():
                    ax.annotate(f"{int(pt['sm_mhz'])} MHz", (pt["time_s"] * 1e3, pt["energy_j"]), fontsize=7, color="0.4")
                break
        base = group.iloc[0]
        ax.plot(base["t_ori_s"] * 1e3, base["e_ori_j"], "k*", ms=12, label="max clock")
        markers = dict(zip(METHOD_ORDER, "osD^v"))
        for (method, budget), g in group.groupby(["method", "budget"]):
            row = g.iloc[0]
            ax.plot(row["t_opt_s"] * 1e3, row["e_opt_j"], markers.get(method, "x"), ms=8,
                    label=f"{method} ({budget:.0%})")
        ax.set_xlabel("iteration time (ms)")
        ax.set_ylabel("energy per iteration (J, all GPUs)")
        ax.set_title(f"{wl} on {gpu}: energy vs time")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        path = out / f"energy_time_{_slug(gpu)}_{_slug(wl)}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_timeline(results: Path, validate_hash: str, out: Path, title: str) -> Path | None:
    """One iteration per GPU: kernels (critical path highlighted) and the policy's clock steps."""
    opt_dir = upstream(results, "validate", validate_hash, "optimize")
    graph_dir = upstream(results, "validate", validate_hash, "graph")
    if opt_dir is None or graph_dir is None or not (opt_dir / "policy.json").exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emo.graph.graph import GPU_NODE_KINDS, Graph
    from emo.graph.whatif import compile_graph, whatif
    from emo.policy import FrequencyPolicy

    graph = Graph.load(graph_dir)
    policy = FrequencyPolicy.load(opt_dir / "policy.json")
    res = whatif(compile_graph(graph))
    nodes = graph.nodes.assign(start=res.start_ns, finish=res.finish_ns)
    crit = np.zeros(len(nodes), bool)
    crit[res.critical_path] = True
    gpu = nodes["kind"].isin(GPU_NODE_KINDS).to_numpy()
    t0 = int(nodes.loc[gpu, "start"].min())
    period_ns = (policy.period_ms or (nodes.loc[gpu, "finish"].max() - t0) / 1e6) * 1e6
    keep = gpu & (nodes["start"].to_numpy() < t0 + period_ns)
    devs = sorted(nodes.loc[keep, "rank"].unique())
    fig, axes = plt.subplots(len(devs), 1, figsize=(10, 1.6 * len(devs) + 0.8), sharex=True, squeeze=False)
    for ax, rank in zip(axes[:, 0], devs):
        sel = keep & (nodes["rank"].to_numpy() == rank)
        sub = nodes[sel]
        streams = {s: i for i, s in enumerate(sorted(sub["stream"].unique()))}
        for is_crit, color in ((False, "tab:blue"), (True, "tab:red")):
            part = sub[crit[sel] == is_crit]
            for s, g in part.groupby("stream"):
                ax.broken_barh(list(zip((g["start"] - t0) / 1e6, (g["finish"] - g["start"]) / 1e6)),
                               (streams[s], 0.8), facecolors=color, edgecolor="white", linewidth=0.2)
        ax.set_yticks([i + 0.4 for i in streams.values()], [f"s{s}" for s in streams])
        ax.set_ylabel(f"GPU {rank}")
        steps = policy.steps.get(int(rank)) or policy.steps.get(0) or []
        if steps:
            tw = ax.twinx()
            xs = [s.t_ms for s in steps] + [period_ns / 1e6]
            ys = [s.sm_mhz for s in steps] + [steps[-1].sm_mhz]
            tw.step(xs, ys, where="post", color="tab:green", lw=1.5)
            tw.set_ylabel("SM MHz", color="tab:green", fontsize=8)
    axes[0, 0].set_title(f"{title}: kernels per stream (critical path red), SM clock (green)")
    axes[-1, 0].set_xlabel("time in iteration (ms, max-clock baseline)")
    path = out / f"timeline_{_slug(title)}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s).strip("_").lower()


# --------------------------------------------------------------------------- the pipeline's summary
def write_summary(jobs: list[tuple[str, dict, str]], out: Path) -> dict[str, list[str]]:
    """A sweep's shareable summary from its jobs' (name, resolved config, validate folder): the table
    (`compare.tsv`), ES/PL and prediction errors per job (`jobs.tsv`), the plots (`plots/`) and which
    plots belong to which job (`plots.json`, validate hash -> file names: MLflow attaches them)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    runs = results_rows([(cfg, vdir) for _, cfg, vdir in jobs])
    runs["job"] = [name for name, _, _ in jobs]
    results = Path(jobs[0][2]).parents[1]
    table(runs).to_csv(out / "compare.tsv", sep="\t")
    cols = ["job", "gpu", "workload", "method", "budget", "es_pct", "pl_pct", "time_error_pct", "energy_error_pct",
            "validate_hash"]
    runs[cols].to_csv(out / "jobs.tsv", sep="\t", index=False, float_format="%.3f")
    index: dict[str, list[str]] = {h: [] for h in runs["validate_hash"]}
    for path in plot_energy_time(runs, results, out / "plots"):
        gpu_wl = path.stem.removeprefix("energy_time_")
        for _, row in runs.iterrows():
            if f"{_slug(row['gpu'])}_{_slug(row['workload'])}" == gpu_wl:
                index[row["validate_hash"]].append(path.name)
    for _, row in runs.iterrows():
        p = plot_timeline(results, row["validate_hash"], out / "plots",
                          f"{row['workload']} on {row['gpu']} {row['method']} {row['budget']:.0%}")
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
    uri, experiment = args.uri, args.experiment
    if uri is None or experiment is None:
        from emo.plan import compose

        tracking = compose(args.overrides)["tracking"]
        from emo.tracking import tracking_uri

        uri, experiment = uri or tracking_uri(tracking), experiment or tracking["experiment"]
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise FileNotFoundError(f"{uri.removeprefix('sqlite:///')}: no MLflow store (run `emo run` first)")
    runs = load_runs(uri, experiment)
    if runs.empty:
        print("emo compare: no validated runs yet", file=sys.stderr)
        return 1
    t = table(runs)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(t.to_string())
    if args.csv:
        latest(runs).drop(columns=["results"]).to_csv(args.csv, index=False)
    if args.plots:
        out = Path(args.plots)
        out.mkdir(parents=True, exist_ok=True)
        results = results_dir(uri, runs)
        written = plot_energy_time(runs, results, out)
        for _, row in latest(runs)[lambda d: (d["method"] == "emo") & d["validate_hash"].notna()].iterrows():
            p = plot_timeline(results, row["validate_hash"], out, f"{row['workload']} on {row['gpu']} emo {row['budget']:.0%}")
            if p:
                written.append(p)
        for p in written:
            print(f"wrote {p}", file=sys.stderr)
    return 0
