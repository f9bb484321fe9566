"""The Perseus baseline: lowtime's Phillips–Dessouky time–cost tradeoff on the same DAG.

Each *unit* picks its own clock: a pack ("pack" level) or a pass ("pass" level, as in Perseus: a
maximal run of one GPU's work between dependencies on other GPUs or the host, i.e. a forward or
backward pass of a pipeline stage, or the compute between two collectives). A unit's options are its
members' summed duration and energy above idle at each clock (Perseus subtracts blocking power the
same way); host nodes are fixed. lowtime walks the tradeoff from all-slowest toward all-fastest,
one time quantum per iteration; we stop at the first iteration whose schedule, checked with the
exact what-if pass, meets the deadline.

lowtime's Rust min-cut can panic on some inputs (pyo3 `PanicException`, a BaseException): we catch
it, rerun that cut with lowtime's pure-Python reference min-cut, and count the fallbacks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from importlib import metadata
from typing import cast

import numba
import numpy as np

from emo.graph.whatif import TOLERANCE_NS
from emo.optimize.problem import Problem, evaluate, make_items, units
from emo.optimize.solution import Solution
from emo.optimize.solvers.dp import repair_deadline

log = logging.getLogger("emo")
# costs in mJ: lowtime stops when one iteration's cost change is below 1e-6 and caps flow capacities at
# 1e4, so a time quantum must cost between the two (per-quantum energy changes are ~1e-4..1 J)
COST_SCALE = 1e3


def lowtime_version() -> str | None:
    try:
        return metadata.version("lowtime")
    except metadata.PackageNotFoundError:
        return None


def _unit_time_ms(p: Problem, udur: np.ndarray, max_iterations: int) -> float:
    """1 ms as in Perseus, finer for units shorter than 10 ms (>= 10 us), but coarse enough that
    walking from all-slowest to all-fastest (one quantum per iteration) takes at most
    `max_iterations` iterations."""
    shortest = float(np.min(udur[:, p.ref][udur[:, p.ref] > 0], initial=1e10)) * 1e-6
    _, _, slowest_ns = p.forward(p.dur_ns[:, 0].copy())
    walk_ms = max(slowest_ns - p.makespan0_ns, 0.0) * 1e-6
    return max(1e-2, min(1.0, shortest / 10), walk_ms / max(max_iterations, 1))


def _unit_dag(p: Problem, unit: np.ndarray, udur: np.ndarray, uen: np.ndarray, ut: float, level: str):
    """lowtime's AON DAG over units only, as Perseus' own DAG (the pipeline's passes, no CPU work):
    host nodes have one duration, and a lowtime operation per host call (tens of thousands in a
    traced pipeline) made each Phillips-Dessouky iteration take seconds. Precedence through host
    calls is kept (gpu_edges), and the longest host gap between two units as a fixed operation on
    their edge; every iterate is checked with the exact what-if."""
    import networkx as nx
    from lowtime.cost_model import CostModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, Operation, OperationSpec

    def spec_for(times_ns: np.ndarray, costs: np.ndarray) -> OperationSpec:
        opts = [
            ExecutionOption(real_time=float(t), unit_time=ut, cost=float(e) * COST_SCALE, knob=int(c))
            for c, (t, e) in enumerate(zip(times_ns, costs))
        ]
        cand = CandidateExecutionOptions(options=opts)
        return OperationSpec(options=cand, cost_model=cast(CostModel, HullCost(cand)))  # lowtime's contract, duck-typed

    g = nx.DiGraph()
    K = udur.shape[0]
    for k in range(K):
        g.add_node(int(k), op=Operation(spec=spec_for(udur[k], uen[k])))
    a, b, gap = gpu_edges(p, with_gaps=True)
    ua, ub = unit[a], unit[b]
    keep = ua != ub
    gaps: dict[tuple[int, int], float] = {}
    for x, y, z in zip(ua[keep].tolist(), ub[keep].tolist(), gap[keep].tolist()):
        gaps[(x, y)] = max(z, gaps.get((x, y), 0.0))
    nid = K
    for (x, y), z in gaps.items():
        if z < 0.5 * ut:  # below half a quantum lowtime would round it away
            g.add_edge(x, y)
            continue
        g.add_node(nid, op=Operation(spec=spec_for(np.array([z]), np.array([0.0]))))
        g.add_edge(x, nid)
        g.add_edge(nid, y)
        nid += 1
    add_source_node(g, nid)
    add_sink_node(g, nid + 1)
    g.graph["source_node"], g.graph["sink_node"] = nid, nid + 1
    if not nx.is_directed_acyclic_graph(g):
        raise ValueError(f"perseus: the {level}-level graph has a cycle (a {level} both feeds and waits on another)")
    return g


def _walk(g, p: Problem, items, deadline: float, max_iterations: int):
    """lowtime's Phillips-Dessouky walk, each iterate timed by the exact what-if (lowtime's time leaves
    out host gaps): (the first on time or None, the last or None, iterations, why it stopped early or
    None, Rust panics it fell back from)."""
    from lowtime.solver import PhillipsDessouky

    K = items.k
    fallbacks = [0]
    choice = last = stopped = None
    iters = 0
    with _rust_fallback(fallbacks):
        for _res in PhillipsDessouky(g, attr_name="op").run():
            iters += 1
            cand = np.array([g.nodes[k]["op"].assigned_knob for k in range(K)], dtype=np.int64)
            last = cand
            if evaluate(p, items, cand).makespan_ns <= deadline + TOLERANCE_NS:
                choice = cand
                break
            if iters >= 2 * max_iterations:
                stopped = "iterations"
                break
    return choice, last, iters, stopped, fallbacks[0]


def optimize_perseus(
    p: Problem, budget: float, *, level: str = "pass", unit_time_ms: float | None = None, max_iterations: int = 500
) -> Solution:
    """Perseus (lowtime) at `level` granularity. Raises ImportError if lowtime is not installed.

    The time quantum (`unit_time_ms`, default: see below) sets the number of Phillips–Dessouky
    iterations; the walk stops after 2 × `max_iterations` of them (a count: the same answer on any
    machine)."""
    t0 = time.perf_counter()
    items = make_items(p, 0.0, replicate=False, windows=units(p, level))
    unit = items.item_of  # internal order: item index per GPU node
    K, C = items.k, p.n_clocks
    udur = np.zeros((K, C))
    uen = np.zeros((K, C))
    gpu = unit >= 0
    np.add.at(udur, unit[gpu], p.dur_ns[gpu] + p.delay_ns[gpu][:, None])
    np.add.at(uen, unit[gpu], p.energy_j[gpu])
    if unit_time_ms is None:
        unit_time_ms = _unit_time_ms(p, udur, max_iterations)
    g = _unit_dag(p, unit, udur, uen, unit_time_ms * 1e6, level)
    deadline = p.makespan0_ns * (1 + budget)
    choice, last, iters, stopped, fallbacks = _walk(g, p, items, deadline, max_iterations)
    info = {
        "perseus_level": level,
        "lowtime_version": lowtime_version(),
        "pd_iterations": iters,
        "unit_time_ms": unit_time_ms,
        "max_pd_iterations": max_iterations,
        "units": int(K),
        "dag_edges": int(g.number_of_edges()),
        "rust_panics": fallbacks,
    }
    if stopped:
        info["perseus_stopped"] = stopped
    if choice is None and last is not None:
        # the walk's last schedule (its fastest, Perseus' own pick at its shortest time, unless it
        # stopped early) misses the exact deadline by the quantisation and the host gaps lowtime
        # leaves out: speed up the slowed units on the exact critical path until it is on time, as
        # EMO repairs its DP picks
        fixed = repair_deadline(p, items, last, deadline, {"critical_repairs": 0})
        if np.any(fixed != p.ref) and evaluate(p, items, fixed).makespan_ns <= deadline + TOLERANCE_NS:
            info["perseus_note"] = "no lowtime iterate met the deadline; its last one, repaired"
            choice = fixed
    if choice is None:  # nothing on time: max clocks
        info["perseus_note"] = "no lowtime iterate met the deadline; max clocks"
        choice = np.full(K, p.ref, dtype=np.int64)
    if fallbacks:
        log.warning("perseus: lowtime's Rust min-cut panicked %d times; used its Python min-cut", fallbacks)
    sol = Solution(p, items, choice, f"perseus-{level}", budget, info=info)
    sol.solve_s = time.perf_counter() - t0
    return sol


class HullCost:
    """lowtime cost model: the lower convex hull of a unit's (quantised time, energy) options,
    linearly interpolated (convex, as Phillips–Dessouky needs; exact at the options)."""

    def __init__(self, options) -> None:
        pts = sorted({(o.quant_time, o.cost) for o in options.options})
        hull: list[tuple[int, float]] = []
        for x, y in pts:
            if hull and hull[-1][0] == x:
                if y < hull[-1][1]:
                    hull[-1] = (x, y)
                continue
            while len(hull) >= 2 and _cross(hull[-2], hull[-1], (x, y)) <= 0:
                hull.pop()
            hull.append((x, y))
        self.x = np.array([h[0] for h in hull], dtype=np.float64)
        self.y = np.array([h[1] for h in hull], dtype=np.float64)

    def __call__(self, quant_time: int) -> float:
        if len(self.x) == 1:
            return float(self.y[0])
        x = float(quant_time)
        if x <= self.x[0]:  # linear extension keeps the model convex outside the options
            s = (self.y[1] - self.y[0]) / (self.x[1] - self.x[0])
            return float(self.y[0] + s * (x - self.x[0]))
        if x >= self.x[-1]:
            s = (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2])
            return float(self.y[-1] + s * (x - self.x[-1]))
        return float(np.interp(x, self.x, self.y))


def _cross(o, a, b) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


@contextlib.contextmanager
def _rust_fallback(counter: list[int]):
    """Swap lowtime's Rust min-cut for one that falls back to the Python reference on a panic."""
    import networkx as nx
    from lowtime import solver as lt_solver

    rust = lt_solver._lowtime_rs

    class Runner:
        def __init__(self, fp_error, nodes, source, sink, edges):
            self.args = (fp_error, nodes, source, sink, edges)

        def find_min_cut(self):
            try:
                return rust.PhillipsDessouky(*self.args).find_min_cut()
            except Exception:
                raise  # LowtimeFlowError and friends: lowtime's own signals
            except BaseException as e:  # pyo3 PanicException derives from BaseException
                if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                    raise
                counter[0] += 1
                _, nodes, source, sink, edges = self.args
                dag = nx.DiGraph()
                dag.add_nodes_from(nodes)
                for (u, v), (cap, flow, ub, lb) in edges:
                    dag.add_edge(u, v, capacity=cap, flow=flow, ub=ub, lb=lb)
                dag.graph["source_node"], dag.graph["sink_node"] = source, sink
                return lt_solver.PhillipsDessouky.find_min_cut(None, dag)

    class Shim:
        PhillipsDessouky = Runner

    lt_solver._lowtime_rs = Shim  # type: ignore[assignment]  # for this call only: the shim stands in for the Rust module
    try:
        yield
    finally:
        lt_solver._lowtime_rs = rust


