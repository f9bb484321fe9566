"""Kineto / PyTorch-profiler Chrome-trace JSON (plain or gzipped) into the normalised event table.

Reads both the current categories (`cpu_op`, `cuda_runtime`, `cuda_driver`, `kernel`,
`gpu_memcpy`, `gpu_memset`, `cuda_sync`, `user_annotation`, `gpu_user_annotation`) and the older
capitalised ones (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`). Flow events (`ac2g`) carry
nothing the correlation ids do not already say, so they are skipped like metadata."""
from __future__ import annotations

import contextlib
import gc
import gzip
import re
from pathlib import Path

import msgspec
import numpy as np
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


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic GC: parsing a trace allocates millions of dicts, and the collections that
    triggers (finding nothing to free) made parsing 3x slower."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Event(msgspec.Struct):
    """The fields EMO reads of a trace event; `args` stays raw bytes until a kind needs it."""

    ph: object = None
    cat: object = None
    name: object = None
    ts: object = None
    dur: object = None
    pid: object = None
    tid: object = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]
    distributedInfo: object = None


_TRACE = msgspec.json.Decoder(_Trace)
_EVENTS = msgspec.json.Decoder(list[_Event])  # the bare-array Chrome trace form


def read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:  # truncated gzip stream, unreadable file
        raise ValueError(f"{path}: cannot read ({e})") from None
    if not raw.strip():
        raise ValueError(f"{path}: empty file")
    return raw


def decode_events(path: Path) -> tuple[list[_Event], dict]:
    """The events and distributedInfo of one trace file (typed decoding: 4x faster than dicts)."""
    raw = read_bytes(path)
    try:
        if raw.lstrip()[:1] == b"[":
            return _EVENTS.decode(raw), {}
        doc = _TRACE.decode(raw)
    except msgspec.ValidationError as e:  # e.g. "Object missing required field `traceEvents`"
        raise ValueError(f"{path}: not a Chrome/Kineto trace ({e})") from None
    except msgspec.DecodeError as e:
        raise ValueError(f"{path}: truncated or malformed JSON ({e})") from None
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    return doc.traceEvents, info


def load_json(path: Path) -> dict:
    """Parse one trace file; every way it can be unreadable becomes a one-line ValueError."""
    raw = read_bytes(path)
    try:
        with no_gc():
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


# Categories as written (current lower-case and older capitalised ones), so no per-event .lower()
_KIND_OF_CAT = {**CATEGORY_KIND, **{k.capitalize(): v for k, v in CATEGORY_KIND.items()},
                **{k.upper(): v for k, v in CATEGORY_KIND.items()}}
# Kinds whose args EMO reads (cpu_op args are large and unused: skipped for speed)
_ARG_KINDS = frozenset({"runtime", "kernel", "memcpy", "memset", "sync", "gpu_annotation"})
_ARG_INTS = ("correlation", "External id", "device", "stream", "wait_on_cuda_event_record_corr_id",
             "wait_on_stream", "bytes")
_EMPTY: dict = {}


def read_kineto(path: Path, rank: int | None = None) -> pd.DataFrame:
    """One Kineto JSON file -> event table (rank from `distributedInfo`, else the given one)."""
    with no_gc():
        return _read_kineto(path, rank)


