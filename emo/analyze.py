"""Critical path, its breakdown, slack per GPU and replay error of a trace, as a library: what
`emo analyze` (emo.cli.analyze) prints. A trace is a Kineto JSON trace (plain or .gz), a folder of
per-rank Kineto files, or an Nsight Systems SQLite export; `hta_compatible` also computes the critical
path under Holistic Trace Analysis's conventions (per rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the analysis itself is imported when it runs: `emo --help` stays light
    import pandas as pd

    from emo.graph import Graph
    from emo.graph.whatif import Compiled, Result


# More GPU ops than this share without their launching call in the trace: no critical path. A window
# cut from a longer run loses a few (dlrm_8rank: 6 %), a trace without correlation ids loses all.
UNLAUNCHED_SHARE = 0.25


@dataclass
class Analysis:
    summary: dict
    events: pd.DataFrame
    graph: Graph
    result: Result
    t0_ns: int


def analyze_trace(
    path, rank: int | None = None, annotation: str | None = None, instance: int = 0, hta_compatible: bool = False
) -> Analysis:
    from emo.trace.kineto import no_gc

    with no_gc():  # the analysis makes no cycles: no collection passes over all the imported modules
        return _analyze(path, rank, annotation, instance, hta_compatible)


def _analyze(path, rank, annotation, instance, hta_compatible) -> Analysis:
    from emo.graph import build_graph, summary
    from emo.graph.whatif import compile_graph, whatif
    from emo.trace import clip_window, read_trace
    from emo.trace.read import unlaunched

    events = read_trace(path)
    missing, ops = unlaunched(events)
    if missing > UNLAUNCHED_SHARE * ops:  # what launched what is the graph's spine: without it, no breakdown
        raise ValueError(
            f"{path}: {missing} of {ops} GPU ops have no runtime call that launched them in the trace "
            "(correlation ids missing, or CUDA runtime events not recorded): the dependencies a critical "
            "path needs are missing; record CPU and CUDA activity (torch.profiler: ProfilerActivity.CPU, CUDA)"
        )
    if rank is not None:
        mine = (events["rank"] == rank).to_numpy()
        if not mine.all():  # (a one-rank trace is not copied)
            events = events[mine].reset_index(drop=True)
        if events.empty:
            raise ValueError(f"{path}: no events on rank {rank}")
    try:
        window = clip_window(events, annotation, instance) if annotation else events
    except ValueError as e:  # which file the annotation is missing from, and the option that named it
        raise ValueError(
            f"{path}: --annotation {annotation!r}: {str(e).removeprefix(f'annotation {annotation!r} ')}"
        ) from None
    if missing:  # (a window of a longer run: a few launched before it began)
        window.attrs["warnings"] = [
            *window.attrs.get("warnings", []),
            f"{missing} GPU ops have no launching call in the trace (launched before it began?): each is taken as "
            "ready when its stream is",
        ]
    try:
        graph = build_graph(window)
        compiled = compile_graph(graph)
        result = whatif(compiled)
    except ValueError as e:  # e.g. a dependency cycle: say which file it is in
        raise ValueError(f"{path}: {e}") from None
    if result.replay_error_ns:  # the graph does not reproduce the trace's own times: its breakdown would be made up
        raise ValueError(
            f"{path}: replaying its dependencies misses its recorded times by {result.replay_error_ns / 1e3:g} us "
            "(events shifted, dropped or merged from another run?): no breakdown"
        )
    out = summary(graph, result, compiled)
    out["gpu_ops_without_launch"] = missing
    out["mode"] = "default"
    if hta_compatible:
        from emo.graph.hta import hta_critical_path

        ranks = [rank] if rank is not None else sorted(int(r) for r in events["rank"].unique())
        per: dict[int, dict[str, Any]] = {}
        for r in ranks:
            try:
                h = hta_critical_path(events, r, annotation or "", instance)
            except ValueError as e:
                raise ValueError(f"{path}: rank {r}: {e}") from None
            per[r] = {
                "critical_path_us": h.cp_us,
                "breakdown_us": h.breakdown_us,
                "path_nodes": h.path_nodes,
                "graph_nodes": h.graph_nodes,
                "graph_edges": h.graph_edges,
            }
        out["mode"] = "hta-compatible"
        out["emo_critical_path_us"] = out["critical_path_us"]
        out["critical_path_us"] = float(per[ranks[0]]["critical_path_us"])
        out["hta"] = per
    return Analysis(out, window, graph, result, compiled.t0)


class Trace:
    """A trace and its analysis, for library users (in the spirit of HTA's TraceAnalysis):

        t = Trace("trace.json.gz")            # Kineto JSON, a per-rank folder, an nsys export, or a registered format
        t.critical_path()                     # one row per node on the critical path: what it adds, and why
        t.slack()                             # per GPU stream, windows of ops off the critical path and their slack
        t.breakdown()                         # the critical path by category, in microseconds
        t.whatif(scale={"gemm": 0.5})         # the makespan if kernels named like "gemm" took half the time

    The same analysis as `emo analyze` (`rank`, `annotation`, `instance` as its options)."""

    def __init__(self, path, *, rank: int | None = None, annotation: str | None = None, instance: int = 0):
        self.path = path
        self._a = analyze_trace(path, rank=rank, annotation=annotation, instance=instance)
        self._compiled: Compiled | None = None

    @property
    def events(self) -> pd.DataFrame:
        """The normalised event table (emo.trace.schema) of the analysed window."""
        return self._a.events

    @property
    def graph(self) -> Graph:
        return self._a.graph

    def summary(self) -> dict:
        """What `emo analyze --json` prints."""
        return dict(self._a.summary)

    def critical_path(self) -> pd.DataFrame:
        """Critical-path nodes, first to last: node, rank, kind, name, dur_ns and delay_ns (what each adds)
        with their categories."""
        from emo.graph.summary import path_breakdown

        bd = path_breakdown(self.graph, self._a.result)
        bd.insert(3, "name", self.graph.nodes["name"].to_numpy(dtype=object)[bd["node"].to_numpy()])
        return bd

    def slack(self) -> pd.DataFrame:
        """Per GPU stream, maximal runs of ops with slack > 0: rank, device, stream, start_ns, end_ns,
        slack_ns (by how much the run may stretch without lengthening the iteration), nodes."""
        from emo.graph.whatif import slack_windows

        return slack_windows(self.graph, self._a.result)

    def breakdown(self) -> dict[str, float]:
        """The critical path's time by category (kernel, launch, communication, ...), microseconds."""
        return dict(self._a.summary["breakdown_us"])

    def whatif(self, dur_ns=None, *, scale: dict[str, float] | None = None) -> dict:
        """The timeline replayed with new durations: `dur_ns` per node id, or `scale` {regex on the node
        name: factor} applied to GPU ops. Returns makespan_us (before and after) and the new critical path's
        length in nodes."""
        import re

        import numpy as np

        from emo.graph.graph import GPU_NODE_KINDS
        from emo.graph.whatif import compile_graph, whatif

        compiled = self._compiled = self._compiled or compile_graph(self.graph)
        nodes = self.graph.nodes
        dur = nodes["dur_ns"].to_numpy(np.int64).copy() if dur_ns is None else np.asarray(dur_ns, np.int64)
        if len(dur) != len(nodes):
            raise ValueError(f"whatif: dur_ns has {len(dur)} values for a graph of {len(nodes)} nodes")
        gpu = nodes["kind"].isin(GPU_NODE_KINDS).to_numpy()
        names = nodes["name"].astype(str)
        for pattern, factor in (scale or {}).items():
            hit = gpu & names.str.contains(re.compile(pattern), regex=True).to_numpy()
            dur[hit] = np.round(dur[hit] * float(factor)).astype(np.int64)
        r = whatif(compiled, dur, slack=False)
        return {
            "makespan_us": r.makespan_ns / 1e3,
            "recorded_makespan_us": self._a.result.makespan_ns / 1e3,
            "critical_path_nodes": int(len(r.critical_path)),
        }

    def write_perfetto(self, out) -> None:
        """The trace with critical-path and slack tracks, for ui.perfetto.dev (.json or .json.gz)."""
        from emo.graph.perfetto import write_perfetto

        write_perfetto(out, self.path, self.events, self.graph, self._a.result, self._a.t0_ns)
