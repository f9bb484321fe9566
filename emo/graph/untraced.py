"""The trace is not the run: a profiler pays host time for every record it takes (a CPU op, an
annotation, a runtime call), so a traced loop's host intervals are longer than the job's, and a
GPU-bound job can trace as a host-bound one. The graph keeps the trace's structure and takes its
timing from the run measured without the profiler:

- `record_counts`: how many records fall in each CPU interval (each record is charged to the
  interval it starts in, a call's own record to the interval before it);
- `corrected`: each CPU interval shortened by δ per record (never below 0);
- `fit_overhead`: the least δ at which the what-if replay's iteration period comes within the
  measurements' noise of the untraced run's (bisection: the period only falls as δ grows), 0 where
  the trace already is (a GPU-bound run hides its host: nothing there to correct, and fitting noise
  would empty its CPU intervals), or the bound where it cannot;
- `untrace`: the corrected graph, its timeline re-laid by the replay (so that every later stage
  compiles it as recorded), the iteration anchors moved with it, and what was done.

Only host intervals move: the GPU's work is what the trace measured. Pure functions over the graph
and the event table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from emo.graph.graph import Graph
from emo.graph.whatif import Compiled, compile_graph, whatif

RECORD_KINDS = ("cpu_op", "annotation", "runtime")
BISECTIONS = 40  # halvings of the δ range: far below a nanosecond per record


def record_counts(events: pd.DataFrame, nodes: pd.DataFrame) -> np.ndarray:
    """int64[N]: per graph node, the host records of `events` charged to it (CPU intervals only)."""
    out = np.zeros(len(nodes), np.int64)
    cpu = nodes.index.to_numpy()[(nodes["kind"] == "cpu").to_numpy()]
    if not len(cpu) or events.empty:
        return out
    ev = events[events["kind"].isin(RECORD_KINDS) & (events["device"] < 0)]
    ev = ev[~ev["name"].astype(str).str.startswith("ProfilerStep#")]  # the iteration marks themselves
    n_rank, n_thread = (nodes.loc[cpu, c].to_numpy(np.int64) for c in ("rank", "thread"))
    n_start = nodes.loc[cpu, "start_ns"].to_numpy(np.int64)
    e_rank, e_thread = (ev[c].to_numpy(np.int64) for c in ("rank", "thread"))
    e_start = ev["start_ns"].to_numpy(np.int64)
    for r, th in set(zip(n_rank.tolist(), n_thread.tolist())):
        mine = np.flatnonzero((n_rank == r) & (n_thread == th))
        mine = mine[np.argsort(n_start[mine], kind="stable")]
        t = e_start[(e_rank == r) & (e_thread == th)]
        # the last CPU interval starting strictly before the record: a call starts where the
        # interval before it ends, a CPU op inside an interval after the interval's start
        pos = np.searchsorted(n_start[mine], t, side="left") - 1
        np.add.at(out, cpu[mine[pos[pos >= 0]]], 1)
    return out


def corrected(nodes: pd.DataFrame, counts: np.ndarray, delta_ns: float) -> np.ndarray:
    """int64[N]: the node durations with δ per record taken off the CPU intervals."""
    dur = nodes["dur_ns"].to_numpy(np.int64)
    return np.where(counts > 0, np.maximum(dur - np.round(delta_ns * counts), 0), dur).astype(np.int64)


def period_ns(start_ns: np.ndarray, anchors: pd.DataFrame) -> float | None:
    """The mean iteration period over ranks on a replayed timeline (None: < 2 marks on every rank)."""
    periods = []
    for _, a in anchors.groupby("rank"):
        a = a.sort_values("iteration")
        marks = start_ns[a["node"].to_numpy(np.int64)] + a["offset_ns"].to_numpy(np.float64)
        if len(marks) > 1:
            periods.append((marks[-1] - marks[0]) / (len(marks) - 1))
    return float(np.mean(periods)) if periods else None


def moved_anchors(anchors: pd.DataFrame, old_dur: np.ndarray, new_dur: np.ndarray) -> pd.DataFrame:
    """Anchors whose node shrank keep their relative place in it."""
    out = anchors.copy()
    n = out["node"].to_numpy(np.int64)
    old = old_dur[n].astype(np.float64)
    scale = np.where(old > 0, new_dur[n] / np.maximum(old, 1.0), 1.0)
    out["offset_ns"] = np.round(out["offset_ns"].to_numpy(np.float64) * scale).astype(np.int64)
    return out


def fit_overhead(
    graph: Graph, c: Compiled, counts: np.ndarray, anchors: pd.DataFrame, target_ns: float, tol_ns: float
) -> tuple[float, float]:
    """(δ in ns per record, the replayed period at δ): the least δ whose replay of `graph` (compiled
    as `c`) comes within `tol_ns` of `target_ns` (0 when the trace already does; the largest useful
    δ when even that stays slower)."""
    dur = graph.nodes["dur_ns"].to_numpy(np.int64)

    def period(delta: float) -> float:
        new = corrected(graph.nodes, counts, delta)
        res = whatif(c, new, slack=False)
        p = period_ns(res.start_ns, moved_anchors(anchors, dur, new))
        assert p is not None  # untrace checks the anchors first
        return p

    goal = target_ns + tol_ns
    p0 = period(0.0)
    if p0 <= goal or not counts.any():
        return 0.0, p0
    hi = float(np.max(dur[counts > 0] / counts[counts > 0]))  # every CPU interval emptied
    p_hi = period(hi)
    if p_hi > goal:
        return hi, p_hi
    lo = 0.0
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        if period(mid) > goal:
            lo = mid
        else:
            hi = mid
    return hi, period(hi)


def noise_ns(*samples: list[float]) -> float:
    """Two standard errors of the difference of the samples' means (s, each a list of iteration
    times; one with a single value adds nothing)."""
    var = [float(np.var(x, ddof=1)) / len(x) for x in samples if len(x) > 1]
    return 2.0 * float(np.sqrt(sum(var))) * 1e9


def untrace(
    graph: Graph, events: pd.DataFrame, anchors: pd.DataFrame, untraced_s: list[float], traced_s: list[float]
) -> tuple[Graph, pd.DataFrame, dict]:
    """The graph and anchors of the run as it is untraced, and what was done (summary.json's
    `untraced` block). `untraced_s` / `traced_s`: the iteration times measured without and with
    the profiler (their spread is the noise the fit stops at)."""
    target = float(np.mean(untraced_s)) * 1e9
    tol = noise_ns(untraced_s, traced_s)
    c = compile_graph(graph)
    p_traced = period_ns(whatif(c, slack=False).start_ns, anchors)
    if p_traced is None:
        return graph, anchors, {"corrected": False, "why": "fewer than 2 traced iterations on every rank"}
    counts = record_counts(events, graph.nodes)
    delta, p_fit = fit_overhead(graph, c, counts, anchors, target, tol)
    dur = graph.nodes["dur_ns"].to_numpy(np.int64)
    new = corrected(graph.nodes, counts, delta)
    info: dict[str, object] = {
        "corrected": delta > 0,
        "records": int(counts.sum()),
        "traced_iteration_ms": p_traced / 1e6,
        "untraced_iteration_ms": target / 1e6,
        "noise_ms": tol / 1e6,
        "traced_over_untraced": p_traced / target,
        "host_overhead_us_per_record": delta / 1e3,
        "corrected_iteration_ms": p_fit / 1e6,
        "corrected_error_pct": 100 * (p_fit / target - 1),
        "host_time_removed_ms": float((dur - new).sum()) / 1e6,
    }
    if delta == 0:
        info["why"] = "the traced graph already replays the untraced iteration within the noise"
        return graph, anchors, info
    res = whatif(c, new, slack=False)
    nodes = graph.nodes.copy()
    nodes["dur_ns"] = new
    nodes["start_ns"] = c.t0 + res.start_ns  # the replayed timeline: later stages compile it as recorded
    return Graph(nodes, graph.edges, dict(graph.meta)), moved_anchors(anchors, dur, new), info
