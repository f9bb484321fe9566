"""Dependency-aware greedy packing of compute kernels (the paper's packing, plus two exactness checks).

Walking each GPU stream's kernels in order (a topological order per stream), a kernel k joins the
open pack P of its stream, whose last kernel is m, only if

  (1) k's critical predecessor is m (so k starts right after m: the pack runs without gaps),
  (2) all critical successors of m are on the stream (m may become a non-final kernel),
  (3) the pack's duration at the default clock, k included, stays <= delta_max,
  (4) k depends on no GPU work of another stream, and its host dependencies (its launch) were met
      HOST_MARGIN_MS before P's binding constraint was: it waits for nothing P's first
      kernel did not wait for, even when the host falls behind after a synchronisation, and
  (5) m has no dependency leaving it other than the stream edge to k (no event another stream
      waits for, no blocked host call): such edges leave from the pack's end.

Otherwise k opens a new pack. Conditions (1)-(3) are the paper's; (4) and (5) make the pack-level
graph reproduce the recorded timeline exactly and keep it so when clocks change: an edge between
streams whose both ends are packed would, redirected to a pack boundary, turn critical as soon as
the two packs run at different clocks (measured: up to 1.5 % longer makespans without them, 0.07 %
with). Host dependencies are kept inside packs when the host runs well ahead of the GPU; a host
only just ahead (launches issued in a burst right after a synchronisation) falls behind once the
work it waited for slows down, which without the margin made a virtual pipeline-parallel graph up
to 2 % longer. Whatever difference remains is always on the safe side (emo.pack.packgraph). Only `kernel` nodes are packed:
collectives, copies and host nodes stay as they are.

All times come from one what-if replay of the recorded durations (emo.graph.whatif), so the
conditions are judged in the same timing model the pack graph is later evaluated in.
"""

from __future__ import annotations

import hashlib

import numba
import numpy as np
import pandas as pd

from emo.graph.graph import Graph
from emo.graph.whatif import Compiled, Result

# (4): a member's launch must precede the pack's start by this much: a host that runs only just
# ahead of the GPU falls behind it once a synchronisation waits for slowed-down work (1.25 ms
# still left a virtual 2-stage pipeline 1.1 % longer under random clocks; 2.5 ms: exact)
HOST_MARGIN_MS = 2.5
PACK_COLUMNS = {
    "pack": "int64",
    "rank": "int32",
    "device": "int32",
    "stream": "int64",
    "node": "int64",
    "first_node": "int64",
    "last_node": "int64",
    "kernels": "int64",
    "start_ns": "int64",
    "dur_ns": "int64",
    "signature": "str",
    "first_occurrence": "bool",
}


@numba.njit(cache=True)
def _greedy(order, skey, crit, ends, start, finish, bind, ext_ready, dmax, margin):
    """pack id per kernel (indexed like `order`'s entries' positions in the kernel arrays)."""
    n = order.shape[0]
    pack = np.empty(n, np.int64)
    npacks = -1
    last = -1
    p_start = 0
    p_bind = 0
    for i in range(n):
        k = order[i]
        join = False
        if last >= 0 and skey[k] == skey[last] and crit[k] == last and not ends[last]:
            if finish[k] - p_start <= dmax and ext_ready[k] <= p_bind - margin:
                join = True
        if join:
            pack[k] = npacks
        else:
            npacks += 1
            pack[k] = npacks
            p_start = start[k]
            p_bind = bind[k]
        last = k
    return pack


def signature(names) -> str:
    """Hash of a pack's kernel-name sequence: equal sequences are profiled once."""
    h = hashlib.blake2b(digest_size=8)
    for name in names:
        h.update(str(name).encode())
        h.update(b"\x00")
    return h.hexdigest()


