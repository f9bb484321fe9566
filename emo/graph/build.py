"""Build the execution graph from a normalised event table (see emo.trace.schema).

Nodes: GPU kernels, memcpy/memset, NCCL collectives, top-level CUDA runtime calls, the CPU
intervals between consecutive runtime calls on a thread (fixed duration: the GPU clock does not
change them), and for blocking calls a `sync` node for the part of the call after the GPU work it
waited for. Edges: every happens-before the trace implies (see EDGE_KINDS):

- program:    consecutive host nodes on one thread;
- launch:     start of the runtime call -> the kernel/copy it put on a stream (from_start);
- stream:     consecutive GPU ops on one stream;
- event:      last op before cudaEventRecord on the recorded stream -> first op after the
              cudaStreamWaitEvent on the waiting stream (matched by wait_on_cuda_event_record_corr_id);
- sync:       the GPU op a stream/event/device synchronise (or a synchronous memcpy) waited for ->
              the `sync` node that ends the blocking call;
- collective: the n-th collective of a communicator on every rank is one rendezvous: each rank's
              arrival (`coll_wait`, where its kernel started) -> `rendezvous` -> each rank's transfer
              (`collective`, from the last arrival to its kernel's end). The wait of early ranks is
              thus attributed to whatever made the last rank late.

Everything is vectorised over numpy columns of the event table (sorted as-of look-ups, joins by
sorted keys), no loop over events and few pandas calls (their fixed cost is most of a small trace's time)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from emo.graph.graph import NODE_COLUMNS, Graph
from emo.graph.tables import codes, first_of, group_numbers, merge, new_group, take
from emo.trace.kineto import no_gc
from emo.trace.read import rank_ranges as _ranges
from emo.trace.schema import GPU_OP_KINDS, NCCL_PREFIX, arrow_text, text_at, text_column

# Calls that return only once their copy is done, whatever stream they use.
SYNC_COPY_CALLS = frozenset(
    {
        "cudaMemcpy",
        "cudaMemset",
        "cudaMemcpy2D",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cuMemcpyHtoD",
        "cuMemcpyDtoH",
        "cuMemcpy",
    }
)


class _Builder:
    def __init__(self, events: pd.DataFrame):
        self.ev = events.reset_index(drop=True)
        n = len(self.ev)
        self.in_node = np.full(n, -1, np.int64)  # node an incoming edge of this event attaches to
        self.out_node = np.full(n, -1, np.int64)  # node an outgoing edge leaves from
        self.nodes: list[tuple[int, dict]] = []  # (rows, columns): one frame is built at the end
        self.edges: list[tuple] = []  # (src, dst, kind, from_start)
        self.n_nodes = 0
        self.meta: dict = {"warnings": list(events.attrs.get("warnings", []))}  # what the readers were unsure of
        self._cols: dict = {}

    def col(self, c: str) -> np.ndarray:
        """An event-table column as numpy (taken once)."""
        v = self._cols.get(c)
        if v is None:
            v = self._cols[c] = self.ev[c].to_numpy()
        return v

    def kind_is(self, *kinds: str) -> np.ndarray:
        """Whether each event is of one of `kinds`."""
        v = self._cols.get(kinds)
        if v is None:
            v = self._cols[kinds] = text_at(self.ev["kind"], isin=kinds)
        return v

    def add_nodes(self, **cols) -> np.ndarray:
        n = max((len(v) for v in cols.values() if not isinstance(v, (str, int))), default=0)
        ids = np.arange(self.n_nodes, self.n_nodes + n, dtype=np.int64)
        self.n_nodes += n
        self.nodes.append((n, cols))
        return ids

    def add_edges(self, src, dst, kind: str, from_start: bool = False) -> None:
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        ok = (src >= 0) & (dst >= 0) & (src != dst)
        self.edges.append((src[ok], dst[ok], kind, from_start))

    # ------------------------------------------------------------------ GPU side
    def gpu_ops(self) -> None:
        ev = self.ev
        rows = np.flatnonzero(self.kind_is(*GPU_OP_KINDS))
        nccl = text_at(ev["name"], rows, startswith=NCCL_PREFIX) & self.kind_is("kernel")[rows]
        split = self._collectives(rows[nccl]) if nccl.any() else np.zeros(len(ev), bool)
        kinds = pc.if_else(pa.array(nccl), "collective", arrow_text(ev["kind"]).take(pa.array(rows)))
        whole = ~split[rows]
        at = rows[whole]
        ids = self.add_nodes(
            kind=kinds.filter(pa.array(whole)),
            rank=self.col("rank")[at],
            device=self.col("device")[at],
            stream=self.col("stream")[at],
            thread=-1,
            start_ns=self.col("start_ns")[at],
            dur_ns=self.col("dur_ns")[at],
            name=ev["name"].array[at],
            event=at,
        )
        self.in_node[at] = ids
        self.out_node[at] = ids
        if nccl.any():
            self._collective_nodes(self._matched)

        # same-stream order
        rk, dv, st = (self.col(c)[rows] for c in ("rank", "device", "stream"))
        o = np.lexsort((self.col("start_ns")[rows], st, dv, rk))
        same = (rk[o][1:] == rk[o][:-1]) & (dv[o][1:] == dv[o][:-1]) & (st[o][1:] == st[o][:-1])
        r = rows[o]
        self.add_edges(self.out_node[r[:-1][same]], self.in_node[r[1:][same]], "stream")

    def _collectives(self, rows: np.ndarray) -> np.ndarray:
        """Match the NCCL kernels (event `rows`) of all ranks into collectives: the n-th kernel of
        a communicator (its process group, else its name) on each rank is one instance. The rows
        split that way (wait + transfer; the others become one node each)."""
        ev = self.ev
        pg = text_at(ev["process_group"], rows)
        key = np.where(pg != "", pg, text_at(ev["name"], rows))
        keys, kc = np.unique(key.astype(str), return_inverse=True)  # (sorted, as groupby sorts)
        kc = kc.ravel()
        rank = self.col("rank")[rows].astype(np.int64)
        start = self.col("start_ns")[rows]
        c = {"row": rows, "rank": rank, "kc": kc, "start": start, "end": start + self.col("dur_ns")[rows]}
        o = np.lexsort((kc, rank))  # (stable: table order within a rank and key)
        new = new_group(rank[o], kc[o])
        pos = np.arange(len(o))
        occ = np.empty(len(o), np.int64)
        occ[o] = pos - np.maximum.accumulate(np.where(new, pos, 0))
        c["occ"] = occ
        inst = codes(kc, occ)
        nranks = np.bincount(inst[first_of(inst, rank)], minlength=inst.max() + 1)[inst]
        named = pg != ""
        listed = text_at(ev["group_ranks"], rows) if "group_ranks" in ev else np.full(len(rows), "")
        world = int(self.col("world_size").max()) if "world_size" in ev and len(ev) else -1
        present = set(np.unique(self.col("rank")).tolist())
        expected, absent = _participants(kc, rank, named, listed, world, present)
        ok = (nranks == expected) & (expected > 1) & (absent == "")
        self._matched = take(c, ok)
        self._matched["key"] = keys[kc[ok]]
        self.meta["collectives_unmatched"] = _unmatched(keys, take(c, ~ok), absent[~ok], expected[~ok], world)
        self.meta["collectives"] = int(inst.max()) + 1
        split = np.zeros(len(ev), bool)
        split[rows[ok]] = True
        return split

    def _collective_nodes(self, m: dict) -> None:
        """One rendezvous per matched collective instance; each rank's kernel becomes its wait and
        its transfer."""
        inst = group_numbers(m["kc"], m["occ"])  # instances numbered in order of their first kernel
        first = first_of(m["kc"], m["occ"])
        arrive_of = np.full(len(first), np.iinfo(np.int64).min)
        np.maximum.at(arrive_of, inst, m["start"])
        rv = self.add_nodes(
            kind="rendezvous",
            rank=-1,
            device=-1,
            stream=-1,
            thread=-1,
            start_ns=arrive_of,
            dur_ns=0,
            name=m["key"][first],
            event=-1,
        )
        rows = m["row"]
        common = {
            "rank": self.col("rank")[rows],
            "device": self.col("device")[rows],
            "stream": self.col("stream")[rows],
            "thread": -1,
            "name": self.ev["name"].array[rows],
            "event": rows,
        }
        arrive = arrive_of[inst]
        waits = self.add_nodes(kind="coll_wait", start_ns=m["start"], dur_ns=0, **common)
        xfer = self.add_nodes(kind="collective", start_ns=arrive, dur_ns=np.maximum(m["end"] - arrive, 0), **common)
        self.in_node[rows] = waits
        self.out_node[rows] = xfer
        self.add_edges(waits, rv[inst], "collective")
        self.add_edges(rv[inst], xfer, "collective")
        self.meta["collectives_matched"] = len(first)

    # ------------------------------------------------------------------ host side
    def host_calls(self) -> None:
        rt_rows = np.flatnonzero(self.kind_is("runtime"))
        rank, pid, thread, start, dur = (self.col(c)[rt_rows] for c in ("rank", "pid", "thread", "start_ns", "dur_ns"))
        order = np.lexsort((-dur, start, thread, pid, rank))
        rows = rt_rows[order]
        rank, pid, thread, start = rank[order], pid[order], thread[order], start[order]
        end = start + dur[order]
        first = new_group(rank, pid, thread)
        grp = np.cumsum(first) - 1
        cummax_end = np.empty_like(end)
        heads = np.r_[np.flatnonzero(first), len(end)]
        for a, b in itertools.pairwise(heads):  # (one slice per thread)
            cummax_end[a:b] = np.maximum.accumulate(end[a:b])
        prev_max = np.r_[0, cummax_end[:-1]]
        top = first | (start >= prev_max)  # a call starting inside an earlier one is nested in it
        top_pos = np.cumsum(top) - 1
        top_rows = rows[top]
        self.top_of = np.full(len(self.ev), -1, np.int64)
        self.top_of[rows] = top_rows[top_pos]
        tgrp = grp[top]
        tstart, tend = start[top], end[top]
        name = self.ev["name"].array[top_rows]
        ids = self.add_nodes(
            kind="runtime",
            rank=rank[top],
            device=-1,
            stream=-1,
            thread=thread[top],
            start_ns=tstart,
            dur_ns=tend - tstart,
            name=name,
            event=top_rows,
        )
        self.call_node = np.full(len(self.ev), -1, np.int64)
        self.call_node[rows] = ids[top_pos]
        self.in_node[rows] = ids[top_pos]
        self.out_node[rows] = ids[top_pos]
        self.top = {
            "row": top_rows,
            "grp": tgrp,
            "start": tstart,
            "end": tend,
            "node": ids,
            "rank": rank[top],
            "pid": pid[top],
            "thread": thread[top],
            "name": name,
        }

    def launches(self) -> None:
        """launch edges, and the table of GPU ops with the time their launch call started."""
        rank, corr, start, device, stream, pid, thread = (
            self.col(c).astype(np.int64, copy=False)
            for c in ("rank", "correlation", "start_ns", "device", "stream", "pid", "thread")
        )
        rt = np.flatnonzero(self.kind_is("runtime") & (corr >= 0))
        ops = np.flatnonzero(self.kind_is(*GPU_OP_KINDS))
        # a launch is a call with GPU work of the same (rank, correlation); prefer the outermost
        # call, i.e. the first in table order (ranks < 2^23, correlation ids < 2^40)
        keys, first = np.unique(rank[rt] * (1 << 40) + corr[rt], return_index=True)
        key_op = rank[ops] * (1 << 40) + corr[ops]
        pos = np.minimum(np.searchsorted(keys, key_op), max(len(keys) - 1, 0))
        has = (keys[pos] == key_op) & (corr[ops] >= 0) if len(keys) else np.zeros(len(ops), bool)
        call_row = np.full(len(ops), -1, np.int64)
        call_row[has] = rt[first[pos[has]]]
        self.add_edges(self.call_node[call_row[has]], self.in_node[ops[has]], "launch", from_start=True)
        at = np.maximum(call_row, 0)
        t = np.where(has, start[at], start[ops])
        o = np.argsort(t, kind="stable")
        self.ops = {
            "rank": rank[ops][o],
            "device": device[ops][o],
            "stream": stream[ops][o],
            "t": t[o],
            "row": ops[o],
            "call_row": call_row[o],
            "pid": np.where(has, pid[at], -1)[o],
            "thread": np.where(has, thread[at], -1)[o],
            "correlation": corr[ops][o],
        }

    def _nearest_op(self, q: dict, forward: bool = False) -> dict:
        """For queries {rank, device, stream, t, ...}: those with an op on that stream launched
        strictly before t (forward: after), in order of t, with the op's row as `op_row`."""
        q = take(q, np.argsort(q["t"], kind="stable"))
        ops = self.ops
        j = _asof(
            [q["rank"], q["device"], q["stream"]],
            q["t"],
            [ops["rank"], ops["device"], ops["stream"]],
            ops["t"],
            forward,
        )
        hit = j >= 0
        out = take(q, hit)
        out["op_row"] = ops["row"][j[hit]]
        return out

    def syncs(self) -> dict:
        """(blocked top-level call row, GPU op row it waited for) pairs, and GPU->GPU event edges."""
        rank, corr, start, device, stream = (
            self.col(c).astype(np.int64, copy=False) for c in ("rank", "correlation", "start_ns", "device", "stream")
        )
        calls = np.flatnonzero(self.kind_is("runtime"))
        calls = calls[corr[calls] >= 0]
        key = rank * (1 << 40) + corr  # (as in launches)
        _, first = np.unique(key[calls], return_index=True)
        calls = calls[np.sort(first)]  # the first call of each (rank, correlation)
        ckeys, cpos = np.unique(key[calls], return_index=True)
        ops = self.ops
        waits: list[dict] = []  # (call_row, op_row) pairs
        streams = take(ops, first_of(ops["rank"], ops["device"], ops["stream"]))
        streams = {c: streams[c] for c in ("rank", "device", "stream")}

        s, sk = self._sync_rows(rank, device, stream, start, key, ckeys, calls[cpos])
        if len(s["call_row"]):
            waits += self._recorded_waits(s, sk, streams, ckeys, calls[cpos], start)
        waits += self._bare_waits(s["call_row"], streams)
        waits.append(self._copy_waits())
        call = np.concatenate([w["call_row"] for w in waits]).astype(np.int64)
        op = np.concatenate([w["op_row"] for w in waits]).astype(np.int64)
        call = self.top_of[call]
        keep = first_of(call, op)
        return {"call_row": call[keep], "op_row": op[keep]}

    def _sync_rows(self, rank, device, stream, start, key, ckeys, call_of_key) -> tuple[dict, np.ndarray]:
        """The sync rows with their call (of the same rank and correlation: `ckeys`, each call's key,
        and `call_of_key`, its row), and each one's sync kind."""
        srows = np.flatnonzero(self.kind_is("sync"))
        if len(srows):
            if len(ckeys):
                at = np.minimum(np.searchsorted(ckeys, key[srows]), len(ckeys) - 1)
                found = ckeys[at] == key[srows]
                srows = srows[found]
                call_row = call_of_key[at[found]]
            else:
                srows = srows[np.zeros(len(srows), bool)]
                call_row = np.zeros(0, np.int64)
            s = {
                "rank": rank[srows],
                "device": device[srows],
                "stream": stream[srows],
                "call_row": call_row,
                "call_t": start[call_row],
                "wait_event_corr": self.col("wait_event_corr")[srows].astype(np.int64),
                "wait_stream": self.col("wait_stream")[srows].astype(np.int64),
            }
            sk = text_at(self.ev["sync_kind"], srows)
        else:
            s, sk = {"call_row": np.zeros(0, np.int64)}, np.zeros(0, object)
        return s, sk

    def _recorded_waits(self, s: dict, sk: np.ndarray, streams: dict, ckeys, rec_rows, start) -> list[dict]:
        """The (call_row, op_row) waits of the sync rows by kind: a stream's or the context's last ops
        before the call, an event sync's recorded op; a stream wait event adds its GPU->GPU edge."""
        waits: list[dict] = []
        ss = take(s, sk == "Stream Sync")
        waits.append(
            self._nearest_op(
                {
                    "rank": ss["rank"],
                    "device": ss["device"],
                    "stream": ss["stream"],
                    "t": ss["call_t"],
                    "call_row": ss["call_row"],
                }
            )
        )
        cs = take(s, sk == "Context Sync")
        waits.append(
            self._nearest_op(
                merge(
                    {"rank": cs["rank"], "device": cs["device"], "t": cs["call_t"], "call_row": cs["call_row"]},
                    streams,
                    ["rank", "device"],
                )
            )
        )
        # event record -> waiter: find the record call, then the last op on the recorded stream before it
        es = self._with_record(take(s, (sk == "Event Sync") & (s["wait_stream"] >= 0)), ckeys, rec_rows, start)
        waits.append(
            self._nearest_op(
                {
                    "rank": es["rank"],
                    "device": es["device"],
                    "stream": es["wait_stream"],
                    "t": es["rec_t"],
                    "call_row": es["call_row"],
                }
            )
        )
        sw = self._with_record(take(s, (sk == "Stream Wait Event") & (s["wait_stream"] >= 0)), ckeys, rec_rows, start)
        if len(sw["rank"]):
            keys = np.arange(len(sw["rank"]))
            src = self._nearest_op(
                {
                    "rank": sw["rank"],
                    "device": sw["device"],
                    "stream": sw["wait_stream"],
                    "t": sw["rec_t"],
                    "key": keys,
                }
            )
            dst = self._nearest_op(
                {
                    "rank": sw["rank"],
                    "device": sw["device"],
                    "stream": sw["stream"],
                    "t": sw["call_t"],
                    "key": keys,
                },
                forward=True,
            )
            dst_of = np.full(len(keys), -1, np.int64)  # keys are unique in both: a look-up, not a merge
            dst_of[dst["key"]] = dst["op_row"]
            hit = dst_of[src["key"]] >= 0
            self.add_edges(self.out_node[src["op_row"][hit]], self.in_node[dst_of[src["key"]][hit]], "event")

        return waits

    def _bare_waits(self, recorded: np.ndarray, streams: dict) -> list[dict]:
        """Synchronising calls the trace has no cuda_sync row for (older traces, DLRM): a device
        sync waits for every stream's last op, a stream sync for the stream its thread last launched
        on; a bare cudaStreamWaitEvent adds its inferred edge."""
        ops = self.ops
        waits: list[dict] = []
        top = self.top
        bare = ~np.isin(top["row"], recorded)
        name = text_at(top["name"])
        self._inferred_stream_waits(take(top, bare & (name == "cudaStreamWaitEvent")))
        ds = take(top, bare & np.isin(name, ["cudaDeviceSynchronize", "cudaCtxSynchronize", "cuCtxSynchronize"]))
        if len(ds["row"]):
            waits.append(
                self._nearest_op(
                    merge({"rank": ds["rank"], "t": ds["start"], "call_row": ds["row"]}, streams, ["rank"])
                )
            )
        st = take(top, bare & np.isin(name, ["cudaStreamSynchronize", "cuStreamSynchronize"]))
        if len(st["row"]):  # the stream is the one this thread last launched on
            q = take(
                {"rank": st["rank"], "pid": st["pid"], "thread": st["thread"], "t": st["start"], "call_row": st["row"]},
                np.argsort(st["start"], kind="quicksort"),
            )
            launched = take(ops, ops["call_row"] >= 0)
            j = _asof(
                [q["rank"], q["pid"], q["thread"]],
                q["t"],
                [launched["rank"], launched["pid"], launched["thread"]],
                launched["t"],
            )
            hit = j >= 0
            waits.append(
                self._nearest_op(
                    {
                        "rank": q["rank"][hit],
                        "device": launched["device"][j[hit]],
                        "stream": launched["stream"][j[hit]],
                        "t": q["t"][hit],
                        "call_row": q["call_row"][hit],
                    }
                )
            )
        return waits

    def _copy_waits(self) -> dict:
        """Synchronous copies out of the device: their call waits for the copy."""
        ops = self.ops
        cp = take(ops, ops["call_row"] >= 0)
        # a synchronous copy from pageable host memory returns once the data is staged, before the
        # DMA ends (CUDA API sync behaviour), so only copies out of the device are waited for
        names = self.ev["name"]
        sc = take(cp, text_at(names, cp["call_row"], SYNC_COPY_CALLS))
        sc = take(sc, ~text_at(names, sc["row"], contains="HtoD"))
        return {"call_row": sc["call_row"], "op_row": sc["row"]}

    @staticmethod
    def _with_record(rows: dict, rec_keys: np.ndarray, rec_rows: np.ndarray, start: np.ndarray) -> dict:
        """Each waiting sync row with `rec_t`, when its cudaEventRecord was called: found by
        wait_on_cuda_event_record_corr_id where the trace has it; otherwise the closest preceding
        record on the waited stream is taken to be right before the wait call itself."""
        known = rows["wait_event_corr"] >= 0
        rec_t = rows["call_t"].copy()
        k = rows["rank"][known] * (1 << 40) + rows["wait_event_corr"][known]
        if len(rec_keys) and len(k):
            at = np.minimum(np.searchsorted(rec_keys, k), len(rec_keys) - 1)
            found = rec_keys[at] == k
            rec_t[np.flatnonzero(known)[found]] = start[rec_rows[at[found]]]
        o = np.r_[np.flatnonzero(known), np.flatnonzero(~known)]  # the known ones first
        out = take(rows, o)
        out["rec_t"] = rec_t[o]
        return out

    def _inferred_stream_waits(self, calls: dict) -> None:
        """cudaStreamWaitEvent without a cuda_sync row (no record correlation in the trace): the
        waiting stream is the one this thread launches on next, the waited stream the one it last
        launched on before that differs from it (PyTorch's pattern around NCCL work), and the record
        is taken to be the closest preceding one, i.e. the last op launched there before the call."""
        if not len(calls["row"]):
            return
        ops = self.ops
        launched = take(ops, ops["call_row"] >= 0)
        by = ("rank", "pid", "thread")
        q = take(
            {
                "rank": calls["rank"],
                "pid": calls["pid"],
                "thread": calls["thread"],
                "t": calls["start"],
                "key": np.arange(len(calls["row"])),
            },
            np.argsort(calls["start"], kind="quicksort"),
        )
        j = _asof([q[c] for c in by], q["t"], [launched[c] for c in by], launched["t"], forward=True)
        hit = j >= 0
        nxt = take(q, hit)
        nxt.update(waiting=launched["stream"][j[hit]], row=launched["row"][j[hit]])
        streams = take(launched, first_of(*(launched[c] for c in (*by, "device", "stream"))))
        cand = merge(
            {c: nxt[c] for c in (*by, "t", "key", "waiting")},
            {c: streams[c] for c in (*by, "device", "stream")},
            list(by),
        )
        cand = take(cand, cand["stream"] != cand["waiting"])
        cand = take(cand, np.argsort(cand["t"], kind="stable"))
        if not len(cand["t"]):
            return
        lo = np.argsort(launched["t"], kind="quicksort")
        lt = take(launched, lo)
        by5 = (*by, "device", "stream")
        j = _asof([cand[c] for c in by5], cand["t"], [lt[c] for c in by5], lt["t"])
        hit = j >= 0
        prev_key, prev_row, t_op = cand["key"][hit], lt["row"][j[hit]], lt["t"][j[hit]]
        o = np.argsort(t_op, kind="quicksort")
        prev_key, prev_row = prev_key[o], prev_row[o]
        last = np.unique(prev_key[::-1], return_index=True)[1]  # keep the last of each key
        keep = np.sort(len(prev_key) - 1 - last)
        prev_key, prev_row = prev_key[keep], prev_row[keep]
        dst_of = np.full(len(calls["row"]), -1, np.int64)  # keys are unique in both: a look-up, not a merge
        dst_of[nxt["key"]] = nxt["row"]
        hit = dst_of[prev_key] >= 0
        row_src, row_dst = prev_row[hit], dst_of[prev_key][hit]
        # a guessed dependency the recorded timeline contradicts is not one: keep only consistent ones
        start = self.col("start_ns")
        ok = start[row_src] + self.col("dur_ns")[row_src] <= start[row_dst]
        self.meta["stream_waits_rejected"] = int((~ok).sum())
        self.add_edges(self.out_node[row_src[ok]], self.in_node[row_dst[ok]], "event")
        self.meta["inferred_stream_waits"] = int(ok.sum())

    def program_order(self, waits: dict) -> None:
        """Split blocking calls, add CPU-interval nodes and chain each thread's host nodes."""
        top = self.top
        # the GPU finish each blocked call waited for (recorded), to place its sync node
        fin = (self.col("start_ns") + self.col("dur_ns"))[waits["op_row"]]
        calls, inv = np.unique(waits["call_row"], return_inverse=True)
        latest = np.full(len(calls), np.iinfo(np.int64).min)
        np.maximum.at(latest, inv, fin)
        b = np.isin(top["row"], calls)
        blocked = take(top, b)
        ready = np.clip(latest[np.searchsorted(calls, blocked["row"])], blocked["start"], blocked["end"])
        sync_ids = self.add_nodes(
            kind="sync",
            rank=blocked["rank"],
            device=-1,
            stream=-1,
            thread=blocked["thread"],
            start_ns=ready,
            dur_ns=blocked["end"] - ready,
            name=blocked["name"],
            event=blocked["row"],
        )
        sync_of = np.full(len(self.ev), -1, np.int64)
        sync_of[blocked["row"]] = sync_ids
        self.out_node[blocked["row"]] = sync_ids
        # the call itself keeps only its entry: its remaining time depends on the GPU
        self.nodes_dur_zero = self.call_node[blocked["row"]]
        self.add_edges(self.out_node[waits["op_row"]], sync_of[waits["call_row"]], "sync")

        # CPU intervals: before each top-level call (from the previous call's end or the thread's
        # first host event) and after the thread's last call (to its last host event)
        lo, hi = self._thread_extents(top["row"])
        grp = top["grp"]
        first = np.r_[True, grp[1:] != grp[:-1]]
        last = np.r_[first[1:], True]
        prev_end = np.where(first, lo, np.r_[0, top["end"][:-1]])
        gap = top["start"] - prev_end
        g = gap > 0
        gap_ids = self.add_nodes(
            kind="cpu",
            rank=top["rank"][g],
            device=-1,
            stream=-1,
            thread=top["thread"][g],
            start_ns=prev_end[g],
            dur_ns=gap[g],
            name="cpu",
            event=-1,
        )
        tail = hi - top["end"]
        t = last & (tail > 0)
        tail_ids = self.add_nodes(
            kind="cpu",
            rank=top["rank"][t],
            device=-1,
            stream=-1,
            thread=top["thread"][t],
            start_ns=top["end"][t],
            dur_ns=tail[t],
            name="cpu",
            event=-1,
        )
        pos = np.arange(len(grp))
        rows = top["row"]
        slots = [
            (grp[g], 3 * pos[g], gap_ids),
            (grp, 3 * pos + 1, self.call_node[rows]),
            (grp[sync_of[rows] >= 0], 3 * pos[sync_of[rows] >= 0] + 2, sync_of[rows][sync_of[rows] >= 0]),
            (grp[t], 3 * pos[t] + 3, tail_ids),
        ]
        sg = np.concatenate([s[0] for s in slots])
        sk = np.concatenate([s[1] for s in slots])
        sn = np.concatenate([s[2] for s in slots])
        o = np.lexsort((sk, sg))
        sg, sn = sg[o], sn[o]
        same = sg[1:] == sg[:-1]
        self.add_edges(sn[:-1][same], sn[1:][same], "program")

    def _thread_extents(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For host event rows: the first start and last end of any host event on their thread."""
        ev = self.ev
        host = np.flatnonzero(ev["device"].to_numpy() < 0)
        rank, pid, thread = (ev[c].to_numpy(np.int64)[host] for c in ("rank", "pid", "thread"))
        start = ev["start_ns"].to_numpy(np.int64)[host]
        end = start + ev["dur_ns"].to_numpy(np.int64)[host]
        o = np.lexsort((thread, pid, rank))
        new = np.r_[
            True, (rank[o][1:] != rank[o][:-1]) | (pid[o][1:] != pid[o][:-1]) | (thread[o][1:] != thread[o][:-1])
        ][: len(o)]
        heads = np.flatnonzero(new)
        grp = np.full(len(ev), -1, np.int64)
        grp[host[o]] = np.cumsum(new) - 1
        g = grp[rows]
        if len(heads) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.minimum.reduceat(start[o], heads)[g], np.maximum.reduceat(end[o], heads)[g]

    def finish(self) -> Graph:
        cols = {}
        for c, t in NODE_COLUMNS.items():
            if t == "str":
                cols[c] = _str_column([(n, v[c]) for n, v in self.nodes])
                continue
            parts = [np.broadcast_to(np.asarray(v[c]), (n,)) for n, v in self.nodes]
            cols[c] = np.concatenate(parts) if parts else np.array([], dtype=t)
        cols["dur_ns"] = cols["dur_ns"].astype(np.int64)
        if len(self.nodes_dur_zero):
            cols["dur_ns"][self.nodes_dur_zero] = 0
        nodes = pd.DataFrame({c: cols[c] if t == "str" else cols[c].astype(t) for c, t in NODE_COLUMNS.items()})
        src = np.concatenate([e[0] for e in self.edges] or [np.array([], np.int64)])
        dst = np.concatenate([e[1] for e in self.edges] or [np.array([], np.int64)])
        kinds = list(dict.fromkeys(e[2] for e in self.edges))
        kind = np.concatenate(
            [np.full(len(e[0]), kinds.index(e[2]), np.int32) for e in self.edges] or [np.array([], np.int32)]
        )
        fs = np.concatenate([np.full(len(e[0]), e[3], dtype=bool) for e in self.edges] or [np.array([], bool)])
        # the first of each (src, dst, from_start), in the order added
        first = np.sort(np.unique((src * (2 * self.n_nodes + 2) + dst * 2 + fs), return_index=True)[1])
        edges = pd.DataFrame(
            {"src": src[first], "dst": dst[first], "kind": text_column(kind[first], kinds), "from_start": fs[first]}
        )
        self.meta["ranks"] = sorted(int(r) for r in self.ev["rank"].unique())
        return Graph(nodes, edges, self.meta)


def _str_column(parts: list[tuple[int, object]]) -> pd.Series:
    """A str column from parts of n rows each: one string for all n, or n strings (a str column's
    .array, or an array of str), joined as Arrow chunks (no Python object per row)."""
    chunks = []
    for n, v in parts:
        if isinstance(v, str):
            chunks.append(pa.repeat(pa.scalar(v, pa.large_string()), n))
        elif isinstance(v, (pa.Array, pa.ChunkedArray)):
            chunks.extend(
                pa.chunked_array([v]).cast(pa.large_string()).chunks
                if isinstance(v, pa.Array)
                else v.cast(pa.large_string()).chunks
            )
        elif hasattr(v, "__arrow_array__"):
            chunks.extend(v.__arrow_array__().cast(pa.large_string()).chunks)
        else:
            chunks.append(pa.array(np.asarray(v, dtype=object), pa.large_string()))
    return pd.Series(pa.chunked_array(chunks, pa.large_string()), dtype="str")


def _asof(lkeys: list, lt, rkeys: list, rt, forward: bool = False) -> np.ndarray:
    """For each left row: the index of the right row with equal keys and the closest t strictly
    before (forward: strictly after) its own, -1 if none; of right rows with equal t, the last
    (forward: the first) in right's order, as pd.merge_asof picks. One sort of both sides together."""
    n, m = len(lt), len(rt)
    if n == 0 or m == 0:
        return np.full(n, -1, np.int64)
    is_r = np.r_[np.zeros(n, bool), np.ones(m, bool)]
    t = np.r_[np.asarray(lt, np.int64), np.asarray(rt, np.int64)]
    keys = [np.r_[np.asarray(a, np.int64), np.asarray(b, np.int64)] for a, b in zip(lkeys, rkeys)]
    # at equal t a backward query sorts before the right rows (none is before it), a forward one after
    o = np.lexsort((np.arange(n + m), is_r != forward, t, *keys[::-1]))
    new = np.zeros(n + m, bool)
    new[0] = True
    for k in keys:
        new[1:] |= k[o][1:] != k[o][:-1]
    pos = np.arange(n + m)
    r_o = is_r[o]
    if forward:  # the next right row in sort order, if it is in the same key group
        nxt = np.minimum.accumulate(np.where(r_o, pos, n + m)[::-1])[::-1]
        group_end = np.r_[np.flatnonzero(new)[1:], n + m][np.cumsum(new) - 1]
        hit = np.where(nxt < group_end, nxt, -1)
    else:  # the previous right row, if it is in the same key group
        prv = np.maximum.accumulate(np.where(r_o, pos, -1))
        hit = np.where(prv >= np.maximum.accumulate(np.where(new, pos, 0)), prv, -1)
    out = np.full(n, -1, np.int64)
    h = hit[~r_o]
    out[o[~r_o]] = np.where(h >= 0, o[np.maximum(h, 0)] - n, -1)
    return out


def _participants(kc, rank, named, listed, world: int, present: set) -> tuple[np.ndarray, np.ndarray]:
    """Per collective kernel (key code `kc`, `rank`): how many ranks take part (-1: not known) and
    the members absent from the trace ("2-127"). The members are the ranks the trace names for the
    group; an unnamed group is the whole world (distributedInfo.world_size, else the ranks present);
    a named group whose members are not written spans the ranks that use it, if every rank is present."""
    n = len(kc)
    users = np.bincount(kc[first_of(kc, rank)], minlength=kc.max() + 1)[kc] if n else 0
    expected = np.where(named, users, len(present))
    absent = np.full(n, "", dtype=object)
    if world > 0:
        expected = np.where(named, expected if world <= len(present) else -1, world)
        absent[~named] = _ranges(sorted(set(range(world)) - present))
    for text in set(listed.tolist()) - {""}:
        members = {int(r) for r in text.split(",")}
        at = listed == text
        expected[at] = len(members)
        absent[at] = _ranges(sorted(members - present))
    return expected, absent


def _unmatched(keys: np.ndarray, c: dict, absent: np.ndarray, expected: np.ndarray, world: int) -> list[dict]:
    """Why the collectives not matched across ranks are not: one entry per group and reason, in
    order of (key, absent, expected)."""
    out: list[dict] = []
    if not len(absent):
        return out
    ac = np.unique(absent.astype(str), return_inverse=True)[1].ravel()
    o = np.lexsort((expected, ac, c["kc"]))
    heads = np.flatnonzero(new_group(c["kc"][o], ac[o], expected[o]))
    for a, b in zip(heads, np.r_[heads[1:], len(o)]):
        x = o[a:b]
        ab, ex = absent[x[0]], int(expected[x[0]])
        if ab:
            why = f"ranks {ab} are absent from the trace"
        elif ex < 0:
            why = (
                f"the trace does not name the group's members and holds {len(np.unique(c['rank'][x]))} of {world} ranks"
            )
        elif ex <= 1:
            why = "only one rank takes part"
        else:
            why = "not every member's kernel is in the trace"
        out.append({"group": str(keys[c["kc"][x[0]]])[:80], "instances": len(np.unique(c["occ"][x])), "why": why})
    return out


def build_graph(events: pd.DataFrame) -> Graph:
    """Execution graph (nodes + happens-before edges) of a normalised event table."""
    with no_gc():  # its temporaries hold no cycles; a full collection here cost more than the build
        b = _Builder(events)
        b.gpu_ops()
        b.host_calls()
        b.launches()
        waits = b.syncs()
        b.program_order(waits)
        return b.finish()
