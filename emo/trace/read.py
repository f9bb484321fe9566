"""Format dispatch (a registry of trace formats) and the checks every trace must pass before a
graph is built from it.

A format is a name, a test on a path and its first bytes, and a reader to the normalised event table
(emo.trace.schema). read_trace tries the registered formats in order: plugins first (register_trace_format
or the entry-point group `emo.trace_formats`), then the per-rank folder, an Nsight Systems SQLite
export, and Kineto JSON, which takes any other file. A new format is its reader module, a line in
FORMATS and a line in docs/analyze.md; a package outside EMO registers its own.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pandas as pd

from emo.errors import InputError
from emo.trace.kineto import read_kineto
from emo.trace.nsys import SQLITE_MAGIC, read_nsys
from emo.trace.ranks import read_ranks
from emo.trace.schema import text_at

TRACE_SUFFIXES = (".json", ".json.gz")
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")  # named as an nsys export, read as one
# Kineto rounds GPU timestamps to whole microseconds; allow that much overlap on one stream.
STREAM_OVERLAP_TOLERANCE_NS = 1_000
# A pipe or device is copied to a temporary file (it can be read once; SQLite needs a file); past this
# it is refused, so that /dev/zero cannot fill $TMPDIR. A larger trace is read from a file.
SPOOL_LIMIT_BYTES = 2 << 30


@dataclass(frozen=True)
class TraceFormat:
    name: str
    matches: Callable[[Path, bytes], bool]  # (a folder or a regular file, its first 16 bytes; b"" for a folder)
    read: Callable[[Path], pd.DataFrame]  # -> the event table (emo.trace.schema); ValueError for bad content


def trace_files(folder: Path) -> list[Path]:
    """The Kineto files of a per-rank folder, in name order."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def read_rank_folder(path: Path) -> pd.DataFrame:
    files = trace_files(path)
    if not files:
        raise InputError(f"{path}: folder holds no Kineto trace files (*.json, *.json.gz)")
    parts = read_ranks(files)
    ranks = [int(p["rank"].iloc[0]) for p in parts if len(p)]
    if len(set(ranks)) != len(ranks):
        raise InputError(f"{path}: several files claim the same rank ({sorted(ranks)})")
    check_one_run(files, parts)
    events = pd.concat(parts, ignore_index=True)
    events = events.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    events.attrs["warnings"] = [f"{f.name}: {w}" for f, p in zip(files, parts) for w in p.attrs.get("warnings", [])]
    return events


def _sqlite(path: Path, head: bytes) -> bool:
    if head != SQLITE_MAGIC and path.suffix in SQLITE_SUFFIXES:
        raise InputError(f"{path}: not an SQLite database (an nsys export: nsys export --type sqlite)")
    return head == SQLITE_MAGIC


FORMATS: list[TraceFormat] = [
    TraceFormat("kineto-folder", lambda p, head: p.is_dir(), read_rank_folder),
    TraceFormat("nsys-sqlite", _sqlite, read_nsys),
    TraceFormat("kineto", lambda p, head: not p.is_dir(), read_kineto),
]
_plugins_loaded = False


def register_trace_format(fmt: TraceFormat) -> None:
    """Add a format; it is tried before the built-in ones (a plugin may claim a file Kineto would)."""
    FORMATS[:] = [f for f in FORMATS if f.name != fmt.name]
    FORMATS.insert(0, fmt)


def trace_format(path: Path, head: bytes) -> TraceFormat:
    """The first registered format that takes `path` (plugins of `emo.trace_formats` loaded on first use)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for ep in entry_points(group="emo.trace_formats"):
            ep.load()  # the plugin's module calls register_trace_format
    for fmt in FORMATS:
        if fmt.matches(path, head):
            return fmt
    raise InputError(f"{path}: not a trace format EMO reads ({', '.join(f.name for f in FORMATS)})")


def read_trace(path: str | Path) -> pd.DataFrame:
    """Read a trace file or a folder of per-rank Kineto files into the normalised event table."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        events = trace_format(path, b"").read(path)
    else:
        with regular_file(path) as local:
            try:
                with local.open("rb") as f:
                    head = f.read(16)
                events = trace_format(path, head).read(local)  # matched on the name the user gave
            except ValueError as e:  # name the user's path, not the spooled copy (and name it at all)
                text = str(e).replace(str(local), str(path))
                raise InputError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    validate_events(events, path)
    events.attrs["warnings"] = [*events.attrs.get("warnings", []), *rank_set_warnings(events), *gap_warnings(events)]
    return events


# An idle gap (no event on any rank) this many times longer than all the trace's busy time is noted
GAP_FACTOR = 100