def _read_kineto(path: Path, rank: int | None) -> pd.DataFrame:
    events, info = decode_events(path)
    rank = _int(info.get("rank"), rank if rank is not None else 0)
    kc = _KIND_OF_CAT
    # keep complete events of a known category; then build each column straight from the structs
    pairs = [(i, k) for i, ev in enumerate(events) if ev.ph == "X" and (k := kc.get(ev.cat) or _kind(kc, ev.cat))]
    index, kinds = (list(x) for x in zip(*pairs)) if pairs else ([], [])
    kept = [events[i] for i in index]
    n = len(kept)
    kind_arr = np.array(kinds, dtype=object)
    names = [ev.name for ev in kept]
    try:
        if names.count(None):
            raise TypeError
        ts_us = np.fromiter((ev.ts for ev in kept), dtype=np.float64, count=n)
        dur_us = np.fromiter((ev.dur for ev in kept), dtype=np.float64, count=n)
        if np.isnan(ts_us).any() or np.isnan(dur_us).any():  # fromiter reads a missing (None) value as NaN
            raise TypeError
        ts, dur = _us_to_ns(ts_us), _us_to_ns(dur_us)
    except (TypeError, ValueError):
        _explain_bad_event(path, events, index)
        raise
    name = np.array(names, dtype=object)
    if len(dur) and dur.min() < 0:
        i = int(np.argmin(dur))
        raise ValueError(f"{path}: event #{index[i]} ({kind_arr[i]} {name[i]!r}) has a negative duration")
    hip = [n for n, k in zip(name, kind_arr) if k == "runtime" and _HIP.match(str(n))]
    if hip:
        raise ValueError(f"{path}: a ROCm/HIP trace ({hip[0]}); EMO reads NVIDIA CUDA traces only")
    pid = _ints([ev.pid for ev in kept])
    tid = _ints([ev.tid for ev in kept])
    need = np.flatnonzero(np.isin(kind_arr, list(_ARG_KINDS)))
    args = [_args(path, kept[j].args) for j in need.tolist()]
    vals = _int_table([tuple(a.get(k, -1) for k in _ARG_INTS) for a in args], len(_ARG_INTS))
    col = {k: np.full(n, -1, np.int64) for k in _ARG_INTS}
    for j, k in enumerate(_ARG_INTS):
        col[k][need] = vals[:, j]
    gpu = np.isin(kind_arr, list(GPU_KINDS))
    is_sync = kind_arr == "sync"
    device = np.where(gpu, np.where(col["device"] >= 0, col["device"], pid), -1)
    stream = np.where(gpu, np.where((col["stream"] < 0) & ~is_sync, tid, col["stream"]), -1)
    sync_kind = np.full(n, "", dtype=object)
    pg = np.full(n, "", dtype=object)
    need_kind = kind_arr[need]
    for j in np.flatnonzero(need_kind == "sync"):
        sync_kind[need[j]] = str(args[j].get("cuda_sync_kind", name[need[j]]))
    kj = np.flatnonzero(need_kind == "kernel")
    pg[need[kj]] = [str(args[j].get("Process Group Name", args[j].get("pg_name", ""))) for j in kj]
    return normalise({
        "rank": np.full(n, rank, np.int32), "device": device, "stream": stream, "pid": pid, "thread": tid,
        "kind": kind_arr, "name": name.tolist(), "start_ns": ts, "dur_ns": dur,
        "correlation": col["correlation"], "external_id": col["External id"], "sync_kind": sync_kind,
        "wait_event_corr": col["wait_on_cuda_event_record_corr_id"], "wait_stream": col["wait_on_stream"],
        "process_group": pg, "bytes": col["bytes"],
    })


def _kind(kc: dict, cat) -> str | None:
    return kc.get(cat) or (kc.get(cat.lower()) if isinstance(cat, str) else None)


def _int_table(rows: list[tuple], width: int) -> np.ndarray:
    try:
        return np.array(rows, dtype=np.int64).reshape(len(rows), width)
    except (TypeError, ValueError, OverflowError):
        return np.array([[_int(v) for v in r] for r in rows], dtype=np.int64).reshape(len(rows), width)


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (ints, or floats with ns fractions) to int64 ns without float64 rounding at 1e18."""
    if us.dtype.kind in "iu":
        return us.astype(np.int64) * 1000
    if us.dtype.kind != "f":
        raise TypeError("non-numeric timestamp")
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.round((us - whole) * 1000).astype(np.int64)


def _ints(values: list) -> np.ndarray:
    """int64 array; anything not an integer (a string pid like "Spans", None) becomes -1."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_int(v) for v in values], dtype=np.int64)


def _args(path: Path, raw: msgspec.Raw) -> dict:
    try:
        a = orjson.loads(bytes(raw))
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed event args ({e})") from None
    return a if isinstance(a, dict) else _EMPTY


def _explain_bad_event(path: Path, events: list, keep: list[int]) -> None:
    for i in keep:
        ev = events[i]
        for field in ("ts", "dur", "name"):
            if getattr(ev, field) is None:
                raise ValueError(f"{path}: event #{i} ({ev.cat}) lacks the field '{field}'") from None
        if not isinstance(ev.ts, (int, float)) or not isinstance(ev.dur, (int, float)):
            raise ValueError(f"{path}: event #{i} ({ev.cat} {ev.name!r}) has a non-numeric ts/dur") from None
