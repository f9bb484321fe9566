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

Everything is vectorised over the event table (sorted as-of look-ups, groupby), no loop over events."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from emo.graph.graph import NODE_COLUMNS, Graph
from emo.trace.kineto import no_gc
from emo.trace.schema import GPU_OP_KINDS, is_nccl, text_column

# Calls that return only once their copy is done, whatever stream they use.
SYNC_COPY_CALLS = frozenset({"cudaMemcpy", "cudaMemset", "cudaMemcpy2D", "cudaMemcpyToSymbol",
                             "cudaMemcpyFromSymbol", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpy"})


class _Builder:
    def __init__(self, events: pd.DataFrame):
        self.ev = events.reset_index(drop=True)
        n = len(self.ev)
        self.in_node = np.full(n, -1, np.int64)   # node an incoming edge of this event attaches to
        self.out_node = np.full(n, -1, np.int64)  # node an outgoing edge leaves from
        self.nodes: list[tuple[int, dict]] = []  # (rows, columns): one frame is built at the end
        self.edges: list[tuple] = []  # (src, dst, kind, from_start)
        self.n_nodes = 0
        self.meta: dict = {}

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
        rows = np.flatnonzero(ev["kind"].isin(GPU_OP_KINDS).to_numpy())
        g = ev.iloc[rows]
        nccl = is_nccl(g["name"]) & (g["kind"] == "kernel").to_numpy()
        key = np.where(g["process_group"].to_numpy(dtype=object) != "", g["process_group"], g["name"])
        c = pd.DataFrame({"row": rows, "rank": g["rank"].to_numpy(), "key": key,
                          "start": g["start_ns"].to_numpy(), "end": (g["start_ns"] + g["dur_ns"]).to_numpy()})[nccl]
        c = c.reset_index(drop=True)
        c["occ"] = c.groupby(["rank", "key"]).cumcount()
        c["nranks"] = c.groupby(["key", "occ"])["rank"].transform("nunique")
        named = g["process_group"].to_numpy(dtype=object)[nccl] != ""
        listed = g["group_ranks"].to_numpy(dtype=object)[nccl] if "group_ranks" in g else np.full(len(c), "")
        world = int(ev["world_size"].max()) if "world_size" in ev and len(ev) else -1
        c["expected"], c["absent"] = _participants(c, named, listed, world, set(ev["rank"].unique().tolist()))
        ok = (c["nranks"] == c["expected"]) & (c["expected"] > 1) & (c["absent"] == "")
        matched = c[ok].copy()
        self.meta["collectives_unmatched"] = _unmatched(c[~ok], world)
        split = np.zeros(len(ev), bool)
        split[matched["row"].to_numpy()] = True

        kinds = np.where(nccl, "collective", g["kind"].to_numpy(dtype=object))
        whole = ~split[rows]
        w = g[whole]
        ids = self.add_nodes(kind=kinds[whole], rank=w["rank"].to_numpy(), device=w["device"].to_numpy(),
                             stream=w["stream"].to_numpy(), thread=-1, start_ns=w["start_ns"].to_numpy(),
                             dur_ns=w["dur_ns"].to_numpy(), name=w["name"].array, event=rows[whole])
        self.in_node[rows[whole]] = ids
        self.out_node[rows[whole]] = ids

        inst = matched.groupby(["key", "occ"], sort=False)
        matched["arrive"] = inst["start"].transform("max")
        matched["inst"] = inst.ngroup()
        first = matched.drop_duplicates("inst").sort_values("inst")
        rv = self.add_nodes(kind="rendezvous", rank=-1, device=-1, stream=-1, thread=-1,
                            start_ns=first["arrive"].to_numpy(), dur_ns=0,
                            name=first["key"].astype(str).to_numpy(), event=-1)
        m = ev.iloc[matched["row"].to_numpy()]
        common = dict(rank=m["rank"].to_numpy(), device=m["device"].to_numpy(), stream=m["stream"].to_numpy(),
                      thread=-1, name=m["name"].array, event=matched["row"].to_numpy())
        arrive = matched["arrive"].to_numpy()
        waits = self.add_nodes(kind="coll_wait", start_ns=matched["start"].to_numpy(), dur_ns=0, **common)
        xfer = self.add_nodes(kind="collective", start_ns=arrive,
                              dur_ns=np.maximum(matched["end"].to_numpy() - arrive, 0), **common)
        self.in_node[matched["row"].to_numpy()] = waits
        self.out_node[matched["row"].to_numpy()] = xfer
        self.add_edges(waits, rv[matched["inst"].to_numpy()], "collective")
        self.add_edges(rv[matched["inst"].to_numpy()], xfer, "collective")
        self.meta["collectives"] = int(c.groupby(["key", "occ"]).ngroups) if len(c) else 0
        self.meta["collectives_matched"] = int(len(first))
        self.collectives = matched

        # same-stream order
        rk, dv, st = (g[c].to_numpy() for c in ("rank", "device", "stream"))
        o = np.lexsort((g["start_ns"].to_numpy(), st, dv, rk))
        same = (rk[o][1:] == rk[o][:-1]) & (dv[o][1:] == dv[o][:-1]) & (st[o][1:] == st[o][:-1])
        r = rows[o]
        self.add_edges(self.out_node[r[:-1][same]], self.in_node[r[1:][same]], "stream")

    # ------------------------------------------------------------------ host side
    def host_calls(self) -> None:
        ev = self.ev
        rt_rows = np.flatnonzero((ev["kind"] == "runtime").to_numpy())
        cols = ["rank", "pid", "thread", "start_ns", "dur_ns"]
        rt = ev[cols].iloc[rt_rows]
        order = np.lexsort((-rt["dur_ns"].to_numpy(), rt["start_ns"].to_numpy(), rt["thread"].to_numpy(),
                            rt["pid"].to_numpy(), rt["rank"].to_numpy()))
        rows = rt_rows[order]
        rt = rt.iloc[order]
        grp = rt.groupby(["rank", "pid", "thread"], sort=False).ngroup().to_numpy()
        start = rt["start_ns"].to_numpy()
        end = start + rt["dur_ns"].to_numpy()
        first = np.r_[True, grp[1:] != grp[:-1]]
        cummax_end = pd.Series(end).groupby(grp).cummax().to_numpy()
        prev_max = np.r_[0, cummax_end[:-1]]
        top = first | (start >= prev_max)  # a call starting inside an earlier one is nested in it
        top_pos = np.cumsum(top) - 1
        top_rows = rows[top]
        self.top_of = np.full(len(ev), -1, np.int64)
        self.top_of[rows] = top_rows[top_pos]
        t = ev.iloc[top_rows]
        tgrp = grp[top]
        tstart, tend = start[top], end[top]
        ids = self.add_nodes(kind="runtime", rank=t["rank"].to_numpy(), device=-1, stream=-1,
                             thread=t["thread"].to_numpy(), start_ns=tstart, dur_ns=tend - tstart,
                             name=t["name"].array, event=top_rows)
        self.call_node = np.full(len(ev), -1, np.int64)
        self.call_node[rows] = ids[top_pos]
        self.in_node[rows] = ids[top_pos]
        self.out_node[rows] = ids[top_pos]
        self.top = pd.DataFrame({"row": top_rows, "grp": tgrp, "start": tstart, "end": tend, "node": ids,
                                 "rank": t["rank"].to_numpy(), "pid": t["pid"].to_numpy(),
                                 "thread": t["thread"].to_numpy(), "name": t["name"].array})

    def launches(self) -> None:
        """launch edges, and the table of GPU ops with the time their launch call started."""
        ev = self.ev
        rank, corr, start, device, stream, pid, thread = (ev[c].to_numpy(np.int64) for c in (
            "rank", "correlation", "start_ns", "device", "stream", "pid", "thread"))
        rt = np.flatnonzero(((ev["kind"] == "runtime") & (ev["correlation"] >= 0)).to_numpy())
        ops = np.flatnonzero(ev["kind"].isin(GPU_OP_KINDS).to_numpy())
        # a launch is a call with GPU work of the same (rank, correlation); prefer the outermost
        # call, i.e. the first in table order (ranks < 2^23, correlation ids < 2^40)
        keys, first = np.unique(rank[rt] * (1 << 40) + corr[rt], return_index=True)
        key_op = rank[ops] * (1 << 40) + corr[ops]
        pos = np.minimum(np.searchsorted(keys, key_op), max(len(keys) - 1, 0))
        has = (keys[pos] == key_op) & (corr[ops] >= 0) if len(keys) else np.zeros(len(ops), bool)
        call_row = np.full(len(ops), -1, np.int64)
        call_row[has] = rt[first[pos[has]]]
        self.add_edges(self.call_node[call_row[has]], self.in_node[ops[has]], "launch", from_start=True)
        self.ops = pd.DataFrame({
            "rank": rank[ops], "device": device[ops], "stream": stream[ops],
            "t": np.where(has, start[np.maximum(call_row, 0)], start[ops]), "row": ops.astype(np.int64),
            "call_row": call_row, "pid": np.where(has, pid[np.maximum(call_row, 0)], -1),
            "thread": np.where(has, thread[np.maximum(call_row, 0)], -1), "correlation": corr[ops],
        }).sort_values("t", kind="stable").reset_index(drop=True)

    def _last_op_before(self, q: pd.DataFrame) -> pd.DataFrame:
        """For queries (rank, device, stream, t): the last op on that stream launched before t."""
        return self._nearest_op(q, "backward")

    def _first_op_after(self, q: pd.DataFrame) -> pd.DataFrame:
        """For queries (rank, device, stream, t): the first op on that stream launched after t."""
        return self._nearest_op(q, "forward")

    def _nearest_op(self, q: pd.DataFrame, direction: str) -> pd.DataFrame:
        q = q.astype({"rank": np.int64, "device": np.int64, "stream": np.int64, "t": np.int64})
        if q.empty:
            return q.assign(op_row=pd.Series(dtype=np.int64))
        q = q.sort_values("t", kind="stable")
        return _asof_join(q, self.ops[["rank", "device", "stream", "t", "row"]].rename(columns={"row": "op_row"}),
                          "t", "t", ["rank", "device", "stream"], direction == "forward")

    def syncs(self) -> pd.DataFrame:
        """(blocked top-level call row, GPU op row it waited for) pairs, and GPU->GPU event edges."""
        ev = self.ev
        calls = ev.loc[ev["kind"] == "runtime", ["rank", "correlation", "start_ns", "pid", "thread"]]
        call_by_corr = pd.DataFrame({"rank": calls["rank"].to_numpy(), "correlation": calls["correlation"].to_numpy(),
                                     "call_row": calls.index.to_numpy(), "call_t": calls["start_ns"].to_numpy(),
                                     "pid": calls["pid"].to_numpy(), "thread": calls["thread"].to_numpy()})
        call_by_corr = call_by_corr[call_by_corr["correlation"] >= 0].drop_duplicates(["rank", "correlation"])
        s = ev.loc[ev["kind"] == "sync", ["rank", "device", "stream", "correlation", "sync_kind", "wait_event_corr",
                                          "wait_stream"]]
        s = s.merge(call_by_corr, on=["rank", "correlation"], how="inner")
        waits = []
        streams = self.ops[["rank", "device", "stream"]].drop_duplicates()

        if len(s):  # (the pandas calls below cost the same on no rows: a small trace pays them)
            ss = s[s["sync_kind"] == "Stream Sync"]
            waits.append(self._last_op_before(pd.DataFrame({"rank": ss["rank"], "device": ss["device"],
                                                            "stream": ss["stream"], "t": ss["call_t"],
                                                            "call_row": ss["call_row"]})))
            cs = s[s["sync_kind"] == "Context Sync"]
            cq = pd.DataFrame({"rank": cs["rank"], "device": cs["device"], "t": cs["call_t"],
                               "call_row": cs["call_row"]})
            waits.append(self._last_op_before(cq.merge(streams, on=["rank", "device"])))

            # event record -> waiter: find the record call, then the last op on the recorded stream before it
            rec = call_by_corr.rename(columns={"correlation": "wait_event_corr", "call_t": "rec_t"})[
                ["rank", "wait_event_corr", "rec_t"]]
            es = self._with_record(s[(s["sync_kind"] == "Event Sync") & (s["wait_stream"] >= 0)], rec)
            waits.append(self._last_op_before(pd.DataFrame({"rank": es["rank"], "device": es["device"],
                                                            "stream": es["wait_stream"], "t": es["rec_t"],
                                                            "call_row": es["call_row"]})))
            sw = self._with_record(s[(s["sync_kind"] == "Stream Wait Event") & (s["wait_stream"] >= 0)], rec)
            if len(sw):
                src = self._last_op_before(pd.DataFrame({"rank": sw["rank"], "device": sw["device"],
                                                         "stream": sw["wait_stream"], "t": sw["rec_t"],
                                                         "key": np.arange(len(sw))}))
                dst = self._first_op_after(pd.DataFrame({"rank": sw["rank"], "device": sw["device"],
                                                         "stream": sw["stream"], "t": sw["call_t"],
                                                         "key": np.arange(len(sw))}))
                pair = src[["key", "op_row"]].merge(dst[["key", "op_row"]], on="key", suffixes=("_src", "_dst"))
                self.add_edges(self.out_node[pair["op_row_src"].to_numpy()],
                               self.in_node[pair["op_row_dst"].to_numpy()], "event")

        # synchronising calls the trace has no cuda_sync row for (older traces, DLRM)
        covered = set(s["call_row"].tolist())
        top = self.top
        bare = top[~top["row"].isin(covered)]
        self._inferred_stream_waits(bare[bare["name"] == "cudaStreamWaitEvent"])
        ds = bare[bare["name"].isin(["cudaDeviceSynchronize", "cudaCtxSynchronize", "cuCtxSynchronize"])]
        if len(ds):
            waits.append(self._last_op_before(
                pd.DataFrame({"rank": ds["rank"], "t": ds["start"], "call_row": ds["row"]}).merge(streams, on="rank")))
        st = bare[bare["name"].isin(["cudaStreamSynchronize", "cuStreamSynchronize"])]
        if len(st):  # the stream is the one this thread last launched on
            lq = _asof_join(pd.DataFrame({"rank": st["rank"], "pid": st["pid"], "thread": st["thread"],
                                          "t": st["start"], "call_row": st["row"]}).astype(np.int64).sort_values("t"),
                            self.ops[self.ops["call_row"] >= 0][["rank", "pid", "thread", "t", "device", "stream"]],
                            "t", "t", ["rank", "pid", "thread"])
            waits.append(self._last_op_before(lq[["rank", "device", "stream", "t", "call_row"]]))
        cp = self.ops[self.ops["call_row"] >= 0]
        # a synchronous copy from pageable host memory returns once the data is staged, before the
        # DMA ends (CUDA API sync behaviour), so only copies out of the device are waited for
        sc = cp[ev["name"].take(cp["call_row"].to_numpy()).isin(SYNC_COPY_CALLS).to_numpy(bool)]
        sc = sc[~ev["name"].take(sc["row"].to_numpy()).str.contains("HtoD", regex=False).to_numpy(bool)]
        waits.append(pd.DataFrame({"call_row": sc["call_row"], "op_row": sc["row"]}))
        w = pd.concat([x[["call_row", "op_row"]] for x in waits if len(x)], ignore_index=True) if any(
            len(x) for x in waits) else pd.DataFrame({"call_row": [], "op_row": []}, dtype=np.int64)
        w["call_row"] = self.top_of[w["call_row"].to_numpy(np.int64)]
        return w.drop_duplicates().astype(np.int64)

    @staticmethod
    def _with_record(rows: pd.DataFrame, rec: pd.DataFrame) -> pd.DataFrame:
        """Each waiting sync row with `rec_t`, when its cudaEventRecord was called: found by
        wait_on_cuda_event_record_corr_id where the trace has it; otherwise the closest preceding
        record on the waited stream is taken to be right before the wait call itself."""
        known = rows[rows["wait_event_corr"] >= 0].merge(rec, on=["rank", "wait_event_corr"], how="left")
        known["rec_t"] = known["rec_t"].fillna(known["call_t"])
        unknown = rows[rows["wait_event_corr"] < 0].assign(rec_t=lambda d: d["call_t"])
        return pd.concat([known, unknown], ignore_index=True).astype({"rec_t": np.int64})

    def _inferred_stream_waits(self, calls: pd.DataFrame) -> None:
        """cudaStreamWaitEvent without a cuda_sync row (no record correlation in the trace): the
        waiting stream is the one this thread launches on next, the waited stream the one it last
        launched on before that differs from it (PyTorch's pattern around NCCL work), and the record
        is taken to be the closest preceding one, i.e. the last op launched there before the call."""
        if calls.empty:
            return
        launched = self.ops[self.ops["call_row"] >= 0][["rank", "pid", "thread", "t", "device", "stream", "row"]]
        q = pd.DataFrame({"rank": calls["rank"], "pid": calls["pid"], "thread": calls["thread"],
                          "t": calls["start"], "key": np.arange(len(calls))}).astype(np.int64).sort_values("t")
        nxt = _asof_join(q, launched, "t", "t", ["rank", "pid", "thread"], forward=True)
        streams = launched[["rank", "pid", "thread", "device", "stream"]].drop_duplicates()
        cand = nxt[["rank", "pid", "thread", "t", "key", "stream"]].rename(columns={"stream": "waiting"}).merge(
            streams, on=["rank", "pid", "thread"])
        cand = cand[cand["stream"] != cand["waiting"]].sort_values("t", kind="stable")
        if cand.empty:
            return
        prev = _asof_join(cand, launched.rename(columns={"t": "t_op"}).sort_values("t_op"), "t", "t_op",
                          ["rank", "pid", "thread", "device", "stream"])
        prev = prev.sort_values("t_op").drop_duplicates("key", keep="last")
        dst_of = np.full(len(calls), -1, np.int64)  # keys are unique in both: a look-up, not a merge
        dst_of[nxt["key"].to_numpy(np.int64)] = nxt["row"].to_numpy(np.int64)
        src_key = prev["key"].to_numpy(np.int64)
        hit = dst_of[src_key] >= 0
        pair = pd.DataFrame({"row_src": prev["row"].to_numpy(np.int64)[hit], "row_dst": dst_of[src_key][hit]})
        # a guessed dependency the recorded timeline contradicts is not one: keep only consistent ones
        ev = self.ev
        src_end = (ev["start_ns"] + ev["dur_ns"]).to_numpy()[pair["row_src"].to_numpy()]
        ok = src_end <= ev["start_ns"].to_numpy()[pair["row_dst"].to_numpy()]
        self.meta["stream_waits_rejected"] = int((~ok).sum())
        pair = pair[ok]
        self.add_edges(self.out_node[pair["row_src"].to_numpy()], self.in_node[pair["row_dst"].to_numpy()], "event")
        self.meta["inferred_stream_waits"] = int(len(pair))

    def program_order(self, waits: pd.DataFrame) -> None:
        """Split blocking calls, add CPU-interval nodes and chain each thread's host nodes."""
        ev = self.ev
        top = self.top
        # the GPU finish each blocked call waited for (recorded), to place its sync node
        fin = (ev["start_ns"] + ev["dur_ns"]).to_numpy()
        w = waits.assign(fin=fin[waits["op_row"].to_numpy()] if len(waits) else [])
        latest = w.groupby("call_row")["fin"].max()
        blocked = top[top["row"].isin(latest.index)].copy()
        blocked["ready"] = np.clip(latest.loc[blocked["row"]].to_numpy(), blocked["start"], blocked["end"])
        sync_ids = self.add_nodes(kind="sync", rank=blocked["rank"].to_numpy(), device=-1, stream=-1,
                                  thread=blocked["thread"].to_numpy(), start_ns=blocked["ready"].to_numpy(),
                                  dur_ns=(blocked["end"] - blocked["ready"]).to_numpy(),
                                  name=blocked["name"].array, event=blocked["row"].to_numpy())
        sync_of = np.full(len(ev), -1, np.int64)
        sync_of[blocked["row"].to_numpy()] = sync_ids
        self.out_node[blocked["row"].to_numpy()] = sync_ids
        # the call itself keeps only its entry: its remaining time depends on the GPU
        self.nodes_dur_zero = self.call_node[blocked["row"].to_numpy()]
        self.add_edges(self.out_node[w["op_row"].to_numpy()], sync_of[w["call_row"].to_numpy()], "sync")

        # CPU intervals: before each top-level call (from the previous call's end or the thread's
        # first host event) and after the thread's last call (to its last host event)
        lo, hi = self._thread_extents(top["row"].to_numpy())
        first = np.r_[True, top["grp"].to_numpy()[1:] != top["grp"].to_numpy()[:-1]]
        last = np.r_[first[1:], True]
        prev_end = np.where(first, lo, np.r_[0, top["end"].to_numpy()[:-1]])
        gap = top["start"].to_numpy() - prev_end
        g = gap > 0
        gap_ids = self.add_nodes(kind="cpu", rank=top["rank"].to_numpy()[g], device=-1, stream=-1,
                                 thread=top["thread"].to_numpy()[g], start_ns=prev_end[g], dur_ns=gap[g],
                                 name="cpu", event=-1)
        tail = hi - top["end"].to_numpy()
        t = last & (tail > 0)
        tail_ids = self.add_nodes(kind="cpu", rank=top["rank"].to_numpy()[t], device=-1, stream=-1,
                                  thread=top["thread"].to_numpy()[t], start_ns=top["end"].to_numpy()[t],
                                  dur_ns=tail[t], name="cpu", event=-1)
        pos = np.arange(len(top))
        grp = top["grp"].to_numpy()
        rows = top["row"].to_numpy()
        slots = [(grp[g], 3 * pos[g], gap_ids),
                 (grp, 3 * pos + 1, self.call_node[rows]),
                 (grp[sync_of[rows] >= 0], 3 * pos[sync_of[rows] >= 0] + 2, sync_of[rows][sync_of[rows] >= 0]),
                 (grp[t], 3 * pos[t] + 3, tail_ids)]
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
        new = np.r_[True, (rank[o][1:] != rank[o][:-1]) | (pid[o][1:] != pid[o][:-1])
                    | (thread[o][1:] != thread[o][:-1])][:len(o)]
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
        kind = np.concatenate([np.full(len(e[0]), kinds.index(e[2]), np.int32) for e in self.edges]
                              or [np.array([], np.int32)])
        fs = np.concatenate([np.full(len(e[0]), e[3], dtype=bool) for e in self.edges] or [np.array([], bool)])
        # the first of each (src, dst, from_start), in the order added
        first = np.sort(np.unique((src * (2 * self.n_nodes + 2) + dst * 2 + fs), return_index=True)[1])
        edges = pd.DataFrame({"src": src[first], "dst": dst[first], "kind": text_column(kind[first], kinds),
                              "from_start": fs[first]})
        self.meta["ranks"] = sorted(int(r) for r in self.ev["rank"].unique())
        return Graph(nodes, edges, self.meta)


def _str_column(parts: list[tuple[int, object]]) -> pd.Series:
    """A str column from parts of n rows each: one string for all n, or n strings (a str column's
    .array, or an array of str), joined as Arrow chunks (no Python object per row)."""
    chunks = []
    for n, v in parts:
        if isinstance(v, str):
            chunks.append(pa.repeat(pa.scalar(v, pa.large_string()), n))
        elif hasattr(v, "__arrow_array__"):
            chunks.extend(v.__arrow_array__().cast(pa.large_string()).chunks)
        else:
            chunks.append(pa.array(np.asarray(v, dtype=object), pa.large_string()))
    return pd.Series(pa.chunked_array(chunks, pa.large_string()), dtype="str")


def _asof_join(left: pd.DataFrame, right: pd.DataFrame, on_left: str, on_right: str, by: list[str],
               forward: bool = False) -> pd.DataFrame:
    """The rows of `left` that have a match, with the columns of their match in `right`: the row of
    equal `by` whose `on_right` is the closest strictly before (forward: after) their `on_left`,
    as pd.merge_asof(allow_exact_matches=False) then dropna would give, at a fraction of its fixed cost."""
    j = _asof([left[c].to_numpy() for c in by], left[on_left].to_numpy(),
              [right[c].to_numpy() for c in by], right[on_right].to_numpy(), forward)
    hit = j >= 0
    out = left[hit]
    return out.assign(**{c: right[c].to_numpy()[j[hit]] for c in right.columns if c not in by and c != on_left})


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


def _participants(c: pd.DataFrame, named, listed, world: int, present: set) -> tuple[np.ndarray, np.ndarray]:
    """Per collective kernel: how many ranks take part (-1: not known) and the members absent
    from the trace ("2-127"). The members are the ranks the trace names for the group; an unnamed
    group is the whole world (distributedInfo.world_size, else the ranks present); a named group
    whose members are not written spans the ranks that use it, if every rank is present."""
    n = len(c)
    expected = np.where(named, c.groupby("key")["rank"].transform("nunique").to_numpy() if n else 0, len(present))
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


def _ranges(ranks: list[int]) -> str:
    """[2, 3, 4, 7] -> "2-4, 7"."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(f"{ranks[i]}-{ranks[j]}" if j > i else str(ranks[i]))
        i = j + 1
    return ", ".join(out)


def _unmatched(c: pd.DataFrame, world: int) -> list[dict]:
    """Why the collectives not matched across ranks are not: one entry per group and reason."""
    out = []
    if c.empty:  # (a groupby over no rows still costs its fixed overhead)
        return out
    for (key, absent, expected), x in c.groupby(["key", "absent", "expected"], sort=True):
        if absent:
            why = f"ranks {absent} are absent from the trace"
        elif expected < 0:
            why = f"the trace does not name the group's members and holds {x['rank'].nunique()} of {world} ranks"
        elif expected <= 1:
            why = "only one rank takes part"
        else:
            why = "not every member's kernel is in the trace"
        out.append({"group": str(key)[:80], "instances": int(x.groupby("occ").ngroups), "why": why})
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
