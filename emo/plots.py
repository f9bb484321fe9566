"""The plots a reader of a sweep wants: energy vs time per GPU x workload (the static clocks' measured
curve, each method's point, the budgets) and one iteration's timeline per job."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from emo.compare import latest, static_curve
from emo.methods import METHODS as METHOD_ORDER

MARKERS = dict(zip(METHOD_ORDER, "osD^v"))
COLORS = dict(zip(METHOD_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange")))


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
        path = out / f"energy_time_{slug(gpu)}_{slug(wl)}.png"
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
    ms = lambda v: (v - t0) / 1e6
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
    path = out / f"timeline_{slug(title)}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def slug(s: str) -> str:
    import re

    return re.sub(r"_+", "_", "".join(c if c.isalnum() else "_" for c in s)).strip("_").lower()