def pack_kernels(graph: Graph, compiled: Compiled, replay: Result, delta_max_ns: int) -> np.ndarray:
    """Pack id per node (-1: not packed). `replay` is whatif(compiled) at the recorded durations."""
    nodes, edges = graph.nodes, graph.edges
    n = len(nodes)
    is_k = (nodes["kind"] == "kernel").to_numpy()
    kid = np.flatnonzero(is_k)  # kernel index -> node id
    nk = len(kid)
    if nk == 0:
        return np.full(n, -1, np.int64)
    local = np.full(n, -1, np.int64)
    local[kid] = np.arange(nk)

    start, finish = replay.start_ns, replay.finish_ns
    delay = np.empty(n, np.int64)
    delay[compiled.order] = compiled.delay
    bind = start - delay  # when each node's binding constraint was met

    # stream key of every node (-1 for host nodes and rendezvous)
    gpu = nodes["device"].to_numpy() >= 0
    skey_all = np.where(
        gpu,
        (nodes["rank"].to_numpy(np.int64) * 1_000 + nodes["device"].to_numpy(np.int64)) * 1_000_003
        + nodes["stream"].to_numpy(np.int64),
        -1,
    )

    src = edges["src"].to_numpy(np.int64)
    dst = edges["dst"].to_numpy(np.int64)
    fs = edges["from_start"].to_numpy(bool)
    t_src = np.where(fs, start[src], finish[src])

    # previous / next kernel on the same stream, when adjacent in stream order
    order = kid[np.lexsort((start[kid], skey_all[kid]))]
    same = skey_all[order[1:]] == skey_all[order[:-1]]
    prev_k = np.full(n, -1, np.int64)
    next_k = np.full(n, -1, np.int64)
    prev_k[order[1:][same]] = order[:-1][same]
    next_k[order[:-1][same]] = order[1:][same]

    crit = replay.critical_pred
    # (2) a kernel with a critical successor off its stream must end its pack
    off = crit >= 0
    succ, pred = np.flatnonzero(off), crit[off]
    bad = skey_all[succ] != skey_all[pred]
    offstream = np.zeros(n, bool)
    offstream[pred[bad]] = True

    # (4) latest time any in-edge other than the one from the previous stream kernel is met; an
    # in-edge from GPU work on another stream may turn critical once clocks change: never met
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    into_k = is_k[dst] & (src != prev_k[dst])
    ext_ready = np.full(n, small, np.int64)
    np.maximum.at(ext_ready, dst[into_k], np.where(gpu[src[into_k]], big, t_src[into_k]))
    # (5) a kernel with any out-edge other than the one to the next kernel on its stream (an event
    # another stream waits for, a blocked host call) ends its pack
    out_k = is_k[src] & (dst != next_k[src])
    ends = np.zeros(n, bool)
    ends[src[out_k]] = True

    p = _greedy(
        local[order],
        skey_all[kid],
        np.where(crit[kid] >= 0, local[np.maximum(crit[kid], 0)], -1),
        offstream[kid] | ends[kid],
        start[kid],
        finish[kid],
        bind[kid],
        ext_ready[kid],
        np.int64(delta_max_ns),
        np.int64(HOST_MARGIN_MS * 1e6),
    )
    out = np.full(n, -1, np.int64)
    out[kid] = p
    return out


def launch_lead_ns(graph: Graph, replay: Result) -> np.ndarray:
    """float64[kernels]: per kernel (in node order), its start minus when its last host dependency
    (its launch) was met on the replayed timeline; inf for a kernel without one. Under HOST_MARGIN_MS
    a kernel cannot join a pack (rule 4): where most are, the host barely runs ahead of the GPU (a
    host-bound trace) and packs stay one kernel each, which the pack stage says."""
    nodes, edges = graph.nodes, graph.edges
    kid = np.flatnonzero((nodes["kind"] == "kernel").to_numpy())
    src, dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
    host = nodes["device"].to_numpy()[src] < 0
    fs = edges["from_start"].to_numpy(bool)
    t = np.where(fs, replay.start_ns[src], replay.finish_ns[src]).astype(np.float64)
    ready = np.full(len(nodes), -np.inf)
    np.maximum.at(ready, dst[host], t[host])
    return replay.start_ns[kid] - ready[kid]


def pack_table(graph: Graph, replay: Result, pack_of: np.ndarray) -> pd.DataFrame:
    """One row per pack (PACK_COLUMNS; `node` is filled in by the pack graph): where it runs, its
    members' span, its signature and whether it is the first pack with that signature."""
    nodes = graph.nodes
    members = np.flatnonzero(pack_of >= 0)
    if len(members) == 0:
        return pd.DataFrame({c: pd.Series(dtype=t if t != "str" else object) for c, t in PACK_COLUMNS.items()})
    m = members[np.lexsort((replay.start_ns[members], pack_of[members]))]
    pid = pack_of[m]
    first = np.r_[True, pid[1:] != pid[:-1]]
    last = np.r_[first[1:], True]
    names = nodes["name"].to_numpy(dtype=object)[m]
    bounds = np.flatnonzero(first).tolist() + [len(m)]
    sigs = [signature(names[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    f, l = m[first], m[last]
    t = pd.DataFrame(
        {
            "pack": pid[first],
            "rank": nodes["rank"].to_numpy()[f],
            "device": nodes["device"].to_numpy()[f],
            "stream": nodes["stream"].to_numpy()[f],
            "node": -1,
            "first_node": f,
            "last_node": l,
            "kernels": np.diff(bounds),
            "start_ns": replay.start_ns[f],
            "dur_ns": replay.finish_ns[l] - replay.start_ns[f],
            "signature": sigs,
        }
    )
    # first occurrence: earliest start over all ranks (ties: lower rank)
    o = t.sort_values(["start_ns", "rank", "pack"], kind="stable")
    t["first_occurrence"] = False
    t.loc[o.drop_duplicates("signature").index, "first_occurrence"] = True
    return t.astype({c: tp for c, tp in PACK_COLUMNS.items() if tp != "str"}).reset_index(drop=True)


def members_of(pack_of: np.ndarray, start_ns: np.ndarray) -> list[np.ndarray]:
    """Member node ids per pack, in execution order."""
    m = np.flatnonzero(pack_of >= 0)
    m = m[np.lexsort((start_ns[m], pack_of[m]))]
    cuts = np.flatnonzero(np.diff(pack_of[m])) + 1
    return np.split(m, cuts)
