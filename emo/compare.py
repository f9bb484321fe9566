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
from emo.methods import METHODS as METHOD_ORDER

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
        return pd.DataFrame(columns=["run_id", "workload", "method", "budget", "gpu", "validate_hash", "graph_hash",
                                     "optimize_hash", *METRICS])
    rows = []
    for _, r in df.iterrows():
        params = {k[len("params."):]: v for k, v in r.items() if k.startswith("params.") and isinstance(v, str)}
        row = {"run_id": r["run_id"], "workload": workload_label(params),
               "method": params.get("optimizer.name", "emo"), "budget": float(params.get("budget", "nan")),
               "gpu": params.get("gpu.name", "?"), "validate_hash": r.get("tags.emo.validate.hash"),
               "graph_hash": r.get("tags.emo.graph.hash"), "optimize_hash": r.get("tags.emo.optimize.hash"),
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
MARKERS = dict(zip(METHOD_ORDER, "osD^v"))
COLORS = dict(zip(METHOD_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange")))


def static_curve(results: Path, validate_hashes: list[str]) -> pd.DataFrame | None:
    """The static clocks' measured curve for these jobs' GPU x workload: validate measures it for
    optimizer=static; when the sweep had none, any static validate folder of the same trace (and so
    the same GPU and workload) in the results folder serves."""
    traces = {upstream(results, "validate", h, "trace") for h in validate_hashes if h} - {None}
    candidates = [stage_dir(results, "validate", h) for h in validate_hashes if h]
    candidates += sorted(p.parent for p in results.glob("validate/*/pareto.parquet"))
    for vdir in candidates:
        if (vdir / "pareto.parquet").exists() and upstream(results, "validate", vdir.name, "trace") in traces:
            return pd.read_parquet(vdir / "pareto.parquet").sort_values("sm_mhz")
    return None


def plot_energy_time(runs: pd.DataFrame, results: Path, out: Path) -> list[Path]:
    """Per GPU x workload: the static clocks' measured energy-time curve, the max clock, each
    method's measured point labelled with its ES/PL, the budgets as time limits, and a zoom on the
    region where the methods sit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    r = latest(runs)
    for (gpu, wl), group in r.groupby(["gpu", "workload"]):
        fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 1.2]})
        curve = static_curve(results, list(group["validate_hash"].dropna()))
        base = group.iloc[0]
        t0, e0 = base["t_ori_s"] * 1e3, base["e_ori_j"]
        for a in (ax, zoom):
            if curve is not None:
                a.plot(curve["time_s"] * 1e3, curve["energy_j"], "-o", color="0.6", ms=3, lw=1,
                       label="static clocks (measured)", zorder=1)
            a.plot(t0, e0, "k*", ms=12, label="max clock", zorder=3)
            for b in sorted(group["budget"].unique()):
                a.axvline(t0 * (1 + b), color="0.3", ls="--", lw=0.8, zorder=0)
            a.grid(alpha=0.3)
        if curve is not None:
            for _, pt in curve.iloc[[0, len(curve) // 2, -1]].iterrows():
                ax.annotate(f"{int(pt['sm_mhz'])} MHz", (pt["time_s"] * 1e3, pt["energy_j"]), fontsize=7,
                            color="0.4", xytext=(4, 4), textcoords="offset points")
        for (method, budget), g in group.groupby(["method", "budget"]):
            row = g.iloc[0]
            x, y = row["t_opt_s"] * 1e3, row["e_opt_j"]
            for a in (ax, zoom):
                a.plot(x, y, MARKERS.get(method, "x"), color=COLORS.get(method, "k"), ms=8, zorder=4,
                       mfc="white" if budget != group["budget"].min() else COLORS.get(method, "k"),
                       label=f"{method}, budget {budget:.0%}")
            zoom.annotate(f"ES {row['es_pct']:.1f} %\nPL {row['pl_pct']:.1f} %", (x, y), fontsize=7,
                          xytext=(5, -12), textcoords="offset points", color=COLORS.get(method, "k"))
        # the zoom: the methods and the budgets, with a margin
        xs = [t0, *(group["t_opt_s"] * 1e3), *(t0 * (1 + group["budget"]))]
        ys = [e0, *group["e_opt_j"]]
        dx, dy = (max(xs) - min(xs)) or t0 * 0.01, (max(ys) - min(ys)) or e0 * 0.01
        zoom.set_xlim(min(xs) - 0.15 * dx, max(xs) + 0.15 * dx)
        zoom.set_ylim(min(ys) - 0.2 * dy, max(ys) + 0.15 * dy)
        for b in sorted(group["budget"].unique()):
            zoom.text(t0 * (1 + b), zoom.get_ylim()[1], f" {b:.0%} budget", fontsize=7, va="top", color="0.3")
        ax.set_title("all static clocks" if curve is not None else "static clocks not measured (add optimizer=static)",
                     fontsize=9)
        zoom.set_title("zoom: the methods (dashed: the budgets' time limits)", fontsize=9)
        for a in (ax, zoom):
            a.set_xlabel("iteration time (ms)")
        ax.set_ylabel("energy per iteration (J, all GPUs)")
        handles, labels = zoom.get_legend_handles_labels()
        fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
        fig.suptitle(f"{wl} on {gpu.upper()}: energy vs time per iteration, measured by validate")
        fig.tight_layout(rect=(0, 0, 0.83, 1))
        path = out / f"energy_time_{_slug(gpu)}_{_slug(wl)}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def stream_names(nodes: pd.DataFrame) -> dict[int, str]:
    """A name per CUDA stream by what it carries: NCCL collectives, P2P copies, copies, compute."""
    names = {}
    for s, g in nodes.groupby("stream"):
        kinds = set(g["kind"])
        if kinds & {"collective", "coll_wait"}:
            names[s] = "NCCL"
        elif kinds <= {"memcpy", "memset"}:
            names[s] = "P2P" if g["name"].str.contains("PtoP|P2P|Peer", regex=True).any() else "copies"
        else:
            names[s] = "compute"
    return names


def plot_timeline(graph_dir: Path | None, opt_dir: Path | None, validate_dir: Path, out: Path, title: str) -> Path | None:
    """One iteration: per GPU its host thread's activity and its kernels per named stream (the critical
    path highlighted), and below, on the same time axis, every GPU's SM clock under the method (an
    online method's setting instead: it has no schedule)."""
    result = validate_dir / "result.json"
    if graph_dir is None or not (graph_dir / "nodes.parquet").exists() or not result.exists():
        return None
    res_json = json.loads(result.read_text())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from emo.graph.graph import GPU_NODE_KINDS, Graph
    from emo.graph.whatif import compile_graph, whatif
    from emo.policy import FrequencyPolicy

    policy = FrequencyPolicy.load(opt_dir / "policy.json") if opt_dir and (opt_dir / "policy.json").exists() else None
    graph = Graph.load(graph_dir)
    res = whatif(compile_graph(graph))
    nodes = graph.nodes.assign(start=res.start_ns, finish=res.finish_ns)
    crit = np.zeros(len(nodes), bool)
    crit[res.critical_path] = True
    gpu = nodes["kind"].isin(GPU_NODE_KINDS).to_numpy()
    host = nodes["kind"].isin(("cpu", "runtime")).to_numpy()
    t0 = int(nodes.loc[gpu, "start"].min())
    # one iteration: the policy's period, else the measured max-clock iteration time
    period_ns = ((policy.period_ms if policy else None) or res_json.get("metrics", {}).get("t_ori_s", 0) * 1e3
                 or (nodes.loc[gpu, "finish"].max() - t0) / 1e6) * 1e6
    window = (nodes["finish"].to_numpy() > t0) & (nodes["start"].to_numpy() < t0 + period_ns)
    devs = sorted(nodes.loc[gpu & window, "rank"].unique())
    rows_per = {rank: stream_names(nodes[gpu & window & (nodes["rank"].to_numpy() == rank)]) for rank in devs}
    heights = [len(rows_per[r]) + 1 for r in devs] + [2]
    fig, axes = plt.subplots(len(devs) + 1, 1, figsize=(11, 0.55 * sum(heights) + 1.6), sharex=True,
                             gridspec_kw={"height_ratios": heights})
    ms = lambda v: (v - t0) / 1e6  # noqa: E731
    for ax, rank in zip(axes[:-1], devs):
        mine = window & (nodes["rank"].to_numpy() == rank)
        streams = rows_per[rank]
        ylabels = ["host"] + [f"{name} (s{s})" for s, name in streams.items()]
        h = nodes[mine & host]
        ax.broken_barh(list(zip(ms(h["start"]), (h["finish"] - h["start"]) / 1e6)), (0, 0.8), facecolors="0.65")
        for i, s in enumerate(streams, start=1):
            sel = mine & gpu & (nodes["stream"].to_numpy() == s)
            for is_crit, color in ((False, "tab:blue"), (True, "tab:red")):
                g = nodes[sel & (crit == is_crit)]
                ax.broken_barh(list(zip(ms(g["start"]), (g["finish"] - g["start"]) / 1e6)), (i, 0.8),
                               facecolors=color, edgecolor="none")
        ax.set_yticks([i + 0.4 for i in range(len(ylabels))], ylabels, fontsize=8)
        ax.set_ylabel(f"GPU {rank}", fontsize=9)
        ax.invert_yaxis()
    clock = axes[-1]
    method = res_json.get("method", "?")
    if policy is not None:
        for k, rank in enumerate(devs):
            steps = policy.steps.get(int(rank)) or policy.steps.get(0) or []
            if steps:
                xs = [st.t_ms for st in steps] + [period_ns / 1e6]
                ys = [st.sm_mhz for st in steps] + [steps[-1].sm_mhz]
                clock.step(xs, ys, where="post", lw=2.2 - 0.5 * (k % 3), ls=("-", "--", ":", "-.")[k % 4],
                           label=f"GPU {rank}")  # GPUs often share a schedule: styles keep each visible
        clock.set_ylabel("SM clock (MHz)", fontsize=8)
        clock.legend(fontsize=7, loc="lower left", ncol=len(devs))
    else:  # online methods settle at a setting instead of a schedule
        setting = res_json.get("setting", {})
        what = (f"power limit {setting['power_limit_w']:.0f} W" if "power_limit_w" in setting
                else ", ".join(f"{k} {v}" for k, v in setting.items() if isinstance(v, (int, float))))
        clock.text(0.01, 0.5, f"{method} (online): no clock schedule; it settled at {what or 'its own setting'}",
                   transform=clock.transAxes, va="center", fontsize=8)
        clock.set_yticks([])
    clock.set_xlabel("time in the iteration (ms; kernels at their max-clock replay times)")
    fig.legend(handles=[Patch(color="0.65", label="host (CPU, CUDA runtime)"), Patch(color="tab:blue", label="kernel"),
                        Patch(color="tab:red", label="kernel on the critical path")],
               loc="upper right", fontsize=8, ncol=3, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path = out / f"timeline_{_slug(title)}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _slug(s: str) -> str:
    import re

    return re.sub(r"_+", "_", "".join(c if c.isalnum() else "_" for c in s)).strip("_").lower()


# --------------------------------------------------------------------------- the pipeline's summary
def write_summary(jobs: list[tuple[str, dict, str]], out: Path) -> dict[str, list[str]]:
    """A sweep's shareable summary from its jobs' (name, resolved config, validate folder): the table
    (`compare.tsv`), ES/PL and prediction errors per job (`jobs.tsv`), the plots (`plots/`) and which
    plots belong to which job (`plots.json`, validate hash -> file names: MLflow attaches them)."""
    from emo.plan import plan

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
    for (name, cfg, vdir), (_, row) in zip(jobs, runs.iterrows()):
        plans = plan(cfg)
        p = plot_timeline(plans["graph"].dir, plans["optimize"].dir, Path(vdir), out / "plots",
                          f"{row['workload']} on {row['gpu']}: {row['method']}, budget {row['budget']:.0%}")
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
        for _, row in latest(runs)[lambda d: d["validate_hash"].notna()].iterrows():
            hashes = {st: row.get(f"{st}_hash") for st in ("graph", "optimize")}
            dirs = {st: stage_dir(results, st, h) if isinstance(h, str) else upstream(results, "validate", row["validate_hash"], st)
                    for st, h in hashes.items()}
            p = plot_timeline(dirs["graph"], dirs["optimize"], stage_dir(results, "validate", row["validate_hash"]), out,
                              f"{row['workload']} on {row['gpu']}: {row['method']}, budget {row['budget']:.0%}")
            if p:
                written.append(p)
        for p in written:
            print(f"wrote {p}", file=sys.stderr)
    return 0
