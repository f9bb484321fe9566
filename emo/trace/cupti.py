"""A CUPTI tracer (cupti-python) for Python programs that do not use PyTorch, writing Kineto JSON.

    from emo.trace.cupti import CuptiTracer
    with CuptiTracer("trace.json.gz") as t:
        for _ in range(iters):
            work()          # CUDA via cuda-python, CuPy, Numba, JAX, ...
            t.step()        # iteration marker -> ProfilerStep#i, as torch.profiler writes

It records kernels, memcpys, memsets, CUDA runtime and driver calls and synchronisation (with the
event records a stream wait refers to) through CUPTI's Activity API, and writes them in the form
torch.profiler's Kineto traces use (categories kernel, gpu_memcpy, gpu_memset, cuda_runtime,
cuda_driver, cuda_sync, user_annotation; pid = device and tid = stream for GPU rows; `ac2g` flows),
so the same reader takes both. Timestamps are CUPTI's (ns) in microseconds.

The conversion (`to_kineto`) works on plain dicts and is tested without a GPU; only CuptiTracer
touches cupti-python, imported when the tracer starts.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

SYNC_NAMES = {  # CUpti_ActivitySynchronizationType -> Kineto's cuda_sync names
    "EVENT_SYNCHRONIZE": "Event Sync",
    "STREAM_WAIT_EVENT": "Stream Wait Event",
    "STREAM_SYNCHRONIZE": "Stream Sync",
    "CONTEXT_SYNCHRONIZE": "Context Sync",
}
MEMCPY_NAMES = {
    "HTOD": "HtoD",
    "DTOH": "DtoH",
    "DTOD": "DtoD",
    "HTOH": "HtoH",
    "PTOP": "PtoP",
    "ATOD": "AtoD",
    "DTOA": "DtoA",
    "HTOA": "HtoA",
    "ATOH": "AtoH",
    "ATOA": "AtoA",
}
_VERSION = re.compile(r"_v\d+$")


def _us(ns: int | float) -> float:
    return round(ns / 1000.0, 3)


def _api_event(r: dict, pid: int, tid: int) -> dict:
    """A runtime or driver API call as Kineto writes it."""
    k = r["kind"]
    return {
        "ph": "X",
        "cat": "cuda_runtime" if k == "runtime" else "cuda_driver",
        "name": _VERSION.sub("", r["name"]),
        "pid": r.get("process_id", pid),
        "tid": r.get("thread_id", tid),
        "ts": _us(r["start"]),
        "dur": _us(r["end"] - r["start"]),
        "args": {"cbid": r["cbid"], "correlation": r["correlation_id"], "External id": r["correlation_id"]},
    }


def _gpu_events(r: dict, api: dict | None, pid: int, tid: int) -> list[dict]:
    """A kernel, memcpy or memset on its device's stream, and the launch -> GPU flow torch.profiler
    draws from its API call (`api`) when there is one."""
    k = r["kind"]
    events: list[dict] = []
    dev = r["device_id"]
    args = {
        "device": dev,
        "context": r["context_id"],
        "stream": r["stream_id"],
        "correlation": r["correlation_id"],
        "External id": r["correlation_id"],
    }
    if k == "kernel":
        cat, nm = "kernel", r["name"]
        args.update(
            {
                "grid": list(r["grid"]),
                "block": list(r["block"]),
                "registers per thread": r.get("registers_per_thread", 0),
                "shared memory": r.get("shared_memory", 0),
            }
        )
    elif k == "memcpy":
        cat, nm = "gpu_memcpy", f"Memcpy {MEMCPY_NAMES.get(r['copy_kind'], r['copy_kind'])}"
        args["bytes"] = r["bytes"]
    else:
        cat, nm = "gpu_memset", "Memset (Device)"
        args["bytes"] = r["bytes"]
    events.append(
        {
            "ph": "X",
            "cat": cat,
            "name": nm,
            "pid": dev,
            "tid": r["stream_id"],
            "ts": _us(r["start"]),
            "dur": _us(r["end"] - r["start"]),
            "args": args,
        }
    )
    if api is not None:  # the launch -> GPU flow torch.profiler draws
        events.append(
            {
                "ph": "s",
                "id": r["correlation_id"],
                "pid": api.get("process_id", pid),
                "tid": api.get("thread_id", tid),
                "ts": _us(api["start"]),
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        events.append(
            {
                "ph": "f",
                "id": r["correlation_id"],
                "pid": dev,
                "tid": r["stream_id"],
                "ts": _us(r["start"]),
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
    return events


def _sync_event(r: dict, ctx_device: dict, event_record: dict) -> dict:
    """A synchronisation on its device (a stream's, or -1 for the context), with the event record
    it waits on when CUPTI names it."""
    sync_name = SYNC_NAMES.get(r["sync_type"], r["sync_type"])
    dev = ctx_device.get(r["context_id"], 0)
    stream = r["stream_id"] if r["stream_id"] not in (None, 0xFFFFFFFF) else -1
    args = {
        "cuda_sync_kind": sync_name,
        "stream": stream,
        "correlation": r["correlation_id"],
        "External id": r["correlation_id"],
        "device": dev,
        "context": r["context_id"],
    }
    rec = event_record.get((r["context_id"], r.get("cuda_event_id")))
    if sync_name in ("Stream Wait Event", "Event Sync") and rec is not None:
        args["wait_on_cuda_event_record_corr_id"] = rec[0]
        args["wait_on_stream"] = rec[1]
    return {
        "ph": "X",
        "cat": "cuda_sync",
        "name": sync_name,
        "pid": dev,
        "tid": stream,
        "ts": _us(r["start"]),
        "dur": _us(r["end"] - r["start"]),
        "args": args,
    }


def _step_event(i: int, a: int, b: int, pid: int, tid: int) -> dict:
    """Iteration i between markers a and b (ns), as torch.profiler's ProfilerStep#i annotation."""
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"ProfilerStep#{i}",
        "pid": pid,
        "tid": tid,
        "ts": _us(a),
        "dur": _us(b - a),
        "args": {},
    }


