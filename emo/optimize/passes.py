"""Compiled passes over a DAG in topological order (CSR of predecessors): the schedule at given
durations, latest finish times against a deadline, the end-to-end delay of changing one item's clock
(a local what-if pass), and the multiple-choice knapsack at the core of the DP.

Every array is internal order: node i's predecessors all have smaller indices.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit

SERIAL_WORK = 200_000  # node × clock visits below which a local what-if pass runs on one thread


@njit(cache=True)
def forward(ptr, idx, fs, delay, dur):
    """Earliest start/finish of every node and the makespan; delay[v] is the fixed time between
    v's last constraint and its start (launch latency, queueing: emo.graph.whatif's model)."""
    n = len(dur)
    start = np.zeros(n)
    finish = np.zeros(n)
    t = 0.0
    for v in range(n):
        s = 0.0
        for e in range(ptr[v], ptr[v + 1]):
            u = idx[e]
            x = start[u] if fs[e] else finish[u]
            if x > s:
                s = x
        s += delay[v]
        start[v] = s
        finish[v] = s + dur[v]
        if finish[v] > t:
            t = finish[v]
    return start, finish, t


@njit(cache=True)
def latest_finish(ptr, idx, fs, delay, dur, deadline):
    """Latest finish of every node that keeps the makespan within `deadline`."""
    n = len(dur)
    lf = np.full(n, deadline)
    for v in range(n - 1, -1, -1):
        ls = lf[v] - dur[v] - delay[v]
        for e in range(ptr[v], ptr[v + 1]):
            u = idx[e]
            x = ls + dur[u] if fs[e] else ls
            if x < lf[u]:
                lf[u] = x
    return lf


@njit(cache=True)
def free_finish(ptr, idx, fs, delay, dur, start, deadline):
    """Latest finish of every node that delays none of its successors (free slack): delays measured
    against it add up along any path, so their sum bounds the end-to-end delay."""
    n = len(dur)
    lf = np.full(n, deadline)
    for v in range(n):
        for e in range(ptr[v], ptr[v + 1]):
            u = idx[e]
            x = start[v] - delay[v] + (dur[u] if fs[e] else 0.0)
            if x < lf[u]:
                lf[u] = x
    return lf


@njit(cache=True)
def _local_chunk(ptr, idx, fs, delay, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo, useful,
                 limit, out, first, last):
    n = len(cur_dur)
    C = dur_table.shape[1]
    stamp = np.full(n, -1, np.int64)
    ns = np.zeros(n)
    nf = np.zeros(n)
    tag = 0
    for kk in range(first, last):
        k = todo[kk]
        if lo[k] < 0:
            continue
        over = False
        for c in range(C - 1, -1, -1):  # fastest first: once past the limit, slower clocks are too
            if over or not useful[k, c]:
                out[k, c] = np.inf
                continue
            tag += 1
            worst = 0.0
            for v in range(lo[k], hi[k] + 1):
                mine = item_of[v] == k
                touched = mine
                s = 0.0
                for e in range(ptr[v], ptr[v + 1]):
                    u = idx[e]
                    if stamp[u] == tag:
                        touched = True
                        x = ns[u] if fs[e] else nf[u]
                    else:
                        x = start[u] if fs[e] else finish[u]
                    if x > s:
                        s = x
                if not touched:
                    continue
                s += delay[v]
                f = s + (dur_table[v, c] if mine else cur_dur[v])
                if s != start[v] or f != finish[v]:
                    stamp[v] = tag
                    ns[v] = s
                    nf[v] = f
                    late = f - finish[v] - slack[v]
                    if late > worst:
                        worst = late
            out[k, c] = worst
            if worst > limit:
                over = True


def local_delays(ptr, idx, fs, delay, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo, useful, limit):
    """delay[k, c]: how far past its deadline the iteration would end if only item k ran at clock c
    (inf: not evaluated, because the clock is not useful for the item or a faster one is already
    past `limit`).

    A what-if pass over the item's span of the order only: nodes it touches get new times, and a
    touched node x ends the iteration at its new finish + its tail, i.e. late by
    (new finish - finish) - slack; the tail past the span holds no node of the item, so this is exact.
    """
    out = np.zeros((len(lo), dur_table.shape[1]))
    t = todo[lo[todo] >= 0]
    if (np.sum(hi[t] - lo[t] + 1) * dur_table.shape[1]) < SERIAL_WORK:
        # small: threads cost more than they save, and on a busy machine every parallel region
        # waits for a thread to be scheduled (a per-pack pipeline's ~200 passes took a second)
        _local_chunk(ptr, idx, fs, delay, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo, useful,
                     float(limit), out, 0, len(todo))
        return out
    chunks = max(1, min(len(todo), 4 * numba.get_num_threads()))
    _local_all(ptr, idx, fs, delay, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo, useful,
               float(limit), out, chunks)
    return out


@njit(cache=True, parallel=True)
def _local_all(ptr, idx, fs, delay, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo, useful,
               limit, out, chunks):
    for j in numba.prange(chunks):  # items split across threads, each chunk with its own scratch
        _local_chunk(ptr, idx, fs, delay, cur_dur, start, finish, slack, dur_table, item_of, lo, hi, todo,
                     useful, limit, out, j * len(todo) // chunks, (j + 1) * len(todo) // chunks)


@njit(cache=True)
def knapsack(q, cost, budget):
    """Multiple-choice knapsack: one option per item, Σ q ≤ budget, min Σ cost.

    Returns best[t] (min cost using exactly t units) and arg[k, t] (the option of item k on that
    optimum), to be read back by `backtrack`. O(K · C · budget).
    """
    K, C = q.shape
    inf = np.inf
    best = np.full(budget + 1, inf)
    best[0] = 0.0
    arg = np.full((K, budget + 1), -1, np.int16)
    nxt = np.empty(budget + 1)
    for k in range(K):
        nxt[:] = inf
        for t in range(budget + 1):
            b = best[t]
            if b == inf:
                continue
            for c in range(C):
                t2 = t + q[k, c]
                if t2 <= budget:
                    val = b + cost[k, c]
                    if val < nxt[t2]:
                        nxt[t2] = val
                        arg[k, t2] = c
        best[:] = nxt
    return best, arg


@njit(cache=True)
def backtrack(q, arg, t):
    K = arg.shape[0]
    choice = np.empty(K, np.int64)
    for k in range(K - 1, -1, -1):
        c = arg[k, t]
        choice[k] = c
        t -= q[k, c]
    return choice
