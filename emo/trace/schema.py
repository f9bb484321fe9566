"""The normalised event table every trace reader produces (one row per traced interval).

Columns, in this order and with these dtypes (units in the names, all times int64 nanoseconds on
the trace's own clock, so ranks recorded on one host share a time base):

| column          | dtype  | meaning                                                              |
|-----------------|--------|----------------------------------------------------------------------|
| rank            | int32  | distributed rank (Kineto `distributedInfo.rank`, else file order)     |
| world_size      | int32  | ranks the run had (`distributedInfo.world_size`), -1 if not written   |
| device          | int32  | GPU index for GPU rows, -1 for host rows                              |
| stream          | int64  | CUDA stream for GPU rows (and for syncs that name one), else -1       |
| pid             | int64  | process id (host rows) / trace pid (GPU rows)                         |
| thread          | int64  | host thread id; for GPU rows the trace tid                            |
| kind            | str    | one of KINDS below                                                    |
| name            | str    | operator / runtime call / kernel name                                 |
| start_ns        | int64  | start                                                                 |
| dur_ns          | int64  | duration (>= 0)                                                       |
| correlation     | int64  | CUDA correlation id linking a runtime call to its GPU work, else -1   |
| external_id     | int64  | profiler external id (links cpu_op to its runtime calls), else -1     |
| sync_kind       | str    | cuda_sync rows: "Stream Sync", "Context Sync", "Event Sync", "Stream Wait Event"; else "" |
| wait_event_corr | int64  | cuda_sync: correlation of the cudaEventRecord waited on, else -1      |
| wait_stream     | int64  | cuda_sync: stream the waited event was recorded on, else -1           |
| process_group   | str    | collective kernels: process group name when the trace gives it        |
| group_ranks     | str    | collective kernels: the group's global ranks ("0,1,2,3") when the trace names them (kernel args "Process Group Ranks", or `distributedInfo.pg_config`), else "" |
| bytes           | int64  | memcpy/memset bytes, else -1                                          |

Rows are sorted by (rank, start_ns, -dur_ns) so parents come before the children they enclose.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# Host-side kinds, then GPU-side kinds.
HOST_KINDS = ("cpu_op", "annotation", "runtime")
GPU_OP_KINDS = ("kernel", "memcpy", "memset")
KINDS = HOST_KINDS + GPU_OP_KINDS + ("sync", "gpu_annotation")

COLUMNS: dict[str, str] = {
    "rank": "int32",
    "world_size": "int32",
    "device": "int32",
    "stream": "int64",
    "pid": "int64",
    "thread": "int64",
    "kind": "str",
    "name": "str",
    "start_ns": "int64",
    "dur_ns": "int64",
    "correlation": "int64",
    "external_id": "int64",
    "sync_kind": "str",
    "wait_event_corr": "int64",
    "wait_stream": "int64",
    "process_group": "str",
    "group_ranks": "str",
    "bytes": "int64",
}

# Runtime/driver calls that put one kernel or copy on a stream (HTA's list, plus the driver call).
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "cudaLaunchCooperativeKernel",
    }
)


def empty_events() -> pd.DataFrame:
    return normalise({c: [] for c in COLUMNS})


def normalise(columns: dict) -> pd.DataFrame:
    """Build the table from column arrays with the fixed names, order and dtypes, sorted.

    A column missing from `columns` is "not known" (-1, ""). The rows are ordered on the plain
    arrays, so each column is converted into the frame once."""
    n = len(columns["start_ns"])

    def array(c: str, t: str) -> np.ndarray:
        v = columns.get(c, "" if t == "str" else -1)
        if isinstance(v, pd.Categorical):  # a text column already coded by its reader
            return v
        v = np.asarray(v.to_numpy() if isinstance(v, pd.Series) else v, dtype=object if t == "str" else None)
        return np.full(n, v.item(), dtype=v.dtype) if v.ndim == 0 else v

    a = {c: array(c, t) for c, t in COLUMNS.items()}
    order = np.lexsort((-a["dur_ns"].astype(np.int64), a["start_ns"].astype(np.int64), a["rank"].astype(np.int64)))
    # (copy=False: each column its own block; stacking same-dtype columns would copy them all once more)
    return pd.DataFrame(
        {c: _text(a[c][order]) if t == "str" else a[c][order].astype(t, copy=False) for c, t in COLUMNS.items()},
        copy=False,
    )


def _text(values: np.ndarray) -> pd.Series:
    """A str column; built from its distinct values (names repeat: a trace has few distinct kernels)."""
    if isinstance(values, pd.Categorical):
        codes, uniques = values.codes, values.categories.to_numpy(dtype=object)
    else:
        codes, uniques = pd.factorize(values)
    if len(codes) and codes.min() < 0:  # a missing value: let pandas say what it makes of it
        return pd.Series(np.asarray(values, dtype=object), dtype="str")
    try:
        return text_column(codes, uniques)
    except (TypeError, ValueError, ArithmeticError):  # not all str: let pandas convert them
        return pd.Series(np.asarray(values, dtype=object), dtype="str")


def text_column(codes: np.ndarray, values) -> pd.Series:
    """The str column values[codes] (codes >= 0), built in Arrow from the distinct values."""
    arr = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values, pa.large_string()))
    return pd.Series(arr.cast(pa.large_string()), dtype="str")


def arrow_text(s) -> pa.ChunkedArray:
    """A str column (Series or array) as Arrow strings."""
    a = s.array if isinstance(s, pd.Series) else s
    if hasattr(a, "__arrow_array__"):
        return a.__arrow_array__()
    return pa.chunked_array([pa.array(np.asarray(a, dtype=object), pa.large_string())])


def text_at(s, rows=None, isin=None, contains: str | None = None, startswith: str | None = None) -> np.ndarray:
    """Of a str column (Series or array), at `rows` (default all): its values (objects), or whether
    each is in `isin`, contains `contains` or starts with `startswith` (Arrow compute: no Python
    object per row for those)."""
    arr = arrow_text(s)
    if rows is not None:
        arr = arr.take(pa.array(np.asarray(rows, np.int64)))
    if isin is not None:
        return pc.is_in(arr, value_set=pa.array(sorted(isin), arr.type)).to_numpy(zero_copy_only=False)
    if contains is not None:
        return pc.match_substring(arr, contains).to_numpy(zero_copy_only=False)
    if startswith is not None:
        return pc.starts_with(arr, startswith).to_numpy(zero_copy_only=False)
    return arr.to_numpy(zero_copy_only=False)


# NCCL collective/point-to-point kernels are named ncclKernel_*, ncclDevKernel_*
NCCL_PREFIX = "nccl"
