"""Write what the virtual GPU recorded as the Kineto JSON traces torch.profiler would have written.

One gzipped file per rank (`rank<R>.pt.trace.json.gz`), recent-PyTorch layout: `baseTimeNanoseconds`
plus `ts`/`dur` in microseconds with nanosecond decimals on a clock shared by all ranks; categories
cpu_op, user_annotation (ProfilerStep#i, nccl:*), cuda_runtime, kernel, gpu_memcpy, cuda_sync, ac2g
flows; NCCL kernels with the collective args of recent PyTorch; `distributedInfo` and
`deviceProperties`. Kept apart from the simulation so it can be timed (and skipped) on its own.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson

from emo.device.sim.engine import RT_CBID, RT_NAMES, SimResult
from emo.io import atomic_path

BASE_NS = 1_730_000_000_000_000_000  # the profiler's base time (Unix ns)
OFFSET_US = 5_000_000.0  # virtual time 0 sits this far after the base
PID0 = 2_860_000

NCCL_SIG = "(ncclDevComm*, unsigned long, ncclWork*)"
TORCH_DTYPE = {
    "bf16": "BFloat16",
    "fp16": "Half",
    "fp32": "Float",
    "f32": "Float",
    "int8": "Char",
    "fp8": "Float8_e4m3fn",
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "f32": 4, "int8": 1, "fp8": 1}
COLL_NAME = {
    "allreduce": "allreduce",
    "allgather": "_allgather_base",
    "reducescatter": "_reduce_scatter_base",
    "alltoall": "all_to_allv",
    "sendrecv": "send",
}
ANNOT = {
    "allreduce": "nccl:all_reduce",
    "allgather": "nccl:_all_gather_base",
    "reducescatter": "nccl:_reduce_scatter_base",
    "alltoall": "nccl:all_to_all",
    "sendrecv": "nccl:send",
}
MEMCPY_NAME = {
    "HtoD": "Memcpy HtoD (Pinned -> Device)",
    "DtoH": "Memcpy DtoH (Device -> Pinned)",
    "DtoD": "Memcpy DtoD (Device -> Device)",
}
SYNC_KIND = ("Stream Sync", "Event Sync", "Context Sync", "Stream Wait Event")


def nccl_kernel_name(kind: str, dtype: str) -> str:
    if kind == "allreduce":
        return f"ncclDevKernel_AllReduce_Sum_{dtype}_RING_LL{NCCL_SIG}"
    if kind == "allgather":
        return f"ncclDevKernel_AllGather_RING_LL{NCCL_SIG}"
    if kind == "reducescatter":
        return f"ncclDevKernel_ReduceScatter_Sum_{dtype}_RING_LL{NCCL_SIG}"
    return f"ncclDevKernel_SendRecv{NCCL_SIG}"


def _us(t_ns: float) -> float:
    return round(OFFSET_US + t_ns * 1e-3, 3)


def _dur(d_ns: float) -> float:
    return round(d_ns * 1e-3, 3)


def _us_many(t0_ns, d_ns) -> tuple[list, list]:
    """Vectorised _us/_dur for many events."""
    t0 = np.asarray(t0_ns, dtype=np.float64)
    d = np.asarray(d_ns, dtype=np.float64)
    return np.round(OFFSET_US + t0 * 1e-3, 3).tolist(), np.round(d * 1e-3, 3).tolist()


def device_properties(dev, n: int) -> list[dict]:
    p = dev.phys
    return [
        {
            "id": i,
            "name": p.device_name,
            "totalGlobalMem": int(p.total_mem_bytes),
            "computeMajor": p.compute_major,
            "computeMinor": p.compute_minor,
            "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiprocessor": p.max_warps_per_sm * 32,
            "regsPerBlock": 65536,
            "warpSize": 32,
            "sharedMemPerBlock": 49152,
            "numSms": p.sms,
            "regsPerMultiprocessor": 65536,
            "sharedMemPerBlockOptin": 232448 if p.compute_major >= 9 else 166912 if p.compute_major == 8 else 98304,
            "sharedMemPerMultiprocessor": 233472 if p.compute_major >= 9 else 167936 if p.compute_major == 8 else 98304,
        }
        for i in range(n)
    ]


def _coll_args(spec, rank: int) -> dict:
    nel = int(spec.nbytes // DTYPE_BYTES.get(spec.dtype, 2))
    n = len(spec.ranks)
    out_nel = nel * n if spec.kind == "allgather" else nel // n if spec.kind == "reducescatter" else nel
    name = COLL_NAME.get(spec.kind, spec.kind)
    if spec.kind == "sendrecv" and spec.ranks and rank != spec.ranks[0]:
        name = "recv"
    return {
        "Collective name": name,
        "dtype": TORCH_DTYPE.get(spec.dtype, spec.dtype),
        "In msg nelems": nel,
        "Out msg nelems": out_nel,
        "In split size": "[]",
        "Out split size": "[]",
        "Global rank start": int(min(spec.ranks)),
        "Global rank stride": 1,
        "Group size": n,
        "Process Group Name": str(spec.group),
        "Process Group Description": "default_pg" if spec.group == "0" else "undefined",
        "Process Group Ranks": "[" + ", ".join(str(r) for r in spec.ranks) + "]",
    }


def rank_events(res: SimResult, program, dev, rank: int, first_step: int = 0) -> list[dict]:
    """All trace events of one rank (the writer's core, a pure function of the records)."""
    rec = res.ranks[rank]
    pid = PID0 + 17 * rank
    tid = pid
    kspecs = program.kernels
    ev: list[dict] = []
    app = ev.append
    dev_id = rank
    # metadata
    t_meta = _us(res.t_start)
    app({"name": "process_name", "ph": "M", "ts": t_meta, "pid": pid, "tid": 0, "args": {"name": "python3"}})
    app({"name": "process_labels", "ph": "M", "ts": t_meta, "pid": pid, "tid": 0, "args": {"labels": "CPU"}})
    app({"name": "process_sort_index", "ph": "M", "ts": t_meta, "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    app({"name": "process_name", "ph": "M", "ts": t_meta, "pid": dev_id, "tid": 0, "args": {"name": "python3"}})
    app(
        {
            "name": "process_labels",
            "ph": "M",
            "ts": t_meta,
            "pid": dev_id,
            "tid": 0,
            "args": {"labels": f"GPU {dev_id}"},
        }
    )
    app(
        {
            "name": "process_sort_index",
            "ph": "M",
            "ts": t_meta,
            "pid": dev_id,
            "tid": 0,
            "args": {"sort_index": 16777216 + dev_id},
        }
    )
    app(
        {"name": "thread_name", "ph": "M", "ts": t_meta, "pid": pid, "tid": tid, "args": {"name": "thread 1 (python3)"}}
    )
    streams = sorted(
        {k[2] for k in rec.kernels}
        | {c[2] for c in rec.colls}
        | {c[3] for c in rec.copies}
        | {s[1] for s in rec.syncs if s[1] >= 0}
    )
    for s in streams:
        app({"name": "thread_name", "ph": "M", "ts": t_meta, "pid": dev_id, "tid": s, "args": {"name": f"stream {s} "}})
        app({"name": "thread_sort_index", "ph": "M", "ts": t_meta, "pid": dev_id, "tid": s, "args": {"sort_index": s}})
    # iterations
    it_t = rec.iter_t
    ends = it_t[1:] + [rec.host_end]
    for i, (a, b) in enumerate(zip(it_t, ends)):
        app(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{first_step + i}",
                "pid": pid,
                "tid": tid,
                "ts": _us(a),
                "dur": _dur(b - a),
                "args": {"External id": 0, "Record function id": 0},
            }
        )
    cpu = rec.cpu_ops
    tss, durs = _us_many([c[1] for c in cpu], [c[2] for c in cpu])
    for (name, _, _, ext), ts, du in zip(cpu, tss, durs):
        app(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": du,
                "args": {"External id": ext, "Record function id": 0, "Ev Idx": ext},
            }
        )
    for name, t0, d, ext in rec.annotations:
        app(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": _us(t0),
                "dur": _dur(d),
                "args": {"External id": ext, "Record function id": 0, "Ev Idx": ext},
            }
        )
    for t0, d, ext, cidx in rec.comm_ops:
        spec = program.collectives[cidx]
        cargs = _coll_args(spec, rank)
        app(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "pid": pid,
                "tid": tid,
                "ts": _us(t0),
                "dur": _dur(d),
                "args": {"External id": ext, "Record function id": 0, **cargs, "Ev Idx": ext},
            }
        )
        app(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": ANNOT.get(spec.kind, "nccl:" + spec.kind),
                "pid": pid,
                "tid": tid,
                "ts": _us(t0 + 300.0),
                "dur": _dur(d - 600.0),
                "args": {"External id": ext, "Record function id": 0, "Ev Idx": ext},
            }
        )
    pre_post = (dev.phys.cpu_op_pre_us + dev.phys.cpu_op_post_us) * 1e3
    host = rec.host
    tss, durs = _us_many([h[1] for h in host], [h[2] for h in host])
    op_ts, op_durs = _us_many([h[6] for h in host], [h[2] + pre_post for h in host])
    for (code, t0, d, corr, ext, _arg, _op_t0, op_name), ts, du, ots, odu in zip(host, tss, durs, op_ts, op_durs):
        if op_name:  # the framework op around a kernel launch
            app(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": op_name,
                    "pid": pid,
                    "tid": tid,
                    "ts": ots,
                    "dur": odu,
                    "args": {"External id": ext, "Record function id": 0, "Ev Idx": ext},
                }
            )
        app(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": RT_NAMES[code],
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": du,
                "args": {"External id": ext, "cbid": RT_CBID[code], "correlation": corr},
            }
        )
        if code <= 2:
            app({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"})
    mw = dev.phys.max_warps_per_sm
    sms = dev.phys.sms
    kinfo = []
    for k in kspecs:
        blocks = k.grid[0] * k.grid[1] * k.grid[2]
        threads = max(k.block[0] * k.block[1] * k.block[2], 1)
        wps = max(min(k.work.active_warps, 1.0), 0.0) * mw
        regs = int(min(255, max(16, 65536 // max(wps * 32, 32)))) // 8 * 8
        kinfo.append(
            {
                "registers per thread": regs,
                "shared memory": 0,
                "blocks per SM": round(blocks / sms, 6),
                "warps per SM": round(blocks * threads / 32 / sms, 6),
                "grid": list(k.grid),
                "block": list(k.block),
                "est. achieved occupancy %": int(round(wps / mw * 100)),
            }
        )
    kern = rec.kernels
    tss, durs = _us_many([k[3] for k in kern], [k[4] - k[3] for k in kern])
    for (corr, kid, sid, t0, t1, ext, *_), ts, du in zip(kern, tss, durs):
        app(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kspecs[kid].name,
                "pid": dev_id,
                "tid": sid,
                "ts": ts,
                "dur": du,
                "args": {
                    "External id": ext,
                    "queued": 0,
                    "device": dev_id,
                    "context": 1,
                    "stream": sid,
                    "correlation": corr,
                    **kinfo[kid],
                },
            }
        )
        app({"ph": "f", "id": corr, "pid": dev_id, "tid": sid, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    for corr, cidx, sid, t0, t1, ext in rec.colls:
        spec = program.collectives[cidx]
        ts = _us(t0)
        app(
            {
                "ph": "X",
                "cat": "kernel",
                "name": nccl_kernel_name(spec.kind, spec.dtype),
                "pid": dev_id,
                "tid": sid,
                "ts": ts,
                "dur": _dur(t1 - t0),
                "args": {
                    "External id": ext,
                    "queued": 0,
                    "device": dev_id,
                    "context": 1,
                    "stream": sid,
                    "correlation": corr,
                    "registers per thread": 96,
                    "shared memory": 74048,
                    "blocks per SM": 0.018519,
                    "warps per SM": 0.296296,
                    "grid": [2, 1, 1],
                    "block": [512, 1, 1],
                    "est. achieved occupancy %": 0,
                    **_coll_args(spec, rank),
                },
            }
        )
        app({"ph": "f", "id": corr, "pid": dev_id, "tid": sid, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    for corr, kind, nbytes, sid, t0, t1, ext in rec.copies:
        ts = _us(t0)
        app(
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": MEMCPY_NAME[kind],
                "pid": dev_id,
                "tid": sid,
                "ts": ts,
                "dur": _dur(t1 - t0),
                "args": {
                    "External id": ext,
                    "device": dev_id,
                    "context": 1,
                    "stream": sid,
                    "correlation": corr,
                    "bytes": int(nbytes),
                    "memory bandwidth (GB/s)": nbytes / max(t1 - t0, 1.0),
                },
            }
        )
        app({"ph": "f", "id": corr, "pid": dev_id, "tid": sid, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    for kind, sid, t0, t1, corr, ext, rec_corr, rec_sid in rec.syncs:
        name = SYNC_KIND[kind]
        args = {"External id": ext, "cuda_sync_kind": name}
        if kind == 3:
            args.update(
                {
                    "wait_on_stream": rec_sid,
                    "wait_on_cuda_event_record_corr_id": rec_corr,
                    "wait_on_cuda_event_id": rec_corr % 997 if rec_corr >= 0 else -1,
                }
            )
        elif kind == 1:
            args.update(
                {
                    "wait_on_stream": rec_sid,
                    "wait_on_cuda_event_record_corr_id": rec_corr,
                    "wait_on_cuda_event_id": rec_corr % 997 if rec_corr >= 0 else -1,
                }
            )
        args.update({"stream": sid, "correlation": corr, "device": dev_id, "context": 1})
        app(
            {
                "ph": "X",
                "cat": "cuda_sync",
                "name": name,
                "pid": dev_id,
                "tid": sid,
                "ts": _us(t0),
                "dur": _dur(max(t1 - t0, 0.0)),
                "args": args,
            }
        )
    span0, span1 = _us(res.t_start), _us(res.t_end)
    app(
        {
            "ph": "X",
            "cat": "Trace",
            "ts": span0,
            "dur": round(span1 - span0, 3),
            "pid": "Spans",
            "tid": "PyTorch Profiler",
            "name": "PyTorch Profiler (0)",
            "args": {"Op count": 0},
        }
    )
    app(
        {
            "name": "Iteration Start: PyTorch Profiler",
            "ph": "i",
            "s": "g",
            "pid": "Traces",
            "tid": "Trace PyTorch Profiler",
            "ts": span0,
        }
    )
    app({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": round(span1 + 0.001, 3)})
    return ev


def trace_document(res: SimResult, program, dev, rank: int, first_step: int = 0) -> dict:
    world = program.ranks
    return {
        "schemaVersion": 1,
        "deviceProperties": device_properties(dev, world),
        "cupti_version": 24,
        "cuda_runtime_version": 12040,
        "cuda_driver_version": 12040,
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": world,
            "pg_count": 1,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": world,
                    "ranks": list(range(world)),
                }
            ],
            "nccl_version": "2.21.5",
        },
        "record_shapes": 1,
        "with_stack": 0,
        "trace_id": f"{(BASE_NS // 1000 + rank * 7919) & 0xFFFFFFFFFFFFFFFF:032X}",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": rank_events(res, program, dev, rank, first_step),
        "traceName": f"rank{rank}.pt.trace.json",
    }


def light(doc: dict) -> dict:
    """What a light capture records of a trace: no CPU ops and no annotations but the iteration
    markers (runtime calls, GPU activity and synchronisation stay)."""
    keep = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") != "cpu_op"
        and (e.get("cat") != "user_annotation" or str(e.get("name", "")).startswith("ProfilerStep#"))
    ]
    return {**doc, "traceEvents": keep}


def write_traces(
    res: SimResult,
    program,
    dev,
    out_dir: Path,
    first_step: int = 0,
    capture: str = "full",
    ranks: list[int] | None = None,
) -> list[Path]:
    """One `rank<R>.pt.trace.json.gz` per rank in out_dir (or per rank of `ranks`: a sampled trace);
    each written atomically. `capture`: "full" (torch.profiler's CPU and CUDA activities) or "light"
    (`light`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(program.ranks) if ranks is None else sorted(ranks):
        doc = trace_document(res, program, dev, r, first_step)
        data = orjson.dumps(light(doc) if capture == "light" else doc)
        path = out_dir / f"rank{r}.pt.trace.json.gz"
        with atomic_path(path) as tmp:
            with gzip.open(tmp, "wb", compresslevel=1) as f:
                f.write(data)
        paths.append(path)
    return paths
