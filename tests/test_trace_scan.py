"""The Kineto reader's two paths give one answer: the compiled scan of the JSON text
(emo.trace.kineto_scan) and msgspec's typed decode give the same table, warnings and errors, on the
real traces and on damaged copies of one (or the scan hands the file to the typed decode)."""

from __future__ import annotations

import gzip
import json
import random

import pandas as pd
import pytest
from real_traces import TRACES

from emo.trace import kineto

ALEXNET = TRACES / "hta_alexnet_a100_2stream_cudasync.json.gz"
NAMES = [
    "hta_alexnet_a100_2stream_cudasync.json.gz",
    "hta_event_sync_a100_1stream.json.gz",
    "hta_event_sync_a100_3stream.json.gz",
    "dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz",
]


def outcome(path, scan: bool):
    """The table, or the error's text; None where the scan leaves the file to the typed decode."""
    try:
        cols = kineto._scanned_columns(path, None) if scan else kineto._decoded_columns(path, None)
        return None if cols is None else kineto._table(path, cols)
    except ValueError as e:
        return str(e)


def assert_same(path) -> bool:
    fast, typed = outcome(path, True), outcome(path, False)
    if fast is None:
        return False
    if isinstance(fast, str) or isinstance(typed, str):
        assert fast == typed
    else:
        pd.testing.assert_frame_equal(fast, typed, check_exact=True)
        assert fast.attrs["warnings"] == typed.attrs["warnings"]
    return True


@pytest.mark.parametrize("name", NAMES)
def test_the_scan_reads_real_traces_as_the_typed_decode(name):
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"{name}: not here")
    assert assert_same(path)  # (and the scan took it)


VALUES = [None, "abc", 1.5, True, [1], {"a": 1}, -1, 0, 2**70, "é", 1e300, -0.0, 12345678901234567.891]
VALUES += [1.23456789012345678e15, 0.001, "X", "ac2g", "kernel", "cuda_sync", "hipLaunchKernel", "", 1700000000000.123]
KEYS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args"]
ARGS = ["correlation", "External id", "device", "stream", "wait_on_cuda_event_record_corr_id", "wait_on_stream"]
ARGS += ["bytes", "cuda_sync_kind", "Process Group Name", "pg_name", "Process Group Ranks"]


@pytest.mark.parametrize("seed", range(40))
def test_damaged_copies_get_one_answer(tmp_path, seed):
    """Fields of odd types or missing, odd args, escapes, numbers past the scan's exact range."""
    rng = random.Random(seed)
    doc = json.loads(gzip.open(ALEXNET).read())
    events = doc["traceEvents"]
    for _ in range(rng.randint(1, 4)):
        e = rng.choice(events)
        r = rng.random()
        if r < 0.4:
            e[rng.choice(KEYS)] = rng.choice(VALUES)
        elif r < 0.6:
            e.pop(rng.choice(KEYS), None)
        elif r < 0.9:
            e["args"] = e["args"] if isinstance(e.get("args"), dict) else {}
            e["args"][rng.choice(ARGS)] = rng.choice(VALUES)
        else:
            e["name"] = str(e.get("name", "")) + rng.choice(["\n", '"', "\\", "é", "\u2028"])
    text = json.dumps(doc, ensure_ascii=seed % 2 == 0, indent=1 if seed % 3 == 0 else None)
    if seed % 5 == 0:  # a name spelt with an escape, as well as without
        text = text.replace('"name": "', '"name": "\\u0061', 3)
    if seed % 7 == 0:
        text = json.dumps(events)  # the bare-array form
    path = tmp_path / "t.json"
    path.write_text(text)
    assert_same(path)


def test_flows_without_a_time_and_escaped_names(tmp_path):
    doc = json.loads(gzip.open(ALEXNET).read())
    flow = next(e for e in doc["traceEvents"] if e.get("cat") == "ac2g")
    flow["ts"] = None
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc).replace('"name": "', '"name": "\\u0061', 5))
    assert assert_same(path)
