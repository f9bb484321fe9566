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
    doc = load_json(path)
    info = doc.get("distributedInfo") or {}
    rank = _int(info.get("rank"), rank if rank is not None else 0)
    raw = doc["traceEvents"]
    kc = _KIND_OF_CAT
    # one pass pulling every field EMO reads (a pass per field costs ~5x more on large traces)
    rows = [(ev.get("cat"), ev.get("ts"), ev.get("dur"), ev.get("name"), ev.get("pid"), ev.get("tid"),
             ev.get("args"), i) for i, ev in enumerate(raw) if type(ev) is dict and ev.get("ph") == "X"]
    cols = list(zip(*rows)) if rows else [()] * 8
    kinds = [kc.get(c) or kc.get(str(c).lower()) for c in cols[0]]
    keep = np.array([k is not None for k in kinds], dtype=bool)
    kind_arr = np.array(kinds, dtype=object)[keep]
    pick = np.flatnonzero(keep)
    index = np.array(cols[7], dtype=np.int64)[pick]
    obj = [np.array(c, dtype=object)[pick] for c in cols[1:4]]
    for field, values in zip(("ts", "dur", "name"), obj):
        missing = np.flatnonzero(values == None)  # noqa: E711 (elementwise on an object array)
        if len(missing):
            i = int(index[missing[0]])
            raise ValueError(f"{path}: event #{i} ({raw[i].get('cat')}) lacks the field '{field}'")
    try:
        ts = _us_to_ns(np.array(obj[0].tolist()))
        dur = _us_to_ns(np.array(obj[1].tolist()))
    except (TypeError, ValueError):
        _explain_bad_event(path, raw, index.tolist())
        raise
    name = obj[2]
    if len(dur) and dur.min() < 0:
        i = int(np.argmin(dur))
        raise ValueError(f"{path}: event #{index[i]} ({kind_arr[i]} {name[i]!r}) has a negative duration")
    hip = [n for n, k in zip(name, kind_arr) if k == "runtime" and _HIP.match(str(n))]
    if hip:
        raise ValueError(f"{path}: a ROCm/HIP trace ({hip[0]}); EMO reads NVIDIA CUDA traces only")
    n = len(kind_arr)
    pid = _ints(np.array(cols[4], dtype=object)[pick].tolist())
    tid = _ints(np.array(cols[5], dtype=object)[pick].tolist())
    need = np.flatnonzero(np.isin(kind_arr, list(_ARG_KINDS)))
    args = [a or _EMPTY for a in np.array(cols[6], dtype=object)[pick][need].tolist()]
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


def _explain_bad_event(path: Path, raw: list, keep: list[int]) -> None:
    for i in keep:
        ev = raw[i]
        for field in ("ts", "dur", "name"):
            if field not in ev:
                raise ValueError(f"{path}: event #{i} ({ev.get('cat')}) lacks the field '{field}'") from None
        if not isinstance(ev["ts"], (int, float)) or not isinstance(ev["dur"], (int, float)):
            raise ValueError(f"{path}: event #{i} ({ev.get('cat')} {ev['name']!r}) has a non-numeric ts/dur") from None
