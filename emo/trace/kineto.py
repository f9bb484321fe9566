"""Kineto / PyTorch-profiler Chrome-trace JSON (plain or gzipped) into the normalised event table.

Reads both the current categories (`cpu_op`, `cuda_runtime`, `cuda_driver`, `kernel`,
`gpu_memcpy`, `gpu_memset`, `cuda_sync`, `user_annotation`, `gpu_user_annotation`) and the older
capitalised ones (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`). Flow events (`ac2g`) carry
nothing the correlation ids do not already say, so they are skipped like metadata.

Speed: the file is inflated with ISA-L (`isal`) or mapped into memory, checked by msgspec (which
skips every value), and its events' columns are written by one compiled pass over the text
(emo.trace.kineto_scan): no Python object per event. What that pass does not take as msgspec's typed
decode would (an escaped key, a value of an unusual type) is read by that decode instead, straight
into small typed structs (only the fields EMO reads), whose columns are then pulled out of all
structs at once by C-level `attrgetter`/`zip` transposition. Both give the same table, warnings
and errors."""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import re
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import attrgetter, eq, index
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pandas as pd

try:  # ISA-L's inflate is several times faster than zlib's and reads the same streams
    from isal.igzip import decompress as _gunzip
except ImportError:  # pragma: no cover - isal is a dependency; plain zlib still reads every file
    from gzip import decompress as _gunzip

from emo.errors import InputError
from emo.trace.schema import normalise

CATEGORY_KIND = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "runtime": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_sync": "sync",
}
GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "sync", "gpu_annotation"})
HIP_CATEGORIES = frozenset({"hip_runtime", "hip_driver", "hip_api", "hsa_api", "roctx"})
_HIP = re.compile(r"^(hip|hsa|roc)[A-Z_]")
_UNSET = msgspec.UNSET


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic GC: parsing a trace allocates millions of objects, and the collections that
    triggers (finding nothing to free) made parsing 3x slower."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The event args EMO reads; every other key (a cpu_op's shapes, ...) is skipped unparsed."""

    correlation: Any = -1
    external_id: Any = msgspec.field(default=-1, name="External id")
    device: Any = -1
    stream: Any = -1
    wait_on_cuda_event_record_corr_id: Any = -1
    wait_on_stream: Any = -1
    bytes: Any = -1
    cuda_sync_kind: Any = _UNSET
    pg_long: Any = msgspec.field(default=_UNSET, name="Process Group Name")
    pg_name: Any = _UNSET
    pg_ranks: Any = msgspec.field(default=_UNSET, name="Process Group Ranks")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """The fields EMO reads of a trace event."""

    ph: Any = None
    cat: Any = None
    id: Any = None  # a flow event's id (ac2g: the correlation id it links)
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: _Args | list | str | float | int | bool | None = _NO_ARGS


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]
    distributedInfo: Any = None


_TRACE = msgspec.json.Decoder(_Trace)
_EVENTS = msgspec.json.Decoder(list[_Event])  # the bare-array Chrome trace form


# A gzipped trace inflates ~8-16x (the bundled ones); past this ratio (and a floor for small files) it is
# refused before it is held in memory: a 3 MB gzip bomb once took 6.5 GB.
GZIP_MAX_RATIO = 50  # 3 MB of gzip -> 150 MB of JSON -> ~1 GB parsed (100 MB parse to 0.7 GB)
GZIP_MIN_LIMIT = 64 << 20