def to_kineto(
    rows: list[dict],
    *,
    steps_ns: list[int] | None = None,
    pid: int | None = None,
    tid: int | None = None,
    name: str = "emo-cupti",
) -> dict:
    """Kineto trace dict from normalised CUPTI rows (see CuptiTracer._row for their fields).

    steps_ns: iteration-marker timestamps; consecutive pairs become ProfilerStep#i annotations.
    """
    pid = os.getpid() if pid is None else pid
    tid = threading.get_native_id() if tid is None else tid
    ctx_device = {r["context_id"]: r["device_id"] for r in rows if r["kind"] == "context"}
    event_record = {}  # (context, event id) -> (correlation, stream) of the cudaEventRecord
    for r in rows:
        if r["kind"] == "cuda_event":
            event_record[(r["context_id"], r["event_id"])] = (r["correlation_id"], r["stream_id"])
    api_at = {r["correlation_id"]: r for r in rows if r["kind"] in ("runtime", "driver")}
    events: list[dict] = []
    for r in rows:
        k = r["kind"]
        if k in ("runtime", "driver"):
            events.append(_api_event(r, pid, tid))
        elif k in ("kernel", "memcpy", "memset"):
            events += _gpu_events(r, api_at.get(r["correlation_id"]), pid, tid)
        elif k == "sync":
            events.append(_sync_event(r, ctx_device, event_record))
    steps = list(steps_ns or [])
    events += [_step_event(i, a, b, pid, tid) for i, (a, b) in enumerate(zip(steps, steps[1:]))]
    events.sort(key=lambda e: e["ts"])
    events.append(
        {
            "name": "process_name",
            "ph": "M",
            "ts": events[0]["ts"] if events else 0,
            "pid": pid,
            "tid": 0,
            "args": {"name": name},
        }
    )
    return {
        "schemaVersion": 1,
        "deviceProperties": [],
        "traceName": name,
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def import_cupti():
    try:
        from cupti import cupti
    except ImportError as e:
        raise RuntimeError("cupti-python is not installed: pip install 'emo[gpu]' (or cupti-python)") from e
    return cupti


class CuptiTracer:
    """Context manager recording CUDA activity of this process into a Kineto trace (see module doc)."""

    BUFFER_BYTES = 8 << 20

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self.rows: list[dict] = []
        self.steps_ns: list[int] = []
        self.trace: dict | None = None
        self._cupti: Any = None  # the cupti module (an optional dependency), imported on __enter__
        self._kinds: list[Any] = []

    # CUPTI hands finished buffers to this callback on its own thread: normalise at once, so no
    # record object outlives its buffer.
    def _completed(self, activities) -> None:
        for a in activities:
            row = self._row(a)
            if row is not None:
                self.rows.append(row)

    def _row(self, a) -> dict | None:
        c = self._cupti
        K = c.ActivityKind
        kind = a.kind
        if kind in (K.CONCURRENT_KERNEL, K.KERNEL):
            return {
                "kind": "kernel",
                "name": a.name,
                "start": a.start,
                "end": a.end,
                "device_id": a.device_id,
                "context_id": a.context_id,
                "stream_id": a.stream_id,
                "correlation_id": a.correlation_id,
                "grid": (a.grid_x, a.grid_y, a.grid_z),
                "block": (a.block_x, a.block_y, a.block_z),
                "registers_per_thread": a.registers_per_thread,
                "shared_memory": a.static_shared_memory + a.dynamic_shared_memory,
            }
        if kind == K.MEMCPY:
            return {
                "kind": "memcpy",
                "copy_kind": c.ActivityMemcpyKind(a.copy_kind).name,
                "bytes": a.bytes,
                "start": a.start,
                "end": a.end,
                "device_id": a.device_id,
                "context_id": a.context_id,
                "stream_id": a.stream_id,
                "correlation_id": a.correlation_id,
            }
        if kind == K.MEMSET:
            return {
                "kind": "memset",
                "bytes": a.bytes,
                "start": a.start,
                "end": a.end,
                "device_id": a.device_id,
                "context_id": a.context_id,
                "stream_id": a.stream_id,
                "correlation_id": a.correlation_id,
            }
        if kind in (K.RUNTIME, K.DRIVER):
            domain = c.CallbackDomain.RUNTIME_API if kind == K.RUNTIME else c.CallbackDomain.DRIVER_API
            return {
                "kind": "runtime" if kind == K.RUNTIME else "driver",
                "name": str(c.get_callback_name(domain, a.cbid)),
                "cbid": a.cbid,
                "start": a.start,
                "end": a.end,
                "process_id": a.process_id,
                "thread_id": a.thread_id,
                "correlation_id": a.correlation_id,
            }
        if kind == K.SYNCHRONIZATION:
            return {
                "kind": "sync",
                "sync_type": c.ActivitySynchronizationType(a.type).name,
                "start": a.start,
                "end": a.end,
                "context_id": a.context_id,
                "stream_id": a.stream_id,
                "correlation_id": a.correlation_id,
                "cuda_event_id": a.cuda_event_id,
            }
        if kind == K.CUDA_EVENT:
            return {
                "kind": "cuda_event",
                "context_id": a.context_id,
                "stream_id": a.stream_id,
                "correlation_id": a.correlation_id,
                "event_id": a.event_id,
            }
        if kind == K.CONTEXT:
            return {"kind": "context", "context_id": a.context_id, "device_id": a.device_id}
        return None

    def __enter__(self) -> CuptiTracer:
        c = self._cupti = import_cupti()
        K = c.ActivityKind
        self._kinds = [
            K.CONCURRENT_KERNEL,
            K.MEMCPY,
            K.MEMSET,
            K.RUNTIME,
            K.DRIVER,
            K.SYNCHRONIZATION,
            K.CUDA_EVENT,
            K.CONTEXT,
        ]
        c.activity_register_callbacks(lambda: (self.BUFFER_BYTES, 0), self._completed)
        for k in self._kinds:
            c.activity_enable(k)
        self.steps_ns = [c.get_timestamp()]
        return self

    def step(self) -> None:
        """Mark the end of an iteration (and the start of the next)."""
        self.steps_ns.append(self._cupti.get_timestamp())

    def __exit__(self, *exc) -> None:
        c = self._cupti
        c.activity_flush_all(1)
        for k in self._kinds:
            c.activity_disable(k)
        self.trace = to_kineto(self.rows, steps_ns=self.steps_ns if len(self.steps_ns) > 1 else None)
        if self.path is not None and exc[0] is None:
            from emo.io import write_json

            write_json(self.path, self.trace, gz=self.path.suffix == ".gz")
