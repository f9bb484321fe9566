"""The clock-scheduling problem every optimiser here solves, as plain arrays.

A DAG of nodes (packs, communication, copies, CPU intervals) in topological order. A GPU node's
duration and energy (above idle) depend on the SM clock of its GPU while it runs; host nodes have a
fixed duration. Edges are finish-to-start, or start-to-start (`from_start`: a kernel starts after
its launch call starts). A node starts when its last constraint is met plus that edge's lag: the
graph is the timing engine's (emo.graph.whatif: CSR in-edges with a lag per edge and a start offset
per node), re-ordered so that the nodes of a time window are contiguous.

The clock is chosen per *item* = (clock group, window): a clock group is a set of GPUs that share one
schedule (symmetric tensor-parallel ranks, detected from identical per-device structure) or a single
GPU; a window is a change interval of the max-clock (baseline) timeline. A GPU node belongs to the
window its baseline start falls in.

Energy of a choice = Σ node energies at their clocks + Σ over GPUs of idle power × time, where a
GPU's idle power follows its window's clock and the iteration's extension beyond the baseline is
charged at each GPU's idle power at the default clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emo.errors import ConfigError
from emo.graph import whatif as engine


@dataclass
class Problem:
    # the engine's graph in internal order = topological, sorted by baseline start
    indptr: np.ndarray  # int64[n+1]: CSR over in-edges
    src: np.ndarray  # int64[m]: predecessor
    from_start: np.ndarray  # bool[m]: start-to-start edge
    lag_ns: np.ndarray  # float64[m]: gap after the constraint is met (launch latency, queueing)
    offset_ns: np.ndarray  # float64[n]: a source's start
    device: np.ndarray  # int32[n], -1 = host node
    dur_ns: np.ndarray  # float64[n, C] (host nodes: the same in every column)
    energy_j: np.ndarray  # float64[n, C], energy above idle
    idle_power_w: np.ndarray  # float64[D, C]
    clocks_mhz: np.ndarray  # int64[C], ascending, the candidate clocks
    ref: int  # column of the default (max) clock: the baseline
    perm: np.ndarray  # int64[n]: internal index -> caller's node id
    base_start: np.ndarray = field(init=False)
    base_finish: np.ndarray = field(init=False)
    makespan0_ns: float = field(init=False)

    def __post_init__(self) -> None:
        self.base_start, self.base_finish, self.makespan0_ns, _ = engine.forward(
            *self.graph, self.dur_ns[:, self.ref].copy()
        )

    @property
    def graph(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The arguments every engine pass takes first."""
        return self.indptr, self.src, self.from_start, self.lag_ns, self.offset_ns

    @property
    def dst(self) -> np.ndarray:
        return np.repeat(np.arange(self.n), np.diff(self.indptr))

    @property
    def delay_ns(self) -> np.ndarray:
        """float64[n]: each node's start minus when its last constraint was met on the baseline
        timeline (the lag of its binding edge; a source's offset): the per-node view of the lags
        that activity-on-node models (Perseus' lowtime DAG) take."""
        t = np.where(self.from_start, self.base_start[self.src], self.base_finish[self.src])
        met = np.full(self.n, -np.inf)
        np.maximum.at(met, self.dst, t)
        return np.where(np.isfinite(met), self.base_start - met, self.offset_ns)

    def forward(self, dur_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(start, finish, makespan) at per-node durations (internal order)."""
        return engine.forward(*self.graph, np.asarray(dur_ns, np.float64))[:3]

    def latest_finish(self, dur_ns: np.ndarray, deadline: float) -> np.ndarray:
        return engine.latest_finish(*self.graph, np.asarray(dur_ns, np.float64), float(deadline))

    @property
    def n(self) -> int:
        return len(self.device)

    @property
    def devices(self) -> int:
        return self.idle_power_w.shape[0]

    @property
    def n_clocks(self) -> int:
        return len(self.clocks_mhz)


def build_problem(
    src,
    dst,
    device,
    dur_ns,
    energy_j,
    idle_power_w,
    clocks_mhz,
    *,
    from_start=None,
    lag_ns=None,
    offset_ns=None,
    delay_ns=None,
    min_clock_fraction: float = 0.0,
    default_mhz: int | None = None,
) -> Problem:
    """A Problem from edge lists and per-node × clock tables (caller's node ids 0..n-1).

    Times: a lag per edge (`lag_ns`, the engine's) and a start offset per source node, or a fixed
    delay per node (`delay_ns`: every in-edge of the node gets it as its lag). Clocks below
    `min_clock_fraction` × max (or above `default_mhz`) are dropped; the default clock (max if not
    given) is the baseline every budget is relative to.
    """
    device = np.asarray(device, dtype=np.int32)
    n = len(device)
    dur = np.asarray(dur_ns, dtype=np.float64).reshape(n, -1)
    en = np.asarray(energy_j, dtype=np.float64).reshape(n, -1)
    clocks = np.asarray(clocks_mhz, dtype=np.int64)
    idle = np.asarray(idle_power_w, dtype=np.float64).reshape(-1, len(clocks))
    if dur.shape != (n, len(clocks)) or en.shape != dur.shape:
        raise ValueError(
            f"tables: dur_ns {dur.shape} / energy_j {en.shape} do not match {n} nodes × {len(clocks)} clocks"
        )
    if np.any(~np.isfinite(dur)) or np.any(dur < 0):
        raise ValueError("tables: dur_ns has negative or non-finite entries")
    if len(device) and device.max() >= idle.shape[0]:
        raise ValueError(f"tables: device {device.max()} has no idle power row ({idle.shape[0]} devices)")
    order = np.argsort(clocks, kind="stable")
    clocks, dur, en, idle = clocks[order], dur[:, order], en[:, order], idle[:, order]
    top = int(default_mhz) if default_mhz else int(clocks.max())
    keep = (clocks >= min_clock_fraction * clocks.max()) & (clocks <= top)
    if not keep.any() or top not in clocks[keep]:
        raise ValueError(f"clocks: default {top} MHz not among the candidate clocks {clocks.tolist()}")
    clocks, dur, en, idle = clocks[keep], dur[:, keep], en[:, keep], idle[:, keep]
    ref = int(np.flatnonzero(clocks == top)[0])
    host = device < 0
    dur[host] = dur[host, ref][:, None]
    en[host] = en[host, ref][:, None]

    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    fs = np.zeros(len(src), dtype=np.bool_) if from_start is None else np.asarray(from_start, dtype=np.bool_)
    if len(src) and (src.min() < 0 or max(src.max(), dst.max()) >= n):
        raise ValueError(f"edges: node id out of range 0..{n - 1}")
    if delay_ns is not None:
        delay = np.asarray(delay_ns, dtype=np.float64)
        if delay.shape != (n,):
            raise ValueError(f"tables: delay_ns has shape {delay.shape}, expected ({n},)")
        lag = delay[dst]
        offset = np.where(np.bincount(dst, minlength=n) > 0, 0.0, delay)
    else:
        lag = np.zeros(len(src)) if lag_ns is None else np.asarray(lag_ns, dtype=np.float64)
        offset = np.zeros(n) if offset_ns is None else np.asarray(offset_ns, dtype=np.float64)
    topo = engine.toposort(n, src, dst)
    if len(topo) < n:
        raise ValueError(f"graph: dependency cycle among {n - len(topo)} nodes")
    rank = np.empty(n, dtype=np.int64)
    rank[topo] = np.arange(n)
    g = engine.csr_in_edges(n, rank[src], rank[dst], fs, lag)
    s0 = engine.forward(*g, offset[topo], dur[topo, ref].copy())[0]
    # re-sorted by baseline start (still topological) so that a window's nodes are contiguous
    reordered = engine.reorder_by_start(*g, offset[topo], s0)  # (order, *graph)
    perm = topo[reordered[0]]
    return Problem(*reordered[1:], device[perm], dur[perm], en[perm], idle, clocks, ref, perm)


# --------------------------------------------------------------------------- items
@dataclass
class Items:
    """The decision variables: one clock per (group, window)."""

    groups: list[list[int]]  # clock group -> devices
    group_of_device: np.ndarray  # int64[D]
    item_of: np.ndarray  # int64[n]: item of each node, -1 for host nodes
    group: np.ndarray  # int64[K]
    window: np.ndarray  # int64[K]
    t0_ns: np.ndarray  # float64[K]: window start on the baseline timeline
    len_ns: np.ndarray  # float64[K]
    energy: np.ndarray  # float64[K, C]: node energies + idle energy of the window at each clock
    lo: np.ndarray  # int64[K]: first internal node of the item (-1: no nodes)
    hi: np.ndarray  # int64[K]: last internal node of the item
    ext_power_w: float  # idle power of all GPUs at the default clock: the DP's price of a longer iteration
    interval_ns: float
    idle_energy: np.ndarray | None = None  # float64[K, C]: the idle part of `energy`
    edges_ns: np.ndarray | None = None  # float64[G, W + 1]: change points of each group (iteration_items)

    def total(self, choice: np.ndarray, makespan_ns: float, makespan0_ns: float) -> float:
        """Energy of a choice whose iteration takes makespan_ns: every window stretches with the
        iteration, paying idle power at its own clock for the extra time."""
        rows = np.arange(self.k)
        stretch = max(0.0, makespan_ns / makespan0_ns - 1.0) if makespan0_ns > 0 else 0.0
        assert self.idle_energy is not None  # iteration_items sets it
        return float(self.energy[rows, choice].sum() + stretch * self.idle_energy[rows, choice].sum())

    @property
    def k(self) -> int:
        return len(self.group)

    @property
    def useful(self) -> np.ndarray:
        """bool[K, C]: clocks that use less energy than every faster clock (others are slower and
        cost more: never worth a delay)."""
        e = self.energy
        faster_min = np.minimum.accumulate(e[:, ::-1], axis=1)[:, ::-1]  # min over c' >= c
        out = np.ones_like(e, dtype=bool)
        out[:, :-1] = e[:, :-1] < faster_min[:, 1:]
        return out


def symmetric_groups(p: Problem, tol: float = 0.25, bin_ms: float = 5.0) -> list[list[int]]:
    """Devices that do the same work at the same time share a clock schedule: tensor-parallel ranks
    (and data-parallel replicas of one stage). Recorded ranks differ in detail (a few extra kernels
    on rank 0, jitter), so devices are compared by their busy-time and energy profiles over `bin_ms`
    bins of the baseline timeline at the fastest and the slowest clock: within `tol` (L1, relative)
    they are one group. Kernel jitter lets peers drift apart by a fraction of a kernel over an
    iteration, which moves busy time across bin edges; pipeline stages, doing their work at other
    times, differ by most of it. Kept apart, jittered peers would get clocks of their own, chosen
    on their noise, and wait for the slowest of them at every collective."""
    nb = max(1, int(np.ceil(p.makespan0_ns / (bin_ms * 1e6))))
    b = np.minimum((p.base_start // (bin_ms * 1e6)).astype(np.int64), nb - 1)
    prof = np.zeros((p.devices, 4, nb))
    gpu = p.device >= 0
    for j, col in enumerate((p.dur_ns[:, p.ref], p.dur_ns[:, 0], p.energy_j[:, p.ref], p.energy_j[:, 0])):
        np.add.at(prof, (p.device[gpu], j, b[gpu]), col[gpu])  # type: ignore[arg-type]  # numpy stub: ufunc.at rejects a tuple index
    groups: list[list[int]] = []
    for d in range(p.devices):
        for g in groups:
            r = prof[g[0]]
            scale = np.maximum(r.sum(axis=1), 1e-300)
            if prof[d].sum() > 0 and np.all(np.abs(prof[d] - r).sum(axis=1) <= tol * scale):
                g.append(d)
                break
        else:
            groups.append([d])
    return groups


def _timed_windows(p: Problem, step: float, g_of: np.ndarray, ngroups: int):
    """(windows per group, each node's item key or -1, every item's key, start, length): windows every
    `step` ns of the baseline timeline, every (group, window) an item, empty ones too (idle clock)."""
    t_end = max(p.makespan0_ns, 1.0)
    gpu = p.device >= 0
    nwin = int(np.ceil(t_end / step))
    win = np.minimum((p.base_start // step).astype(np.int64), nwin - 1)
    key = np.where(gpu, g_of * nwin + win, -1)
    all_keys = np.arange(ngroups * nwin)
    t0 = (all_keys % nwin) * step
    return nwin, key, all_keys, t0, np.minimum(t0 + step, t_end) - t0


def _given_windows(p: Problem, windows, window_len_ns, step: float, g_of: np.ndarray, ngroups: int):
    """As _timed_windows for explicit per-node `windows`: with `window_len_ns` every (group, window)
    is an item over that GPU time; else the non-empty ones, over their nodes' baseline span."""
    w = np.asarray(windows, dtype=np.int64)
    if len(w) != p.n:
        raise ValueError(f"windows: {len(w)} entries for {p.n} nodes")
    w = w[p.perm]
    nwin = np.shape(window_len_ns)[-1] if window_len_ns is not None else (int(w.max()) + 1 if len(w) else 1)
    if len(w) and w.max() >= nwin:
        raise ValueError(f"windows: index {w.max()} beyond the {nwin} window lengths given")
    key = np.where((p.device >= 0) & (w >= 0), g_of * nwin + w, -1)
    if window_len_ns is not None:  # [W], or [G, W] when each group has its own windows
        all_keys = np.arange(ngroups * nwin)
        wl = np.asarray(window_len_ns, dtype=np.float64)
        wl = np.broadcast_to(wl, (ngroups, nwin)) if wl.ndim == 1 else wl
        t0 = (all_keys % nwin) * step  # nominal; iteration_items sets the change points
        return nwin, key, all_keys, t0, wl[all_keys // nwin, all_keys % nwin]
    all_keys = np.unique(key[key >= 0])
    kk = np.searchsorted(all_keys, key[key >= 0])
    t0 = np.full(len(all_keys), np.inf)
    last = np.zeros(len(all_keys))
    np.minimum.at(t0, kk, p.base_start[key >= 0])
    np.maximum.at(last, kk, p.base_finish[key >= 0])
    return nwin, key, all_keys, t0, last - t0


def make_items(
    p: Problem,
    interval_ms: float,
    *,
    replicate: bool = True,
    windows: np.ndarray | None = None,
    groups: list[list[int]] | None = None,
    window_len_ns: np.ndarray | None = None,
) -> Items:
    """Items for change points every `interval_ms` of the baseline timeline, or explicit per-node
    `windows` (e.g. one per pack for a pack-level baseline). With `window_len_ns` (the GPU time each
    window index covers in all, e.g. its length × iterations) every (group, window) is an item, empty
    ones too, and pays idle power over that time."""
    if interval_ms <= 0 and windows is None:
        raise ConfigError(f"optimizer.change_interval_ms must be > 0 (got {interval_ms})")
    groups = groups or (symmetric_groups(p) if replicate else [[d] for d in range(p.devices)])
    gdev = np.full(p.devices, -1, dtype=np.int64)
    for g, ds in enumerate(groups):
        gdev[ds] = g
    step = interval_ms * 1e6
    g_of = gdev[np.where(p.device >= 0, p.device, 0)]
    if windows is None:
        nwin, key, all_keys, t0, length = _timed_windows(p, step, g_of, len(groups))
    else:  # explicit units (caller's node order): one window per unit id, e.g. per pack or per pass
        nwin, key, all_keys, t0, length = _given_windows(p, windows, window_len_ns, step, g_of, len(groups))
    item_of = np.full(p.n, -1, dtype=np.int64)
    item_of[key >= 0] = np.searchsorted(all_keys, key[key >= 0])
    K = len(all_keys)
    group = all_keys // nwin
    energy = np.zeros((K, p.n_clocks))
    np.add.at(energy, item_of[key >= 0], p.energy_j[key >= 0])
    idle_g = np.zeros((len(groups), p.n_clocks))
    for g, ds in enumerate(groups):
        idle_g[g] = p.idle_power_w[ds].sum(axis=0)
    idle_energy = idle_g[group] * (length * 1e-9)[:, None]
    energy += idle_energy
    lo = np.full(K, -1, dtype=np.int64)
    hi = np.full(K, -1, dtype=np.int64)
    nodes = np.flatnonzero(item_of >= 0)
    if len(nodes):
        lo_v = np.full(K, p.n, dtype=np.int64)
        np.minimum.at(lo_v, item_of[nodes], nodes)
        np.maximum.at(hi, item_of[nodes], nodes)
        lo = np.where(hi >= 0, lo_v, -1)
    return Items(
        groups,
        gdev,
        item_of,
        group.astype(np.int64),
        (all_keys % nwin).astype(np.int64),
        t0.astype(np.float64),
        length.astype(np.float64),
        energy,
        lo,
        hi,
        float(p.idle_power_w[:, p.ref].sum()),
        step,
        idle_energy,
    )


# --------------------------------------------------------------------------- evaluation
@dataclass
class Evaluation:
    makespan_ns: float
    energy_j: float
    start_ns: np.ndarray  # internal order
    finish_ns: np.ndarray


def durations(p: Problem, items: Items, choice: np.ndarray) -> np.ndarray:
    col = np.where(items.item_of >= 0, np.asarray(choice)[np.maximum(items.item_of, 0)], p.ref)
    return p.dur_ns[np.arange(p.n), col]


def evaluate(p: Problem, items: Items, choice: np.ndarray) -> Evaluation:
    """The exact makespan (full what-if pass) and energy of a clock choice per item."""
    choice = np.asarray(choice, dtype=np.int64)
    s, f, t = p.forward(durations(p, items, choice))
    e = items.total(choice, t, p.makespan0_ns)
    return Evaluation(t, e, s, f)


# --------------------------------------------------------------------------- passes
def opens_pass(p: Problem) -> np.ndarray:
    """bool[n] (internal order): GPU nodes that open a pass, a run of one GPU's work between waits:
    the GPU's first node, and every node with a predecessor on another GPU (a pipeline's
    activations, a collective's peers) or on the host through a finish-to-start edge (the host
    waited on something first); a kernel's own launch call (a start-to-start edge) is not a wait."""
    dst, src = p.dst, p.src
    waits = np.where(p.device[src] >= 0, p.device[src] != p.device[dst], ~p.from_start)
    opens = np.zeros(p.n, dtype=bool)
    opens[dst[waits]] = True
    gpu = np.flatnonzero(p.device >= 0)
    opens[gpu[np.unique(p.device[gpu], return_index=True)[1]]] = True
    return (p.device >= 0) & opens


def units(p: Problem, level: str) -> np.ndarray:
    """Unit id per node in the caller's order (-1 for host nodes): one per pack, or one per pass
    (opens_pass), numbered GPU by GPU so that a pass never spans two GPUs."""
    gpu = np.flatnonzero(p.device >= 0)
    unit = np.full(p.n, -1, dtype=np.int64)
    if level == "pack":
        unit[gpu] = np.arange(len(gpu))
    elif level == "pass":
        o = gpu[np.lexsort((gpu, p.device[gpu]))]  # by GPU, then in topological (start) order
        unit[o] = np.cumsum(opens_pass(p)[o]) - 1
    else:
        raise ValueError(f"perseus level must be 'pack' or 'pass' (got {level!r})")
    out = np.full(p.n, -1, dtype=np.int64)
    out[p.perm] = unit
    return out