def inflate(path: Path, raw: bytes) -> bytes:
    """A gzip stream (every member) inflated, refused once it passes its bound."""
    import zlib

    limit = max(GZIP_MIN_LIMIT, GZIP_MAX_RATIO * len(raw))
    if len(raw) * 1032 <= limit:  # deflate inflates at most ~1032x: no need to watch it
        return _gunzip(raw)
    parts, size, rest = [], 0, raw
    while rest[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(31)
        while rest:
            chunk = d.decompress(rest, limit + 1 - size)
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise _TooBig(
                    f"{path}: inflates to more than {limit >> 20} MiB ({GZIP_MAX_RATIO}x its size; a gzip bomb?): "
                    "refused; if it is a real trace, gunzip it and analyse the plain .json"
                )
            rest = d.unconsumed_tail
            if d.eof:
                break
        if not d.eof:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
        rest = d.unused_data
    return b"".join(parts)


class _TooBig(Exception):
    pass


def read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = inflate(path, raw)
    except _TooBig as e:
        raise InputError(str(e)) from None
    except (OSError, EOFError, ValueError, zlib_error()) as e:  # truncated gzip stream, unreadable file
        raise InputError(f"{path}: cannot read ({e})") from None
    except Exception as e:  # ISA-L's own error type (IsalError) for a damaged deflate stream
        raise InputError(f"{path}: cannot read (damaged gzip stream: {e})") from None
    if not raw.strip():
        raise InputError(f"{path}: empty file")
    return raw


@contextlib.contextmanager
def mapped_text(path: Path):
    """The file's JSON text for one parse: a gzipped file inflated, a plain one mapped into memory
    read-only (the parser reads the page cache: no copy into a bytes object, nor the page faults
    of that copy)."""
    text = None
    try:
        with path.open("rb") as f:
            if f.read(2) != b"\x1f\x8b" and os.fstat(f.fileno()).st_size:
                text = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # not mappable (a pipe, some file systems): read_bytes reads it
        pass
    if text is None:  # gzipped, empty or not mappable: read_bytes inflates it and names what is wrong
        yield read_bytes(path)
        return
    try:
        if _NON_SPACE.search(text) is None:
            raise InputError(f"{path}: empty file")
        yield text
    finally:
        text.close()


_NON_SPACE = re.compile(rb"\S")


def zlib_error() -> type[BaseException]:
    import zlib

    return zlib.error


def decode_events(path: Path) -> tuple[list[_Event], dict]:
    """The events and distributedInfo of one trace file (typed decoding: 4x faster than dicts)."""
    with mapped_text(path) as raw:
        try:
            first = _NON_SPACE.search(raw)
            assert first is not None  # mapped_text yields no blank text
            if first.group() == b"[":  # the bare-array Chrome trace form
                return _EVENTS.decode(raw), {}
            doc = _TRACE.decode(raw)
        except msgspec.ValidationError as e:  # e.g. "Object missing required field `traceEvents`"
            raise InputError(f"{path}: not a Chrome/Kineto trace ({e})") from None
        except msgspec.DecodeError as e:
            raise InputError(f"{path}: truncated or malformed JSON ({e})") from None
        except RecursionError:  # msgspec recurses per level: arrays nested ~1000 deep
            raise InputError(f"{path}: JSON nested too deep to be a trace") from None
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    return doc.traceEvents, info


def load_json(path: Path) -> dict:
    """Parse one trace file; every way it can be unreadable becomes a one-line ValueError."""
    raw = read_bytes(path)
    try:
        with no_gc():
            doc = orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError) as e:
        raise InputError(f"{path}: truncated or malformed JSON ({e})") from None
    if isinstance(doc, list):  # the bare-array Chrome trace form
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(f"{path}: not a Chrome/Kineto trace (no 'traceEvents' list)")
    return doc


_INT64 = (-(2**63), 2**63 - 1)


def _int(v, default=-1) -> int:
    """v as an int64; `default` for anything else (text such as "12", 1.5, a list, an id >= 2^63): an
    id the trace did not write as an integer is not one (true is 1, as Python's operator.index says)."""
    try:
        i = index(v)
    except TypeError:
        return default
    return i if _INT64[0] <= i <= _INT64[1] else default


# Categories as written (current lower-case and older capitalised ones), so no per-event .lower()
_KIND_OF_CAT = {c: k for cat, k in CATEGORY_KIND.items() for c in (cat, cat.capitalize(), cat.upper())}
# Kinds as small codes (0: an event EMO does not read), so per-event tests are integer compares
KIND_CODES = (None,) + tuple(dict.fromkeys(CATEGORY_KIND.values()))
_CODE = {k: i for i, k in enumerate(KIND_CODES) if k}
_CODE_OF_CAT = {c: _CODE[k] for c, k in _KIND_OF_CAT.items()}
# Kinds whose args EMO reads (a cpu_op's ids are not used)
_ARG_KINDS = ("runtime", "kernel", "memcpy", "memset", "sync", "gpu_annotation")
_ARG_CODES = [_CODE[k] for k in _ARG_KINDS]
_ARG_INTS = (
    "correlation",
    "external_id",
    "device",
    "stream",
    "wait_on_cuda_event_record_corr_id",
    "wait_on_stream",
    "bytes",
)
_CAT, _PH, _TS, _DUR = attrgetter("cat"), attrgetter("ph"), attrgetter("ts"), attrgetter("dur")
_NAME = attrgetter("name")
_KIND_NAMES = np.array(KIND_CODES, dtype=object)
# The largest |microseconds| whose nanoseconds fit in int64
_MAX_US = (2**63 - 1) // 1000
MAX_RANKS = 1 << 23


