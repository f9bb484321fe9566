"""A seeded fuzz of `emo analyze` (issue 36): a few hundred mutations of the bundled traces (fields
removed, replaced by lists, huge or negative ids, text for numbers, deep nesting, events dropped or
duplicated, bytes cut or flipped, gzip members spliced). Each must end in one line and an exit
status != 0, or in an analysis whose replay error is 0 and which, where its numbers are not the
undamaged trace's, carries a warning (issue 48): never a traceback, and within memory."""

from __future__ import annotations

import copy
import gzip
import io
import json
import random
import resource
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from emo.cli import main

BUNDLED = sorted((Path(__file__).resolve().parent / "data" / "traces").glob("*.json.gz"))
CASES = 300
SEED = 36
WEIRD = [
    [],
    ["k"],
    {"a": 1},
    2**63,
    2**64 + 5,
    -(2**63) - 1,
    -1,
    0,
    1e308,
    -1e308,
    "12",
    "x",
    None,
    True,
    2**31,
    1.5,
    "",
    [[[1]]],
]
FIELDS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "args"]
ARGS = [
    "correlation",
    "External id",
    "device",
    "stream",
    "wait_on_cuda_event_record_corr_id",
    "wait_on_stream",
    "Process Group Name",
    "Process Group Ranks",
    "cuda_sync_kind",
    "bytes",
]


def _events(doc):
    return doc["traceEvents"]


def mutate(doc: dict, rng: random.Random) -> bytes | dict:
    """One mutation of a parsed trace: a new document, or raw bytes for byte-level damage."""
    doc = copy.deepcopy(doc)
    ev = _events(doc)
    op = rng.randrange(16)
    if op == 0:  # a field removed from some events
        f = rng.choice(FIELDS)
        for e in rng.sample(ev, max(1, len(ev) // rng.choice([1, 5, 50]))):
            e.pop(f, None)
    elif op == 1:  # a field replaced by something of the wrong type or size
        f, w = rng.choice(FIELDS), rng.choice(WEIRD)
        for e in rng.sample(ev, max(1, len(ev) // rng.choice([1, 10, 100]))):
            e[f] = copy.deepcopy(w)
    elif op == 2:  # an arg replaced
        a, w = rng.choice(ARGS), rng.choice(WEIRD)
        for e in rng.sample(ev, max(1, len(ev) // rng.choice([1, 10, 100]))):
            if isinstance(e.get("args"), dict):
                e["args"][a] = copy.deepcopy(w)
    elif op == 3:  # correlation ids removed (the dependencies a breakdown needs)
        for e in ev:
            if isinstance(e.get("args"), dict):
                e["args"].pop(rng.choice(["correlation", "External id"]), None)
    elif op == 4:  # the runtime calls removed
        doc["traceEvents"] = [e for e in ev if e.get("cat") not in ("cuda_runtime", "cuda_driver", "Runtime")]
    elif op == 5:  # events dropped
        doc["traceEvents"] = [e for e in ev if rng.random() > rng.choice([0.05, 0.3, 0.8])]
    elif op == 6:  # events duplicated
        doc["traceEvents"] = ev + rng.sample(ev, max(1, len(ev) // 10))
    elif op == 7:  # order shuffled
        rng.shuffle(ev)
    elif op == 8:  # times shifted
        for e in rng.sample(ev, max(1, len(ev) // 5)):
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += rng.choice([-1e9, -5, 3, 1e6, 1e15])
    elif op == 9:  # distributedInfo damaged
        doc["distributedInfo"] = rng.choice(
            [
                {"rank": 2**31},
                {"rank": -5},
                {"rank": "x"},
                {"world_size": 2**40},
                {"rank": 1, "world_size": 1},
                [],
                "x",
                {"pg_config": [{"pg_name": [1]}]},
            ]
        )
    elif op == 10:  # deep nesting
        depth = rng.choice([200, 1000, 5000])
        ev[rng.randrange(len(ev))]["args"] = json.loads("[" * depth + "]" * depth) if depth < 900 else None
        raw = json.dumps(doc).encode()
        if depth >= 900:
            raw = raw.replace(b'"args": null', b'"args": ' + b"[" * depth + b"]" * depth, 1)
        return raw
    elif op == 11:  # the document's shape
        return rng.choice(
            [
                {"traceEvents": {}},
                {"traceEvents": [1, 2]},
                {"traceEvents": [[]]},
                [],
                {},
                5,
                "x",
                {"traceEvents": [None]},
                {"traceEvents": ev[:1]},
            ]
        )
    elif op == 12:  # bytes cut
        raw = json.dumps(doc).encode()
        return raw[: rng.randrange(len(raw))]
    elif op == 13:  # bytes flipped
        raw = bytearray(json.dumps(doc).encode())
        for _ in range(rng.choice([1, 5, 50])):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    elif op == 14:  # one event's times made huge, ids made huge
        e = rng.choice(ev)
        e["ts"], e["dur"] = rng.choice([(2**62, 1), (1, 2**62), (1e20, 1), (-1e20, 1), (0, -1)])
    else:  # names: unicode, very long, lists
        for e in rng.sample(ev, max(1, len(ev) // 10)):
            e["name"] = rng.choice(["\u202e\x00", "x" * 100000, ["a"], 7, "ncclKernel_AllReduce"])
    return doc


def _write(case, path: Path, rng: random.Random) -> None:
    raw = case if isinstance(case, bytes) else json.dumps(case).encode()
    if rng.random() < 0.5:
        raw = gzip.compress(raw, compresslevel=1)
        if rng.random() < 0.1:  # a damaged gzip stream
            raw = raw[: len(raw) // 2] if rng.random() < 0.5 else raw[:10] + bytes(50) + raw[60:]
        path = path.with_suffix(".json.gz")
    path.write_bytes(raw)
    return path


def _numbers(s: dict) -> tuple[float, float, float]:
    """What a damaged trace must not change without saying so: total slack, critical path, its GPU time."""
    return round(sum(s["slack_us"].values()), 3), s["critical_path_us"], s["breakdown_us"]["gpu_compute"]


def run_case(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", str(path), "--json"])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.skipif(not BUNDLED, reason="no bundled traces")
def test_fuzzed_traces_end_in_one_line_or_an_exact_replay(tmp_path):
    rng = random.Random(SEED)
    docs = [json.loads(gzip.decompress(p.read_bytes())) for p in BUNDLED]
    clean = [_numbers(json.loads(run_case(p)[1])) for p in BUNDLED]
    failures = []
    for i in range(CASES):
        path = _write(mutate(docs[i % len(docs)], rng), tmp_path / f"case{i}.json", rng)
        try:
            code, out, err = run_case(path)
        except BaseException as e:  # a traceback: what the user must never see
            failures.append(f"case {i}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if code == 0:
            s = json.loads(out)
            if s["replay_error_us"] != 0:
                failures.append(f"case {i}: replay error {s['replay_error_us']} us")
            if not s["warnings"] and _numbers(s) != clean[i % len(docs)]:
                failures.append(f"case {i}: {_numbers(s)}, undamaged {clean[i % len(docs)]}, and no warning")
        elif not (err.startswith("emo: error: ") and err.count("\n") == 1 and str(path) in err):
            failures.append(f"case {i}: exit {code}, stderr {err[:300]!r}")
        path.unlink()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    assert not failures, f"{len(failures)} of {CASES}:\n" + "\n".join(failures[:40])
    assert peak_gb < 2.0, f"peak memory {peak_gb:.2f} GB"