def gpu_edges(p: Problem, with_gaps: bool = False):
    """GPU-to-GPU precedence (internal order): the direct edges between GPU nodes, and for a GPU node
    whose successor is a host call, the earliest GPU node of each device reachable from it through
    host calls only (later ones on that device follow it). With `with_gaps`, also the host time
    along each (the longest such path to that GPU node's launch, from the first node's end)."""
    n, D = p.n, p.devices
    dst, src = p.dst, p.src
    o = np.argsort(src, kind="stable")
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(succ_ptr, src + 1, 1)
    a, b, gap = _gpu_edges(
        np.cumsum(succ_ptr),
        dst[o],
        p.from_start[o],
        p.device.astype(np.int64),
        D,
        p.dur_ns[:, p.ref].copy(),
        p.delay_ns.astype(np.float64),
    )
    return (a, b, gap) if with_gaps else (a, b)


@numba.njit(cache=True)
def _gpu_edges(succ_ptr, succ, succ_fs, device, D, dur, delay):
    n = len(device)
    first = np.full((n, D), -1, dtype=np.int64)  # host node: earliest GPU node per device through host calls
    dist = np.zeros((n, D))  # host node: from its start to that GPU node's start (less its own delay)
    out_a, out_b, out_g = [], [], []
    for v in range(n - 1, -1, -1):  # internal order is topological
        host = device[v] < 0
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ[k]
            base = (0.0 if succ_fs[k] or not host else dur[v]) + delay[w]
            if device[w] >= 0:
                if not host:
                    out_a.append(v)
                    out_b.append(w)
                    out_g.append(0.0)
                else:
                    d = device[w]
                    g = base - delay[w]
                    if first[v, d] < 0 or w < first[v, d]:
                        first[v, d] = w
                        dist[v, d] = g
                    elif w == first[v, d] and g > dist[v, d]:
                        dist[v, d] = g
            else:
                for d in range(D):
                    f = first[w, d]
                    if f >= 0:
                        g = base + dist[w, d]
                        if not host:
                            out_a.append(v)
                            out_b.append(f)
                            out_g.append(g)
                        elif first[v, d] < 0 or f < first[v, d]:
                            first[v, d] = f
                            dist[v, d] = g
                        elif f == first[v, d] and g > dist[v, d]:
                            dist[v, d] = g
    return np.array(out_a, dtype=np.int64), np.array(out_b, dtype=np.int64), np.array(out_g)