def read_kineto(path: Path, rank: int | None = None):
    """One Kineto JSON file -> event table (rank from `distributedInfo`, else the given one)."""
    with no_gc():
        return _read_kineto(path, rank)


def _kinds(path: Path, events: list) -> np.ndarray:
    """Each event's kind as a code into KIND_CODES (0: not one EMO reads), one dict look-up per
    event in C (a category not seen before is classified once, by the table's __missing__)."""
    try:
        return np.fromiter(map(_KindTable(path).__getitem__, map(_CAT, events)), dtype=np.int8, count=len(events))
    except TypeError:  # an unhashable (list, dict) category somewhere: read it as no category
        cats = [c if isinstance(c, str) else None for c in map(_CAT, events)]
        return np.fromiter(map(_KindTable(path).__getitem__, cats), dtype=np.int8, count=len(cats))


class _KindTable(dict):
    """Category -> kind code, the known spellings preloaded; any other category is looked at once."""

    def __init__(self, path: Path):
        super().__init__(_CODE_OF_CAT)
        self.path = path

    def __missing__(self, cat) -> int:
        if isinstance(cat, str) and cat.lower() in HIP_CATEGORIES:
            raise InputError(f"{self.path}: a ROCm/HIP trace (category {cat!r}); EMO reads NVIDIA CUDA traces only")
        code = self[cat] = _CODE.get(CATEGORY_KIND.get(cat.lower(), ""), 0) if isinstance(cat, str) else 0
        return code


