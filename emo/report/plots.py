"""The plots a reader of a sweep wants: energy vs time per GPU x workload (the static clocks' measured
curve, each method's point, the budgets) and one iteration's timeline per job."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from emo.methods import METHODS as METHOD_ORDER
from emo.report.runs import latest, static_curve

MARKERS = dict(zip(METHOD_ORDER, "osD^v"))
COLORS = dict(zip(METHOD_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange")))


def seed_points(group: pd.DataFrame) -> pd.DataFrame:
    """Per (method, budget): the seeds' mean and sample standard deviation (0 for one seed) of the
    measured time (ms) and energy, and of ES and PL; how many seeds."""
    g = group.assign(t_ms=group["t_opt_s"] * 1e3)
    agg = g.groupby(["method", "budget"]).agg(
        t_ms=("t_ms", "mean"),
        t_sd=("t_ms", "std"),
        e_j=("e_opt_j", "mean"),
        e_sd=("e_opt_j", "std"),
        es=("es_pct", "mean"),
        es_sd=("es_pct", "std"),
        pl=("pl_pct", "mean"),
        pl_sd=("pl_pct", "std"),
        seeds=("t_ms", "size"),
    )
    return agg.fillna(0.0).reset_index()


def point_label(row) -> str:
    """A method's legend entry: its budget and measured ES / PL, ± the seeds' spread when there are several."""

    def pm(v: float, sd: float) -> str:
        return f"{v:.1f}" + (f"±{sd:.1f}" if row["seeds"] > 1 else "")

    return (
        f"{row['method']}, budget {row['budget']:.0%}: ES {pm(row['es'], row['es_sd'])} %, "
        f"PL {pm(row['pl'], row['pl_sd'])} %" + (f" ({int(row['seeds'])} seeds)" if row["seeds"] > 1 else "")
    )


def _static_and_max(ax, zoom, curve: pd.DataFrame | None, t0: float, e0: float, budgets: list) -> None:
    """On both panels: the static clocks' measured curve (a few of its clocks named on the full one),
    the max clock, and each budget's time limit."""
    for a in (ax, zoom):
        if curve is not None:
            a.plot(
                curve["time_s"] * 1e3,
                curve["energy_j"],
                "-o",
                color="0.6",
                ms=3,
                lw=1,
                label="static clocks (measured, one seed)",
                zorder=1,
            )
        a.plot(t0, e0, "k*", ms=12, label="max clock (mean over the runs)", zorder=3)
        for b in budgets:
            a.axvline(t0 * (1 + b), color="0.3", ls="--", lw=0.8, zorder=0)
        a.grid(alpha=0.3)
    if curve is not None:
        for _, pt in curve.iloc[[0, len(curve) // 2, -1]].iterrows():
            ax.annotate(
                f"{int(pt['sm_mhz'])} MHz",
                (pt["time_s"] * 1e3, pt["energy_j"]),
                fontsize=7,
                color="0.4",
                xytext=(4, 4),
                textcoords="offset points",
            )


def _method_points(ax, zoom, group: pd.DataFrame) -> pd.DataFrame:
    """Each method's point on both panels (the mean over the seeds, their spread as error bars; the
    lowest budget filled), in the table's order of methods, labelled on the zoom; the points."""
    pts = seed_points(group)
    order = {m: i for i, m in enumerate(METHOD_ORDER)}  # the legend in the table's order of methods
    pts = pts.sort_values(
        ["method", "budget"], key=lambda c: c.map(order).fillna(len(order)) if c.name == "method" else c
    )
    low = group["budget"].min()
    for _, row in pts.iterrows():
        color = COLORS.get(row["method"], "k")
        for a in (ax, zoom):
            a.errorbar(
                row["t_ms"],
                row["e_j"],
                xerr=row["t_sd"],
                yerr=row["e_sd"],
                fmt=MARKERS.get(row["method"], "x"),
                color=color,
                ms=8,
                capsize=3,
                zorder=4,
                mfc="white" if row["budget"] != low else color,
                label=point_label(row) if a is zoom else None,
            )
    return pts


def plot_energy_time(runs: pd.DataFrame, results: Path, out: Path) -> list[Path]:
    """Per GPU x workload: the static clocks' measured curve, the max clock, each method's measured
    point (the mean over the seeds, with their standard deviation as error bars in time and energy),
    the budgets as time limits, and a zoom on the region where the methods sit. What each point
    measured (ES / PL, ± the spread) is in the legend, not written beside the point, where labels
    overlap when methods land close together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    r = latest(runs)
    for (gpu, wl), group in r.groupby(["gpu", "workload"]):
        fig, (ax, zoom) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 1.2]})
        curve = static_curve(results, list(group["validate_hash"].dropna()))
        t0, e0 = group["t_ori_s"].mean() * 1e3, group["e_ori_j"].mean()
        _static_and_max(ax, zoom, curve, t0, e0, sorted(group["budget"].unique()))
        pts = _method_points(ax, zoom, group)
        # the zoom: the methods with their spread and the budgets, with a margin
        xs = [t0, *(pts["t_ms"] - pts["t_sd"]), *(pts["t_ms"] + pts["t_sd"]), *(t0 * (1 + group["budget"]))]
        ys = [e0, *(pts["e_j"] - pts["e_sd"]), *(pts["e_j"] + pts["e_sd"])]
        dx, dy = (max(xs) - min(xs)) or t0 * 0.01, (max(ys) - min(ys)) or e0 * 0.01
        zoom.set_xlim(min(xs) - 0.15 * dx, max(xs) + 0.15 * dx)
        zoom.set_ylim(min(ys) - 0.2 * dy, max(ys) + 0.15 * dy)
        for b in sorted(group["budget"].unique()):
            zoom.text(t0 * (1 + b), zoom.get_ylim()[1], f" {b:.0%} budget", fontsize=7, va="top", color="0.3")
        ax.set_title(
            "all static clocks" if curve is not None else "static clocks not measured (add optimizer=static)",
            fontsize=9,
        )
        zoom.set_title("zoom: the methods, ± the seeds' spread (dashed: the budgets' time limits)", fontsize=9)
        for a in (ax, zoom):
            a.set_xlabel("iteration time (ms)")
        ax.set_ylabel("energy per iteration (J, all GPUs)")
        handles, labels = zoom.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", fontsize=8, frameon=False, ncol=2)
        fig.suptitle(f"{wl} on {gpu.upper()}: energy vs time per iteration, measured by validate")
        rows = (len(labels) + 1) // 2
        fig.tight_layout(rect=(0, min(0.055 * rows + 0.02, 0.5), 1, 1))
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


def stage_chain(graph_dir: Path, opt_dir: Path | None) -> tuple[Path, Path, str] | None:
    """(pack folder, fit folder, the optimizer's name: "" without an optimize folder) a timeline is predicted on: the ones the method's
    optimize folder was computed from; for an online method (no optimize folder), the pack and fit
    folders computed from the same graph (the same GPU and workload), as an offline method used them."""

    def covers(d: Path) -> dict:
        f = d / "config.json"
        return json.loads(f.read_text())["covers"] if f.exists() else {}

    results = graph_dir.parents[1]
    if opt_dir is not None and covers(opt_dir):
        c = covers(opt_dir)
        return (
            results / "pack" / c["inputs"]["pack"],
            results / "fit" / c["inputs"]["fit"],
            str(c["config"]["optimizer"]["name"]),
        )
    packs = [
        d.parent.name
        for d in sorted(results.glob("pack/*/config.json"))
        if covers(d.parent).get("inputs", {}).get("graph") == graph_dir.name
    ]
    fits = [
        d.parent
        for d in sorted(results.glob("fit/*/config.json"))
        if covers(d.parent).get("inputs", {}).get("pack") in packs
    ]
    if not fits:
        return None
    return results / "pack" / covers(fits[0])["inputs"]["pack"], fits[0], ""


def planned_latency_ms(opt_dir: Path | None, method: str) -> float | None:
    """The mean clock-request latency method `method`'s plan assumed (optimize's summary.json: the
    calibration's measurement or the override); None for an online method (it holds one clock). A
    timeline is one scenario, every request landing that late; the plan's own prediction is an
    expectation over the whole measured distribution (emo.optimize.pipeline.check.expected)."""
    f = opt_dir / "summary.json" if opt_dir is not None else None
    if f is None or not f.exists():
        return None
    lats = json.loads(f.read_text()).get(method, {}).get("transition_ms")
    return float(lats[1]) if lats else None


def method_policy(res_json: dict, opt_dir: Path | None):
    """The clocks a method ran: its policy (offline), a fixed clock per GPU for an online method that
    settled on clocks (geepafs), None for one that settled on something else (zeus: a power limit)."""
    from emo.policy import FrequencyPolicy, Step

    if opt_dir is not None and (opt_dir / "policy.json").exists():
        return FrequencyPolicy.load(opt_dir / "policy.json")
    clocks = res_json.get("setting", {}).get("clocks")
    if clocks:
        return FrequencyPolicy(
            gpu=res_json.get("gpu", "?"), steps={int(d): [Step(0.0, int(mhz))] for d, mhz in clocks.items()}
        )
    return None


@dataclass
class Timeline:
    """One iteration as EMO's predictor times it under a method's clocks (ns on the predictor's clock)."""

    work: pd.DataFrame  # GPU work: rank, stream, start, dur, kind, name, sm_mhz (the clock it starts at)
    host: pd.DataFrame  # host activity: rank, start, dur
    clocks: dict[int, tuple[np.ndarray, np.ndarray]]  # rank -> (times, SM MHz from then on) within [t0, t1]
    t0: float
    t1: float
    iteration: int  # which traced iteration [t0, t1) is
    time_s: float  # predicted time per iteration
    transition_ms: float | None  # the clock-request latency it was timed with (None: no clock changes)
    clock_range: tuple[float, float] = (0.0, 0.0)  # the GPU model's calibrated clocks, lowest and highest

    def single_clock(self) -> bool:
        """Whether every GPU runs one and the same clock all iteration (a figure with nothing to show)."""
        return len({float(c) for _, cs in self.clocks.values() for c in cs}) <= 1


def predicted_timeline(pack_dir: Path, fit_dir: Path, graph_dir: Path, policy, transition_ms: float | None) -> Timeline:
    """The middle traced iteration under `policy` (None: the max clock): every pack-graph node at its
    predicted start and finish, a pack's member kernels at their recorded places within it scaled with
    the pack, and each GPU's clock as its requests land `transition_ms` after they are issued."""
    from emo.graph.graph import GPU_NODE_KINDS, Graph
    from emo.model.predict import (
        clock_timelines,
        iteration_marks,
        load_pack_tables,
        predict,
    )

    tables = load_pack_tables(pack_dir, fit_dir)
    pnodes = tables.graph.nodes
    changes = policy is not None and any(len({s.sm_mhz for s in ss}) > 1 for ss in policy.steps.values())
    transition_ms = transition_ms if changes else None
    pred = predict(tables, policy, transition_ms=transition_ms)
    marks = iteration_marks(tables, pred.start_ns)  # start_ns: by node id
    ptr, ts, cis = clock_timelines(tables, policy, marks, transition_ms or 0.0, end_ns=float(pred.finish_ns.max()))
    k = marks.shape[1] // 2 if marks.shape[1] else 0  # steady state: the middle iteration
    t0 = float(marks[:, k].min()) if marks.shape[1] else float(pred.start_ns.min())
    t1 = float(marks[:, k + 1].min()) if marks.shape[1] > k + 1 else t0 + pred.time_s * 1e9
    start, finish = pred.start_ns, pred.finish_ns

    kernels = Graph.load(graph_dir).nodes
    packs = pd.read_parquet(pack_dir / "packs.parquet")
    rows = []
    k_start, k_dur = kernels["start_ns"].to_numpy(np.float64), kernels["dur_ns"].to_numpy(np.float64)
    rec_start, rec_dur = pnodes["start_ns"].to_numpy(np.float64), pnodes["dur_ns"].to_numpy(np.float64)
    for p in packs.itertuples(index=False):
        ps, pf = start[p.node], finish[p.node]
        if pf < t0 or ps > t1:
            continue
        scale = (pf - ps) / max(rec_dur[p.node], 1.0)
        m = np.asarray(p.members, np.int64)
        a = ps + (k_start[m] - rec_start[p.node]) * scale  # recorded offset within the pack, scaled
        rows += [(p.rank, p.device, p.stream, x, d, "kernel", "") for x, d in zip(a, k_dur[m] * scale)]
    window = (finish > t0) & (start < t1)
    other = pnodes[pnodes["kind"].isin(GPU_NODE_KINDS).to_numpy() & ~tables.is_pack & window]
    rows += [
        (r.rank, r.device, r.stream, start[i], finish[i] - start[i], r.kind, r.name)
        for i, r in zip(other.index, other.itertuples())
    ]
    work = pd.DataFrame(rows, columns=["rank", "device", "stream", "start", "dur", "kind", "name"])

    def clock_at(dense: int, t: np.ndarray) -> np.ndarray:
        tt, cc = ts[ptr[dense] : ptr[dense + 1]], cis[ptr[dense] : ptr[dense + 1]]
        return tables.clocks_mhz[cc[np.searchsorted(tt, t, side="right") - 1]]

    dense_of = {key: i for i, key in enumerate(tables.device_keys)}
    work["sm_mhz"] = 0
    for key, g in work.groupby(["rank", "device"]):
        rank, device = key
        work.loc[g.index, "sm_mhz"] = clock_at(dense_of[int(rank), int(device)], g["start"].to_numpy())
    clocks = {}
    for n, (rank, _) in enumerate(tables.device_keys):
        tt = ts[ptr[n] : ptr[n + 1]]
        xs = np.r_[t0, tt[(tt > t0) & (tt < t1)], t1]
        clocks[int(rank)] = (xs, clock_at(n, xs))
    is_host = pnodes["kind"].isin(("cpu", "runtime")).to_numpy() & window
    host = pd.DataFrame(
        {
            "rank": pnodes.loc[is_host, "rank"].to_numpy(),
            "start": start[is_host],
            "dur": finish[is_host] - start[is_host],
        }
    )
    return Timeline(
        work,
        host,
        clocks,
        t0,
        t1,
        k,
        pred.time_s,
        transition_ms,
        (float(tables.clocks_mhz.min()), float(tables.clocks_mhz.max())),
    )


def _gpu_lanes(
    ax, rank: int, streams: dict, h: pd.DataFrame, mine: pd.DataFrame, ms, cmap, lo: float, hi: float
) -> None:
    """One GPU's lanes: its host thread's activity, then its kernels per named stream coloured by the
    SM clock they start at."""
    ylabels = ["host"] + [f"{name} (s{s})" for s, name in streams.items()]
    ax.broken_barh(list(zip(ms(h["start"]), h["dur"] / 1e6)), (0, 0.8), facecolors="0.65")
    for i, s in enumerate(streams, start=1):
        g = mine[mine["stream"] == s]
        colors = cmap((g["sm_mhz"].to_numpy(float) - lo) / max(hi - lo, 1))
        ax.broken_barh(list(zip(ms(g["start"]), g["dur"] / 1e6)), (i, 0.8), facecolors=colors, edgecolor="none")
    ax.set_yticks([i + 0.4 for i in range(len(ylabels))], ylabels, fontsize=8)
    ax.set_ylabel(f"GPU {rank}", fontsize=9)
    ax.invert_yaxis()


def _clock_lane(clock, tl, ms, res_json: dict, policy, opt_dir: Path | None) -> None:
    """Every GPU's SM clock as the requests land, and what the times are of (the method's policy,
    the clocks an online method settled at, or the max clock for a power limit)."""
    lo, hi = tl.clock_range
    method = res_json.get("method", "?")
    for n, (rank, (xs, ys)) in enumerate(sorted(tl.clocks.items())):
        clock.step(
            ms(xs), ys, where="post", lw=2.2 - 0.5 * (n % 3), ls=("-", "--", ":", "-.")[n % 4], label=f"GPU {rank}"
        )  # GPUs often share a schedule: styles keep each visible
    clock.set_ylim(lo - 0.08 * (hi - lo), hi + 0.08 * (hi - lo))
    clock.set_ylabel("SM clock (MHz)", fontsize=8)
    clock.legend(fontsize=7, loc="lower left", ncol=len(tl.clocks))
    setting = res_json.get("setting", {})
    if policy is None:
        what = f"a power limit of {setting['power_limit_w']:.0f} W" if "power_limit_w" in setting else "no clock"
        note = f"{method} settled at {what}, not a clock: drawn at the max clock (the predictor models clocks, not power caps)"
        under = "at the max clock"
    elif opt_dir is None or not (opt_dir / "policy.json").exists():
        note, under = f"{method} (online): the clocks it settled at", "at the clocks it settled at"
    else:
        note, under = "", "under its policy"
    if note:
        clock.set_title(note, fontsize=8, loc="right")
    clock.set_xlabel(
        f"time in iteration {tl.iteration} (ms), as EMO's predictor times the method {under}: "
        f"{tl.time_s * 1e3:.2f} ms per iteration"
        + (f", clock requests landing {tl.transition_ms:g} ms after they are issued" if tl.transition_ms else ""),
        fontsize=8,
    )


def plot_timeline(
    graph_dir: Path | None, opt_dir: Path | None, validate_dir: Path, out: Path, title: str
) -> Path | None:
    """One iteration as the method runs it: per GPU its host thread's activity and its kernels per
    named stream, at the times EMO's predictor gives them under the method's clocks (the policy of an
    offline method, the clocks an online method settled at), each kernel coloured by the SM clock it
    starts at; below, on the same time axis, every GPU's SM clock as the requests land. A method that
    settled on no clock (zeus: a power limit) is drawn at the max clock and says so. None (no figure)
    where every GPU runs one clock all iteration: a static clock's figure shows nothing a table does not.
    The colour scale is the GPU model's calibrated clock range, the same in every figure of that GPU."""
    result = validate_dir / "result.json"
    if graph_dir is None or not (graph_dir / "nodes.parquet").exists() or not result.exists():
        return None
    chain = stage_chain(graph_dir, opt_dir)
    if chain is None or not all((d / "config.json").exists() for d in chain[:2]):
        return None
    pack_dir, fit_dir, method = chain
    res_json = json.loads(result.read_text())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    policy = method_policy(res_json, opt_dir)
    tl = predicted_timeline(pack_dir, fit_dir, graph_dir, policy, planned_latency_ms(opt_dir, method))
    if tl.single_clock():
        return None
    drawn, host, t0 = tl.work, tl.host, tl.t0
    ranks = sorted(drawn["rank"].unique())
    names_per = {r: stream_names(drawn[drawn["rank"] == r]) for r in ranks}
    heights = [len(names_per[r]) + 1 for r in ranks] + [2]
    fig, axes = plt.subplots(
        len(ranks) + 1, 1, figsize=(11, 0.55 * sum(heights) + 1.8), sharex=True, gridspec_kw={"height_ratios": heights}
    )
    ms = lambda v: (np.asarray(v, float) - t0) / 1e6
    # one colour scale and one clock axis for every GPU and every figure of this GPU model: its calibrated
    # clock range (a scale fitted to each figure's own clocks gave the same colour to different clocks)
    lo, hi = tl.clock_range
    cmap = plt.get_cmap("viridis")
    for ax, rank in zip(axes[:-1], ranks):
        _gpu_lanes(
            ax, rank, names_per[rank], host[host["rank"] == rank], drawn[drawn["rank"] == rank], ms, cmap, lo, hi
        )
    _clock_lane(axes[-1], tl, ms, res_json, policy, opt_dir)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(lo, hi))
    fig.colorbar(sm, ax=list(axes[:-1]), fraction=0.025, pad=0.01).set_label("kernel's SM clock (MHz)", fontsize=8)
    fig.legend(
        handles=[
            Patch(color="0.65", label="host (CPU, CUDA runtime)"),
            Patch(color=cmap(0.6), label="GPU work (kernels, NCCL, copies), coloured by its SM clock"),
        ],
        loc="upper right",
        fontsize=8,
        ncol=2,
        frameon=False,
    )
    fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    path = out / f"timeline_{slug(title)}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def slug(s: str) -> str:
    import re

    return re.sub(r"_+", "_", "".join(c if c.isalnum() else "_" for c in s)).strip("_").lower()