def rank_set_warnings(events: pd.DataFrame) -> list[str]:
    """What is unsure about the set of ranks: some of the run's ranks absent, or several ranks whose
    trace does not say how many the run had (a part of a run would read as a complete smaller one)."""
    ranks = sorted(int(r) for r in pd.unique(events["rank"]))
    world = events["world_size"].to_numpy(np.int64)
    w = int(world.max())
    if w > 0:
        absent = sorted(set(range(w)) - set(ranks))
        if absent:
            return [
                f"{len(absent)} of the run's {w} ranks are absent from the trace ({rank_ranges(absent)}): "
                "collectives with them are not matched and what they waited for is unseen"
            ]
    if len(ranks) > 1 and (world < 0).any():
        return [
            f"{len(ranks)} ranks, but the trace does not say how many the run had (no distributedInfo.world_size): "
            f"analysed as a complete {len(ranks)}-rank run; if it had more, its collectives and waits are wrong"
        ]
    return []


def gap_warnings(events: pd.DataFrame) -> list[str]:
    """An idle gap with no event at all that is much longer than all the trace's busy time: a few
    events shifted far in time (a damaged file) read as a long idle time on the critical path."""
    start = events["start_ns"].to_numpy(np.int64)
    end = start + events["dur_ns"].to_numpy(np.int64)
    o = np.argsort(start, kind="stable")
    start, reach = start[o], np.maximum.accumulate(end[o])
    gaps = start[1:] - reach[:-1]  # > 0: nothing runs between the events before and the one after
    if not len(gaps) or gaps.max() <= 0:
        return []
    g = int(gaps.max())
    busy = int(reach[-1] - start[0]) - int(gaps[gaps > 0].sum())
    if g <= GAP_FACTOR * max(busy, 1):
        return []
    return [
        f"an idle gap of {g / 1e9:.3g} s with no event on any rank, {g / max(busy, 1):.0f}x all the busy time: "
        "events shifted in time?"
    ]


def rank_ranges(ranks: list[int]) -> str:
    """[2, 3, 4, 7] -> "2-4, 7"."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(f"{ranks[i]}-{ranks[j]}" if j > i else str(ranks[i]))
        i = j + 1
    return ", ".join(out)


@contextlib.contextmanager
def regular_file(path: Path):
    """`path` itself when it is a regular file; otherwise (a pipe, `<(zcat trace.json.gz)`, which can
    be read only once, and which SQLite cannot open) a temporary copy of what it holds."""
    if path.is_file():
        yield path
        return
    if not path.is_fifo() and not path.is_char_device():  # a socket, a block device: not a trace
        raise InputError(f"{path}: not a file, a folder or a pipe")
    # removed however the command ends: `emo analyze` turns SIGTERM and SIGHUP into an exception
    with tempfile.TemporaryDirectory(prefix="emo-trace-") as tmp:
        local = Path(tmp) / "trace"
        with path.open("rb") as src, local.open("wb") as dst:
            copied = 0
            while chunk := src.read(1 << 20):
                copied += len(chunk)
                if copied > SPOOL_LIMIT_BYTES:
                    raise InputError(
                        f"{path}: more than {SPOOL_LIMIT_BYTES >> 20} MiB from a pipe or device: "
                        "refused; save the trace to a file and analyse that"
                    )
                dst.write(chunk)
        yield local


def check_one_run(files: list[Path], parts: list[pd.DataFrame]) -> None:
    """Refuse a folder whose files are not the ranks of one run: world sizes that disagree, or a
    rank whose events all lie after another rank's last one (different runs or different steps)."""
    worlds = {f: int(p["world_size"].iat[0]) for f, p in zip(files, parts) if len(p) and p["world_size"].iat[0] > 0}
    if len(set(worlds.values())) > 1:
        by_size = sorted(worlds.items(), key=lambda x: x[1])
        (f0, w0), (f1, w1) = by_size[0], by_size[-1]
        raise InputError(f"{f1}: world_size {w1}, but {f0.name} says {w0}: ranks of different runs?")
    spans = [
        (int(p["start_ns"].min()), int((p["start_ns"] + p["dur_ns"]).max()), f) for f, p in zip(files, parts) if len(p)
    ]
    if len(spans) > 1:
        first_end = min(spans, key=lambda s: s[1])
        last_start = max(spans, key=lambda s: s[0])
        if last_start[0] > first_end[1]:
            gap = (last_start[0] - first_end[1]) / 1e9
            raise InputError(
                f"{last_start[2]}: its events start {gap:.3g} s after the last event of "
                f"{first_end[2].name}: the files are not ranks of one run (or not of the same steps)"
            )


