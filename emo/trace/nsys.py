"""Nsight Systems SQLite exports (`nsys export --type sqlite`) into the normalised event table.

Uses the CUPTI_ACTIVITY_KIND_{RUNTIME,KERNEL,MEMCPY,MEMSET,SYNCHRONIZATION} tables and StringIds.
A synchronisation row's kind is taken from the runtime call it shares a correlationId with:
nsys 2024 writes syncType 1 (event sync) even for cudaDeviceSynchronize, so syncType is not trusted."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Literal, overload

import numpy as np
import pandas as pd

from emo.errors import InputError
from emo.trace.schema import normalise

SQLITE_MAGIC = b"SQLite format 3\x00"
_VERSION_SUFFIX = re.compile(r"_v\d+$")  # cudaLaunchKernel_v7000 -> cudaLaunchKernel
_CUDA_CALL = r"^cu[A-Z]|^cuda[A-Z]"  # what CUPTI_ACTIVITY_KIND_RUNTIME records: runtime and driver API calls
# More CUDA calls than this share unnamed by StringIds: refused (which call launches or waits is unknown)
UNNAMED_CALLS_SHARE = 0.5
SYNC_KIND_OF_CALL = {
    "cudaDeviceSynchronize": "Context Sync",
    "cudaCtxSynchronize": "Context Sync",
    "cudaStreamSynchronize": "Stream Sync",
    "cudaEventSynchronize": "Event Sync",
    "cudaStreamWaitEvent": "Stream Wait Event",
}
COPY_KIND = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
NULLABLE = {"bytes", "copyKind"}
NO_STREAM = 4294967295  # nsys writes UINT32_MAX where a sync names no stream


@overload
def _table(con: sqlite3.Connection, path: Path, name: str, columns: str, required: Literal[True]) -> pd.DataFrame: ...


@overload
def _table(
    con: sqlite3.Connection, path: Path, name: str, columns: str, required: bool = False
) -> pd.DataFrame | None: ...


def _table(con: sqlite3.Connection, path: Path, name: str, columns: str, required: bool = False) -> pd.DataFrame | None:
    """The named columns of a table (None if the table is absent); a missing column is a one-line error."""
    have = {r[1] for r in con.execute(f"pragma table_info({name})")}
    if not have:
        if required:
            raise InputError(f"{path}: nsys export without a {name} table ({REQUIRED[name]})")
        return None
    missing = [c.strip() for c in columns.split(",") if c.strip() not in have]
    if missing:
        raise InputError(f"{path}: table {name} lacks the column {missing[0]!r} (an nsys export EMO cannot read)")
    return _numbers(pd.read_sql_query(f"select {columns} from {name}", con), path, name)


def _numbers(t: pd.DataFrame, path: Path, name: str) -> pd.DataFrame:
    """Every column but StringIds' text as int64: SQLite keeps whatever a row was given (text in a
    time column, NULL, 1e30), which is said here, naming the file, table, column and row."""
    for c in t.columns:
        if name == "StringIds" and c == "value":
            t[c] = t[c].astype(str)
            continue
        col = t[c]
        if col.dtype.kind in "iu":
            continue
        num = pd.to_numeric(col, errors="coerce")
        if c in NULLABLE:  # not every export fills them
            num = num.where(col.notna(), -1)
        bad = num.isna() | (num.abs() >= 2**63) | (num != num.round())
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            v = "NULL" if pd.isna(col.iat[i]) else repr(col.iat[i])
            raise InputError(f"{path}: table {name}, column {c}, row {i + 1} holds {v}: not an integer")
        t[c] = num.astype(np.int64)
    return t


# Tables without which an export cannot be analysed, and why
REQUIRED = {
    "StringIds": "not an nsys SQLite export",
    "CUPTI_ACTIVITY_KIND_KERNEL": "no kernel was traced: profile with `nsys profile --trace=cuda`",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "no CUDA API call was traced, so nothing says which host call launched "
    "which GPU op: profile with `nsys profile --trace=cuda`",
}


def read_nsys(path: Path) -> pd.DataFrame:
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise InputError(f"{path}: not a readable SQLite database ({e})") from None
    try:
        return _read(con, path)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as e:
        raise InputError(f"{path}: unreadable nsys export ({e})") from None
    finally:
        con.close()


def _runtime(con: sqlite3.Connection, path: Path, name_of: dict, warnings: list[str]):
    """(the runtime calls' table or None, their names, [their rows]) of CUPTI_ACTIVITY_KIND_RUNTIME; a
    HIP trace is refused, calls without a name are said in `warnings`."""
    rt = _table(con, path, "CUPTI_ACTIVITY_KIND_RUNTIME", "start, end, globalTid, correlationId, nameId", required=True)
    if rt is None or not len(rt):
        return rt, pd.Series([], dtype=object), []
    names = rt["nameId"].map(name_of).astype(object).fillna("").map(lambda s: _VERSION_SUFFIX.sub("", s))
    if names.str.match(r"^hip[A-Z]").any():
        raise InputError(f"{path}: a ROCm/HIP trace; EMO reads NVIDIA CUDA traces only")
    warnings += _unnamed_calls(path, names)
    gtid = rt["globalTid"].to_numpy(np.int64)
    rows = pd.DataFrame(
        {
            "device": -1,
            "stream": -1,
            "pid": (gtid >> 24) & 0xFFFFFF,
            "thread": gtid & 0xFFFFFF,
            "kind": "runtime",
            "name": names,
            "start": rt["start"],
            "end": rt["end"],
            "correlation": rt["correlationId"],
        }
    )
    return rt, names, [rows]


def _syncs(con: sqlite3.Connection, path: Path, rt, names: pd.Series, call_of_corr: dict) -> list[pd.DataFrame]:
    """[the synchronisations' rows] of CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, each of the kind its call
    names; one on no stream waits on the whole context."""
    y = _table(
        con, path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "start, end, deviceId, streamId, correlationId, globalPid"
    )
    if y is None or not len(y):
        return []
    if rt is not None and len(rt):
        _unnamed_syncs(path, names, rt["correlationId"], y["correlationId"])
    kind = y["correlationId"].map(call_of_corr).map(SYNC_KIND_OF_CALL).fillna("Unknown Sync")
    rows = _gpu_rows(y, "sync", kind)
    rows["stream"] = np.where(y["streamId"].to_numpy() == NO_STREAM, -1, y["streamId"])
    rows["thread"] = rows["stream"]
    rows["sync_kind"] = kind
    return [rows]


def _read(con: sqlite3.Connection, path: Path) -> pd.DataFrame:
    strings = _table(con, path, "StringIds", "id, value", required=True)
    name_of = dict(zip(strings["id"], strings["value"]))
    warnings: list[str] = []
    rt, names, parts = _runtime(con, path, name_of, warnings)
    call_of_corr = dict(zip(rt["correlationId"], names)) if rt is not None and len(rt) else {}
    k = _table(
        con,
        path,
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "start, end, deviceId, streamId, correlationId, globalPid, demangledName",
        required=True,
    )
    if k is not None and len(k):
        unnamed = int((~k["demangledName"].isin(name_of.keys())).sum())
        if unnamed:
            warnings.append(f"{unnamed} of {len(k)} kernels have no name in StringIds (demangledName): named '?'")
        parts.append(_gpu_rows(k, "kernel", k["demangledName"].map(name_of).fillna("?")))
    m = _table(
        con,
        path,
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "start, end, deviceId, streamId, correlationId, globalPid, bytes, copyKind",
    )
    if m is not None and len(m):
        parts.append(_gpu_rows(m, "memcpy", "Memcpy " + m["copyKind"].map(COPY_KIND).fillna("?"), m["bytes"]))
    s = _table(
        con, path, "CUPTI_ACTIVITY_KIND_MEMSET", "start, end, deviceId, streamId, correlationId, globalPid, bytes"
    )
    if s is not None and len(s):
        parts.append(_gpu_rows(s, "memset", pd.Series("Memset", index=s.index), s["bytes"]))
    parts += _syncs(con, path, rt, names, call_of_corr)
    if not parts:
        return normalise({"start_ns": [], "dur_ns": []})
    df = pd.concat(parts, ignore_index=True)
    if (df["end"] < df["start"]).any():
        bad = df[df["end"] < df["start"]].iloc[0]
        raise InputError(f"{path}: events out of order: {bad['kind']} {bad['name']!r} ends before it starts")
    n = len(df)
    table = normalise(
        {
            "rank": np.zeros(n, np.int32),
            "device": df["device"],
            "stream": df["stream"],
            "pid": df["pid"],
            "thread": df["thread"],
            "kind": df["kind"],
            "name": df["name"],
            "start_ns": df["start"],
            "dur_ns": df["end"] - df["start"],
            "correlation": df["correlation"],
            "external_id": np.full(n, -1),
            "sync_kind": df.get("sync_kind", pd.Series("", index=df.index)).fillna(""),
            "wait_event_corr": np.full(n, -1),
            "wait_stream": np.full(n, -1),
            "process_group": np.full(n, ""),
            "bytes": df.get("bytes", pd.Series(-1, index=df.index)).fillna(-1),
        }
    )
    table.attrs["warnings"] = warnings
    return table


def _unnamed_syncs(path: Path, names: pd.Series, call_corr: pd.Series, sync_corr: pd.Series) -> None:
    """A call that waited on the GPU (its correlation id has a SYNCHRONIZATION row) without its name:
    whether it waited for one stream, an event or the whole device is unknown, and so is the graph."""
    bad = ~names.str.match(_CUDA_CALL) & call_corr.isin(sync_corr)
    if bad.any():
        raise InputError(
            f"{path}: {int(bad.sum())} of {int(call_corr.isin(sync_corr).sum())} synchronising CUDA calls have no "
            "name in StringIds: what each waited for is unknown (a damaged export?)"
        )


def _unnamed_calls(path: Path, names: pd.Series) -> list[str]:
    """CUDA API calls whose name StringIds does not give (or gives as something no CUDA call is
    named): a launch or a synchronisation among them is not recognised, and the time reads as CPU."""
    bad = int((~names.str.match(_CUDA_CALL)).sum())
    if not bad:
        return []
    what = f"{bad} of {len(names)} CUDA API calls (CUPTI_ACTIVITY_KIND_RUNTIME.nameId) have no CUDA call's name in StringIds"
    if bad > UNNAMED_CALLS_SHARE * len(names):
        raise InputError(f"{path}: {what}: which calls launch or wait is unknown (a damaged export?)")
    return [f"{what}: launches or waits among them are not recognised"]


def _gpu_rows(t: pd.DataFrame, kind: str, names: pd.Series, nbytes=None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "device": t["deviceId"],
            "stream": t["streamId"],
            "pid": (t["globalPid"].to_numpy(np.int64) >> 24) & 0xFFFFFF,
            "thread": t["streamId"],
            "kind": kind,
            "name": names.astype(str),
            "start": t["start"],
            "end": t["end"],
            "correlation": t["correlationId"],
            "bytes": nbytes if nbytes is not None else -1,
        }
    )
