"""Kineto / PyTorch-profiler Chrome-trace JSON (plain or gzipped) into the normalised event table.

Reads both the current categories (`cpu_op`, `cuda_runtime`, `cuda_driver`, `kernel`,
`gpu_memcpy`, `gpu_memset`, `cuda_sync`, `user_annotation`, `gpu_user_annotation`) and the older
capitalised ones (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`). Flow events (`ac2g`) carry
nothing the correlation ids do not already say, so they are skipped like metadata."""
from __future__ import annotations

import gzip
import re
from pathlib import Path

import orjson
import pandas as pd

from emo.trace.schema import normalise

CATEGORY_KIND = {
    "cpu_op": "cpu_op", "operator": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "runtime": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_sync": "sync",
}
GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "sync", "gpu_annotation"})
_HIP = re.compile(r"^(hip|hsa|roc)[A-Z_]")


def load_json(path: Path) -> dict:
    """Parse one trace file; every way it can be unreadable becomes a one-line ValueError."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:  # truncated gzip stream, unreadable file
        raise ValueError(f"{path}: cannot read ({e})") from None
    if not raw.strip():
        raise ValueError(f"{path}: empty file")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{path}: truncated or malformed JSON ({e})") from None
    if isinstance(doc, list):  # the bare-array Chrome trace form
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome/Kineto trace (no 'traceEvents' list)")
    return doc


def _int(v, default=-1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def read_kineto(path: Path, rank: int | None = None) -> pd.DataFrame:
    """One Kineto JSON file -> event table (rank from `distributedInfo`, else the given one)."""
    doc = load_json(path)
    info = doc.get("distributedInfo") or {}
    rank = _int(info.get("rank"), rank if rank is not None else 0)
    cols: dict[str, list] = {c: [] for c in (
        "device", "stream", "pid", "thread", "kind", "name", "start_ns", "dur_ns", "correlation",
        "external_id", "sync_kind", "wait_event_corr", "wait_stream", "process_group", "bytes")}
    append = {c: v.append for c, v in cols.items()}
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        kind = CATEGORY_KIND.get(cat)
        if kind is None:
            continue
        try:
            ts, dur, name = ev["ts"], ev["dur"], ev["name"]
        except KeyError as e:
            raise ValueError(f"{path}: event #{i} ({cat}) lacks the field {e}") from None
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            raise ValueError(f"{path}: event #{i} ({cat} {name!r}) has a non-numeric ts/dur")
        if dur < 0:
            raise ValueError(f"{path}: event #{i} ({cat} {name!r}) has a negative duration")
        if kind == "runtime" and _HIP.match(name):
            raise ValueError(f"{path}: a ROCm/HIP trace ({name}); EMO reads NVIDIA CUDA traces only")
        args = ev.get("args") or {}
        gpu = kind in GPU_KINDS
        append["device"](_int(args.get("device", ev.get("pid"))) if gpu else -1)
        stream = _int(args.get("stream", ev.get("tid") if kind != "sync" else -1)) if gpu else -1
        append["stream"](stream)
        append["pid"](_int(ev.get("pid")))
        append["thread"](_int(ev.get("tid")))
        append["kind"](kind)
        append["name"](str(name))
        # Kineto writes microseconds (with ns fractions in newer versions); keep whole ns.
        append["start_ns"](round(ts * 1000))
        append["dur_ns"](round(dur * 1000))
        append["correlation"](_int(args.get("correlation")))
        append["external_id"](_int(args.get("External id")))
        append["sync_kind"](str(args.get("cuda_sync_kind", name)) if kind == "sync" else "")
        append["wait_event_corr"](_int(args.get("wait_on_cuda_event_record_corr_id")))
        append["wait_stream"](_int(args.get("wait_on_stream")))
        append["process_group"](str(args.get("Process Group Name", args.get("pg_name", ""))))
        append["bytes"](_int(args.get("bytes")))
    n = len(cols["name"])
    return normalise({"rank": [rank] * n, **cols})