def validate_events(events: pd.DataFrame, path) -> None:
    """Refuse tables a graph cannot be built from: no GPU work, GPU work out of order, or
    correlation ids that name two different launches."""
    if events.empty:
        raise InputError(f"{path}: no trace events")
    kind = events["kind"]
    gpu = text_at(kind, isin=("kernel", "memcpy", "memset"))
    if not gpu.any():
        raise InputError(f"{path}: no GPU activity (no kernel, memcpy or memset events): nothing to analyse")
    rank, device, stream = (events[c].to_numpy(np.int64) for c in ("rank", "device", "stream"))
    start = events["start_ns"].to_numpy(np.int64)
    end = start + events["dur_ns"].to_numpy(np.int64)
    corr = events["correlation"].to_numpy(np.int64)
    rows = np.flatnonzero(gpu)
    o = rows[np.lexsort((start[rows], stream[rows], device[rows], rank[rows]))]
    same = (rank[o][1:] == rank[o][:-1]) & (device[o][1:] == device[o][:-1]) & (stream[o][1:] == stream[o][:-1])
    overlap = same & (start[o][1:] < end[o][:-1] - STREAM_OVERLAP_TOLERANCE_NS)
    if overlap.any():
        i = o[int(np.flatnonzero(overlap)[0]) + 1]
        raise InputError(
            f"{path}: events out of order: {events['name'].iat[i][:60]!r} starts before the previous op on "
            f"rank {rank[i]} stream {stream[i]} ends"
        )
    # A GPU op cannot start before the host call that launched it.
    calls = np.flatnonzero(text_at(kind, isin=("runtime",)) & (corr >= 0))
    calls = calls[np.lexsort((calls, corr[calls], rank[calls]))]  # per (rank, correlation): the outermost first
    first = np.r_[True, (rank[calls][1:] != rank[calls][:-1]) | (corr[calls][1:] != corr[calls][:-1])][: len(calls)]
    _check_nested(events, path, calls, first, start, end, corr)
    launch = calls[first]
    ops = rows[corr[rows] >= 0]
    key_l = rank[launch] * (1 << 40) + corr[launch]  # ranks < 2^23, correlation ids < 2^40
    key_o = rank[ops] * (1 << 40) + corr[ops]
    pos = np.searchsorted(key_l, key_o)
    hit = pos < len(key_l)
    hit[hit] = key_l[pos[hit]] == key_o[hit]
    ops, call = ops[hit], launch[pos[hit]]
    early = start[ops] < start[call] - STREAM_OVERLAP_TOLERANCE_NS
    if early.any():
        i = ops[int(np.argmax(early))]
        raise InputError(
            f"{path}: events out of order: {events['name'].iat[i][:60]!r} starts before the call "
            f"that launched it (correlation {corr[i]})"
        )
    _check_unique_ops(events, path, ops, call, text_at(kind, ops, isin=("kernel",)), rank, corr)


def unlaunched(events: pd.DataFrame) -> tuple[int, int]:
    """(GPU ops whose launching runtime call is not in the trace, GPU ops): an op without one has no
    known launch dependency (no correlation id, or the runtime calls were not recorded)."""
    kind = events["kind"]
    gpu = np.flatnonzero(text_at(kind, isin=("kernel", "memcpy", "memset")))
    corr = events["correlation"].to_numpy(np.int64)
    rank = events["rank"].to_numpy(np.int64)
    calls = np.flatnonzero(text_at(kind, isin=("runtime",)) & (corr >= 0))
    launched = np.isin(rank[gpu] * (1 << 40) + corr[gpu], rank[calls] * (1 << 40) + corr[calls]) & (corr[gpu] >= 0)
    return int((~launched).sum()), len(gpu)


def _check_nested(events, path, calls, first, start, end, corr) -> None:
    """Runtime calls sharing a correlation id are one launch seen at two levels (runtime API and
    the driver call inside it), so they nest; two separate calls with one id mean merged traces."""
    head = np.maximum.accumulate(np.where(first, np.arange(len(calls)), 0))
    outer = calls[head]
    apart = ~first & (corr[calls] > 0) & ((start[calls] < start[outer]) | (end[calls] > end[outer]))
    if apart.any():
        i, j = calls[int(np.argmax(apart))], outer[int(np.argmax(apart))]
        raise InputError(
            f"{path}: correlation id {corr[i]} is used by two separate runtime calls "
            f"({events['name'].iat[j]!r} and {events['name'].iat[i]!r}, rank {events['rank'].iat[i]}): "
            "ids must be unique per rank (were traces of different runs merged?)"
        )


def _check_unique_ops(events, path, ops, call, is_kernel, rank, corr) -> None:
    """One launch puts one op on a stream, except a CUDA graph launch, which puts a whole graph
    (`is_kernel`: per op)."""
    keep = corr[ops] > 0
    ops, call, is_kernel = ops[keep], call[keep], is_kernel[keep]
    if len(ops) < 2:
        return
    key = np.c_[rank[ops], corr[ops], is_kernel]
    o = np.lexsort(key.T[::-1])
    dup = np.r_[False, (np.diff(key[o], axis=0) == 0).all(axis=1)]
    if not dup.any():
        return
    names = events["name"].to_numpy(dtype=object)
    graph = np.array(["Graph" in str(n) for n in names[call[o][dup]]])
    if (~graph).any():
        i = ops[o][dup][int(np.argmax(~graph))]
        raise InputError(
            f"{path}: correlation id {corr[i]} is shared by several GPU ops ({names[i][:60]!r} ...) "
            f"on rank {rank[i]}, but was launched by one {names[call[o][dup][int(np.argmax(~graph))]]!r}: "
            "ids must be unique per rank (were traces of different runs merged?)"
        )