def _factorize(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes into the distinct values in order of first appearance (pd.factorize's order), by one
    dict look-up per value in C; raises TypeError on a missing (None) or unhashable value."""
    first: dict = {}
    at = np.fromiter(map(first.setdefault, values, count()), dtype=np.int64, count=n)
    if None in first:
        raise TypeError("a missing value")
    lut = np.zeros(n, np.int64)
    lut[np.fromiter(first.values(), dtype=np.int64, count=len(first))] = np.arange(len(first))
    return lut[at], _objects(first, len(first))


@dataclass(slots=True)
class _Columns:
    """What the table is built from, by either path: the kept events' (complete ones of a kind EMO
    reads) kind codes, names, times, ids and args, and what is needed of the others."""

    rank: int
    world: int
    info: dict
    index: np.ndarray  # the kept events' positions among all
    codes: np.ndarray  # their kind codes (KIND_CODES)
    name_codes: np.ndarray
    name_values: np.ndarray  # (objects)
    ts_us: np.ndarray
    dur_us: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    need: np.ndarray  # the kept events whose args EMO reads
    ints: dict[str, np.ndarray]  # _ARG_INTS, per kept event (-1 outside `need`)
    objects: dict[str, np.ndarray]  # _ARG_OBJECTS, per `need` event (UNSET: absent)
    warnings: list[str]
    flow_ids: np.ndarray  # the launch flows' (ac2g) ids and times (us)
    flow_ts: np.ndarray


def _rank_world(path: Path, info: dict, rank: int | None) -> tuple[int, int]:
    rank = _int(info.get("rank"), rank if rank is not None else 0)
    world = _int(info.get("world_size"), -1)
    for key, v, lo in (("rank", rank, 0), ("world_size", world, -1)):
        if not lo <= v < MAX_RANKS:  # (the graph keys nodes by rank below 2^23)
            raise InputError(f"{path}: distributedInfo {key} {v} is not a {key} (want {max(lo, 0)} to {MAX_RANKS - 1})")
    return rank, world


def _read_kineto(path: Path, rank: int | None):
    cols = _scanned_columns(path, rank)
    if cols is None:  # the typed decode reads (or refuses, saying why) what the scan does not take
        cols = _decoded_columns(path, rank)
    return _table(path, cols)


def _scanned_columns(path: Path, rank: int | None) -> _Columns | None:
    """The columns from the compiled scan of the JSON text (emo.trace.kineto_scan); None where it
    leaves the file to the typed decode."""
    from emo.trace import kineto_scan as ks

    with mapped_text(path) as raw:
        first = _NON_SPACE.search(raw)
        assert first is not None  # mapped_text yields no blank text
        sc = ks.scan(raw, bare=first.group() == b"[")
    if sc is None:
        return None
    rank, world = _rank_world(path, sc.info, rank)
    cat = sc.codes[ks.CAT]
    table = _KindTable(path)
    kind_of = np.zeros(len(sc.strings) + 1, np.int8)  # (the last entry: no category)
    for c in pd.unique(cat[cat >= 0]).tolist():  # in order of first appearance, as the typed path meets them
        kind_of[c] = table[sc.strings[c]]
    codes = kind_of[cat]
    ph = sc.codes[ks.PH]
    complete_all = ph == 1
    warnings = _skipped_counts(
        int(((~complete_all) & (ph != 2)).sum()), int((complete_all & (codes == 0) & (cat < 0)).sum())
    )
    index = np.flatnonzero((codes != 0) & complete_all)
    name_codes = sc.codes[ks.NAME][index]
    if (
        (name_codes < 0).any()
        or (sc.codes[ks.TS_STATE][index] != 1).any()
        or (sc.codes[ks.DUR_STATE][index] != 1).any()
        or any(type(sc.strings[c]) is not str for c in np.unique(name_codes).tolist())
    ):
        return None  # a kept event without a name, ts or dur: the typed path says which
    flows = np.flatnonzero(~complete_all & (cat == _string_code(sc.strings, "ac2g")))
    flow_ts = np.where(sc.codes[ks.TS_STATE][flows] == 1, sc.ts[flows], np.nan)  # (null or absent: not a number)
    codes = codes[index]
    need = np.flatnonzero(np.isin(codes, _ARG_CODES))
    rows = index[need]
    ints = {}
    for field, c in zip(_ARG_INTS, ks.ARG_INTS):
        out = np.full(len(index), -1, np.int64)
        out[need] = sc.ints[c][rows]
        ints[field] = out
    objects = {}
    for field, f in zip(_ARG_OBJECTS, (ks.SYNC_KIND, ks.PG_LONG, ks.PG_NAME, ks.PG_RANKS)):
        out = np.full(len(need), _UNSET, dtype=object)
        if f in sc.values:
            at, vals = sc.values[f]
            pos = np.searchsorted(rows, at)
            hit = pos < len(rows)
            hit[hit] = rows[pos[hit]] == at[hit]
            out[pos[hit]] = _objects(compress(vals, hit.tolist()), int(hit.sum()))
        objects[field] = out
    return _Columns(
        rank=rank,
        world=world,
        info=sc.info,
        index=index,
        codes=codes,
        name_codes=name_codes.astype(np.int64),
        name_values=_objects(sc.strings, len(sc.strings)),
        ts_us=sc.ts[index],
        dur_us=sc.dur[index],
        pid=sc.ints[ks.PID][index],
        tid=sc.ints[ks.TID][index],
        need=need,
        ints=ints,
        objects=objects,
        warnings=warnings,
        flow_ids=sc.ints[ks.ID][flows],
        flow_ts=flow_ts,
    )


def _string_code(strings: list, s: str) -> int:
    try:
        return strings.index(s)
    except ValueError:
        return -2  # (no code)


_ARG_OBJECTS = ("cuda_sync_kind", "pg_long", "pg_name", "pg_ranks")


def _decoded_columns(path: Path, rank: int | None) -> _Columns:
    """The columns from msgspec's typed decode (one small struct per event, read column by column)."""
    events, info = decode_events(path)
    rank, world = _rank_world(path, info, rank)
    codes = _kinds(path, events)
    # only complete events are intervals
    complete_all = np.fromiter(map(eq, map(_PH, events), repeat("X")), dtype=bool, count=len(events))
    warnings = _skipped(events, codes, complete_all)
    index = np.flatnonzero((codes != 0) & complete_all)
    kept = list(map(events.__getitem__, index.tolist()))
    codes = codes[index]
    n = len(kept)
    try:
        name_codes, name_values = _factorize(map(_NAME, kept), n)
        ts_us = np.fromiter(map(_TS, kept), dtype=np.float64, count=n)
        dur_us = np.fromiter(map(_DUR, kept), dtype=np.float64, count=n)
        if np.isnan(ts_us).any() or np.isnan(dur_us).any():  # a missing (None) value may read as NaN
            raise TypeError
    except (TypeError, ValueError, OverflowError) as e:
        _explain_bad_event(path, events, index)
        raise InputError(f"{path}: an event's name, ts or dur is of the wrong type ({e})") from None
    pid = _ints(kept, "pid")
    tid = _ints(kept, "tid")
    # args: only of the kinds whose ids EMO reads, one column at a time
    need = np.flatnonzero(np.isin(codes, _ARG_CODES))
    args = list(map(attrgetter("args"), map(kept.__getitem__, need.tolist())))
    if set(map(type, args)) - {_Args}:  # args that are not an object carry nothing
        args = [a if type(a) is _Args else _NO_ARGS for a in args]
    ints = {}
    for field in _ARG_INTS:
        out = np.full(n, -1, np.int64)
        out[need] = _ints(args, field)
        ints[field] = out
    objects = {field: _objects(map(attrgetter(field), args), len(need)) for field in _ARG_OBJECTS}
    flow_ids, flow_ts = _flows(events, complete_all)
    return _Columns(
        rank=rank,
        world=world,
        info=info,
        index=index,
        codes=codes,
        name_codes=name_codes,
        name_values=name_values,
        ts_us=ts_us,
        dur_us=dur_us,
        pid=pid,
        tid=tid,
        need=need,
        ints=ints,
        objects=objects,
        warnings=warnings,
        flow_ids=flow_ids,
        flow_ts=flow_ts,
    )


def _table(path: Path, c: _Columns):
    """The event table from the columns (either path's), with the checks and warnings on them."""
    index, codes, name_codes, name_values, need = c.index, c.codes, c.name_codes, c.name_values, c.need
    kind_arr = _KIND_NAMES[codes]
    n = len(index)
    for vals, what in ((c.ts_us, "timestamp"), (c.dur_us, "duration")):
        big = np.abs(vals) > _MAX_US
        if big.any():
            i = int(np.argmax(big))
            raise InputError(
                f"{path}: event #{index[i]} ({kind_arr[i]} {name_values[name_codes[i]]!r}) has a {what} of "
                f"{vals[i]:g} us, beyond what int64 nanoseconds hold (about 106 days)"
            )
    ts, dur = _us_to_ns(c.ts_us), _us_to_ns(c.dur_us)
    if len(dur) and dur.min() < 0:
        i = int(np.argmin(dur))
        raise InputError(
            f"{path}: event #{index[i]} ({kind_arr[i]} {name_values[name_codes[i]]!r}) has a negative duration"
        )
    runtime = codes == _CODE["runtime"]
    hip = [s for s in name_values[pd.unique(name_codes[runtime])].tolist() if _HIP.match(str(s))]
    if hip:
        raise InputError(f"{path}: a ROCm/HIP trace ({min(hip)}); EMO reads NVIDIA CUDA traces only")
    pid, tid, col, obj = c.pid, c.tid, c.ints, c.objects
    m = len(need)
    gpu = np.isin(codes, [_CODE[k] for k in GPU_KINDS])
    is_sync = codes == _CODE["sync"]
    device = np.where(gpu, np.where(col["device"] >= 0, col["device"], pid), -1)
    stream = np.where(gpu, np.where((col["stream"] < 0) & ~is_sync, tid, col["stream"]), -1)
    sub = codes[need]
    sync_kind = np.full(n, "", dtype=object)
    sv = obj["cuda_sync_kind"]
    ss = sub == _CODE["sync"]
    sync_kind[need[ss]] = [str(x) for x in np.where(sv[ss] == _UNSET, name_values[name_codes[need[ss]]], sv[ss])]
    pg = np.full(n, "", dtype=object)
    granks = np.full(n, "", dtype=object)
    kern = sub == _CODE["kernel"]
    g = obj["pg_long"]
    g = np.where(g != _UNSET, g, obj["pg_name"])
    named = kern & (g != _UNSET)
    listed = np.zeros(m, bool)
    if named.any():
        pg[need[named]] = [str(x) for x in g[named]]
        r = obj["pg_ranks"]
        listed = kern & (r != _UNSET)
        granks[need[listed]] = [_rank_list(x) for x in r[listed]]
        groups = _group_ranks(c.info)
        cfg = named & ~listed
        granks[need[cfg]] = [groups.get(x, "") for x in pg[need[cfg]]]
    sync_kind, pg, granks = (
        _sparse_text(t, need[at]) for t, at in ((sync_kind, ss), (pg, named), (granks, named | listed))
    )
    warnings = c.warnings + _doubtful_ids(codes, col["stream"], col["device"], pid, tid)
    warnings += _dangling_flows(c.flow_ids, c.flow_ts, col["correlation"], ts, codes)
    table = normalise(
        {
            "rank": np.full(n, c.rank, np.int32),
            "world_size": np.full(n, c.world, np.int32),
            "device": device,
            "stream": stream,
            "pid": pid,
            "thread": tid,
            "kind": pd.Categorical.from_codes(codes - 1, KIND_CODES[1:]),
            "name": pd.Categorical.from_codes(name_codes, pd.Index(name_values, dtype=object)),
            "start_ns": ts,
            "dur_ns": dur,
            "correlation": col["correlation"],
            "external_id": col["external_id"],
            "sync_kind": sync_kind,
            "wait_event_corr": col["wait_on_cuda_event_record_corr_id"],
            "wait_stream": col["wait_on_stream"],
            "process_group": pg,
            "group_ranks": granks,
            "bytes": col["bytes"],
        }
    )
    table.attrs["warnings"] = warnings
    return table


# The phases of the Chrome trace format (every event must have one)
PHASES = frozenset("BEXiIbnesftPONDMVvRcCSTpF()")
_GPU_OP_CODES = [_CODE[k] for k in ("kernel", "memcpy", "memset")]
_HOST_CODES = [_CODE[k] for k in ("cpu_op", "annotation", "runtime")]
_FLOW_END_CODES = [_CODE[k] for k in ("runtime", "kernel", "memcpy", "memset", "sync")]


def _skipped(events: list, codes: np.ndarray, complete: np.ndarray) -> list[str]:
    """What says an event was damaged before it was skipped: no valid phase ('ph'), or a complete
    event ('X') without a category (Kineto gives every one; without it the event's kind is unknown)."""
    other = map(_PH, compress(events, ~complete))  # (str: a list is no phase, and unhashable)
    bad_ph = int((~complete).sum()) - sum(map(PHASES.__contains__, map(str, other)))
    unknown = np.flatnonzero(complete & (codes == 0)).tolist()  # few: Kineto's "Trace", python_function
    no_cat = sum(not isinstance(events[i].cat, str) for i in unknown)
    return _skipped_counts(bad_ph, no_cat)


def _skipped_counts(bad_ph: int, no_cat: int) -> list[str]:
    out = []
    if bad_ph:
        out.append(f"{bad_ph} events have no valid phase ('ph'): skipped, so what they were is missing")
    if no_cat:
        out.append(f"{no_cat} complete events have no category ('cat'): skipped, so what they were is missing")
    return out


def _doubtful_ids(codes, stream, device, pid, tid) -> list[str]:
    """GPU ops whose stream or device id is missing, not an integer, or not the track (tid, pid)
    Kineto draws them on, and host events without a thread: the graph's order would be made up."""
    op = np.isin(codes, _GPU_OP_CODES)
    m = int(op.sum())
    out = []
    for arg, ids, track, what in (("stream", stream, tid, "tid"), ("device", device, pid, "pid")):
        missing = int((op & (ids < 0)).sum())
        if missing:
            out.append(f"{missing} of {m} GPU ops have no valid {arg} id (args.{arg}): taken from their {what}")
        other = int((op & (ids >= 0) & (track >= 0) & (ids != track)).sum())
        if other:
            out.append(
                f"{other} of {m} GPU ops name a {arg} (args.{arg}) other than their track ({what}): {arg}s unsure"
            )
    host = np.isin(codes, _HOST_CODES)
    threadless = int((host & ((pid < 0) | (tid < 0))).sum())
    if threadless:
        out.append(f"{threadless} host events have no valid pid or tid: the thread each ran on is unknown")
    return out


def _flows(events: list, complete: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The launch flows' (ac2g) ids and times (us; NaN: not a number)."""
    other = list(compress(events, ~complete))  # flows are 's' and 'f' events: look among the non-'X' ones
    flows = list(compress(other, map(eq, map(_CAT, other), repeat("ac2g"))))
    ids = _ints(flows, "id")
    try:
        ts = np.fromiter(map(_TS, flows), dtype=np.float64, count=len(flows))
    except (TypeError, ValueError):
        ts = np.array([_float(t) for t in map(_TS, flows)])
    return ids, ts


def _dangling_flows(
    ids: np.ndarray, ts: np.ndarray, correlation: np.ndarray, start_ns: np.ndarray, codes: np.ndarray
) -> list[str]:
    """Kineto draws each launch -> GPU op link as flow events (ac2g) placed on both ends: a runtime
    call or GPU op with the flow's id as correlation id, starting at the flow's time. A flow with no
    such event means events were dropped or moved."""
    if not len(ids):
        return []
    ok = (ids >= 0) & (np.abs(ts) <= _MAX_US)
    at = np.isin(codes, _FLOW_END_CODES)
    c, t = np.r_[correlation[at], ids[ok]], np.r_[start_ns[at], _us_to_ns(ts[ok])]
    if not len(c):
        return []
    t = t - t.min()
    span, top = int(t.max()) + 1, int(c.max()) + 1
    if top * span >= 2**62:  # (a damaged trace's huge ids or times): their ranks among the values seen
        c, t = (np.unique(x, return_inverse=True)[1].astype(np.int64) for x in (c, t))
        span = int(t.max()) + 1
    key = c * span + t  # a (correlation, start) pair as one integer
    m = int(at.sum())
    have = np.sort(key[:m])
    pos = np.minimum(np.searchsorted(have, key[m:]), m - 1) if m else np.zeros(len(key), np.int64)
    lost = int((have[pos] != key[m:]).sum()) if m else len(key)
    if not lost:
        return []
    return [f"{lost} launch flows (ac2g) point at no event with their id at their time: events dropped or moved"]


def _float(v) -> float:
    return float(v) if type(v) in (int, float) else np.nan


def _group_ranks(info: dict) -> dict[str, str]:
    """Process group name -> its ranks ("0,1,2"), from distributedInfo.pg_config."""
    out = {}
    cfg = info.get("pg_config")
    for g in cfg if isinstance(cfg, list) else []:
        if isinstance(g, dict) and "pg_name" in g and isinstance(g.get("ranks"), list):
            out[str(g["pg_name"])] = _rank_list(g["ranks"])
    return out


def _rank_list(v) -> str:
    """A process group's ranks as written ("[0, 1]", [0, 1]) -> "0,1" ("" if unreadable)."""
    if isinstance(v, str):
        v = re.findall(r"-?\d+", v)
    try:
        return ",".join(str(int(r)) for r in v)
    except (TypeError, ValueError):
        return ""


def _sparse_text(col: np.ndarray, rows: np.ndarray) -> pd.Categorical:
    """A text column that is "" outside `rows`, coded from the values at those rows only."""
    values = col[rows]
    cats = pd.Index(list(dict.fromkeys(["", *values.tolist()])), dtype=object)
    codes = np.zeros(len(col), np.int64)
    codes[rows] = cats.get_indexer(values)
    return pd.Categorical.from_codes(codes, cats)


def _objects(values, n: int) -> np.ndarray:
    """A 1-d object array (np.array would nest list values)."""
    return np.fromiter(values, dtype=object, count=n)


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (ints, or floats with ns fractions) to int64 ns without float64 rounding at 1e18."""
    if us.dtype.kind in "iu":
        return us.astype(np.int64) * 1000
    if us.dtype.kind != "f":
        raise TypeError("non-numeric timestamp")
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.round((us - whole) * 1000).astype(np.int64)


def _ints(objs: list, field: str) -> np.ndarray:
    """Field `field` of every object as int64; anything not an integer (a string pid like "Spans",
    "12", 1.5, None) becomes -1."""
    get = attrgetter(field)
    try:  # (through operator.index: numpy alone would take "12" and 1.5 as numbers)
        return np.fromiter(map(index, map(get, objs)), dtype=np.int64, count=len(objs))
    except (TypeError, OverflowError):
        return np.array([_int(v) for v in map(get, objs)], dtype=np.int64)


def _explain_bad_event(path: Path, events: list, keep) -> None:
    for i in keep.tolist():
        ev = events[i]
        if ev.name is not None and not isinstance(ev.name, (str, int, float, bool)):
            raise InputError(
                f"{path}: event #{i} ({ev.cat}) has a name that is not text ({type(ev.name).__name__})"
            ) from None
        for field in ("ts", "dur", "name"):
            if getattr(ev, field) is None:
                raise InputError(f"{path}: event #{i} ({ev.cat}) lacks the field '{field}'") from None
        if not isinstance(ev.ts, (int, float)) or not isinstance(ev.dur, (int, float)):
            raise InputError(f"{path}: event #{i} ({ev.cat} {ev.name!r}) has a non-numeric ts/dur") from None
