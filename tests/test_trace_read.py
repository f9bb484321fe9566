"""emo.trace.read_trace on the real traces, and the one-line errors on bad ones."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from real_traces import TRACES, real  # noqa: E402  (bundled small traces, the rest from ../shared)

from emo.trace import COLUMNS, clip_window, read_trace

ALEXNET = TRACES / "hta_alexnet_a100_2stream_cudasync.json.gz"
ES1 = TRACES / "hta_event_sync_a100_1stream.json.gz"


def test_schema_fixed_names_and_dtypes():
    ev = read_trace(ALEXNET)
    assert list(ev.columns) == list(COLUMNS)
    for c, t in COLUMNS.items():
        assert (str(ev[c].dtype) == t) if t != "str" else ev[c].dtype.kind in "OT" or str(ev[c].dtype) == "str"
    assert (ev["dur_ns"] >= 0).all()
    assert np.all(np.diff(ev["start_ns"].to_numpy()) >= 0)
    counts = ev["kind"].value_counts()
    assert counts["kernel"] == 79 and counts["memcpy"] == 16 and counts["sync"] == 41
    sync = ev[ev["kind"] == "sync"]
    assert set(sync["sync_kind"]) >= {"Stream Sync", "Context Sync", "Stream Wait Event"}
    assert (sync.loc[sync["sync_kind"] == "Stream Wait Event", "wait_event_corr"] >= 0).any()


def test_folder_of_ranks():
    ev = read_trace(real("dlrm_8rank"))
    assert sorted(ev["rank"].unique()) == list(range(8))
    nccl = ev[ev["name"].str.startswith("nccl") & (ev["kind"] == "kernel")]
    assert nccl.groupby("rank").size().tolist() == [8] * 8
    assert (nccl["stream"] == 84).all()


def test_nsys_sqlite():
    ev = read_trace(real("pipit_nsys_cloverleaf_a100.sqlite"))
    assert (ev["kind"] == "kernel").sum() == 1312
    # syncType says "event sync"; the correlated cudaDeviceSynchronize says what it really is
    assert set(ev.loc[ev["kind"] == "sync", "sync_kind"]) == {"Context Sync"}
    assert "cudaLaunchKernel" in set(ev["name"])  # _v7000 suffix stripped


def test_clip_window_per_rank():
    ev = read_trace(ES1)
    w = clip_window(ev, "ProfilerStep", 0)
    assert 0 < len(w) <= len(ev)
    with pytest.raises(ValueError, match="instance 3 not found"):
        clip_window(ev, "ProfilerStep", 3)


def _write(tmp_path: Path, name: str, doc) -> Path:
    p = tmp_path / name
    p.write_bytes(json.dumps(doc).encode())
    return p


def _small_doc() -> dict:
    return json.loads(gzip.decompress(ES1.read_bytes()))


@pytest.mark.parametrize("content", [b"", b" \n\t "], ids=["empty", "whitespace only"])
def test_empty_file(tmp_path, content):
    p = tmp_path / "t.json"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=r"t\.json: empty file"):
        read_trace(p)


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzipped"])
def test_a_pipe_reads_like_the_file(gzipped):
    # `emo analyze <(zcat t.json.gz)`: a pipe can be read once, and SQLite cannot open one at all
    import os
    import threading

    data = ES1.read_bytes() if gzipped else gzip.decompress(ES1.read_bytes())
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    try:
        ev = read_trace(f"/dev/fd/{r}")
    finally:
        writer.join()
        os.close(r)
    assert ev.equals(read_trace(ES1))


def test_an_empty_pipe_is_named(tmp_path):
    import os

    r, w = os.pipe()
    os.close(w)
    try:
        with pytest.raises(ValueError, match=rf"^/dev/fd/{r}: empty file"):
            read_trace(f"/dev/fd/{r}")
    finally:
        os.close(r)


def test_truncated_json(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps(_small_doc()).encode()[:5000])
    with pytest.raises(ValueError, match=r"t\.json: truncated or malformed JSON"):
        read_trace(p)


@pytest.mark.parametrize("name", ["run.sqlite", "run.db"])
def test_a_file_named_as_an_nsys_export_that_is_not_one(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(b"not a database")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}: not an SQLite database \(an nsys export"):
        read_trace(p)


def test_truncated_gzip(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(ES1.read_bytes()[:1500])
    with pytest.raises(ValueError, match=r"t\.json\.gz: cannot read"):
        read_trace(p)


def test_missing_field(tmp_path):
    doc = _small_doc()
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    del k["dur"]
    with pytest.raises(ValueError, match=r"t\.json: event #\d+ \(kernel\) lacks the field 'dur'"):
        read_trace(_write(tmp_path, "t.json", doc))


def test_events_out_of_order(tmp_path):
    doc = _small_doc()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[1]["ts"] = kernels[0]["ts"] + 0.5 * kernels[0]["dur"] - 5  # overlaps its predecessor
    kernels[0]["dur"] += 20
    with pytest.raises(ValueError, match=r"t\.json: events out of order"):
        read_trace(_write(tmp_path, "t.json", doc))


def test_kernel_before_its_launch(tmp_path):
    doc = _small_doc()
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    k["ts"] -= 10_000
    with pytest.raises(ValueError, match=r"events out of order"):
        read_trace(_write(tmp_path, "t.json", doc))


def test_hip_trace_refused(tmp_path):
    doc = _small_doc()
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaLaunchKernel":
            e["name"] = "hipLaunchKernel"
    with pytest.raises(ValueError, match=r"t\.json: a ROCm/HIP trace"):
        read_trace(_write(tmp_path, "t.json", doc))


def test_no_gpu_activity_refused(tmp_path):
    doc = _small_doc()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    with pytest.raises(ValueError, match=r"t\.json: no GPU activity"):
        read_trace(_write(tmp_path, "t.json", doc))


def test_not_a_trace(tmp_path):
    with pytest.raises(ValueError, match=r"t\.json: not a Chrome/Kineto trace"):
        read_trace(_write(tmp_path, "t.json", {"hello": 1}))


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "nope.json")


def test_duplicate_rank_in_folder(tmp_path):
    doc = _small_doc()
    _write(tmp_path, "a.json", doc)
    _write(tmp_path, "b.json", doc)
    with pytest.raises(ValueError, match="same rank"):
        read_trace(tmp_path)


def test_older_capitalised_categories(tmp_path):
    doc = _small_doc()
    old = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy"}
    for e in doc["traceEvents"]:
        e["cat"] = old.get(e.get("cat"), e.get("cat"))
    new = read_trace(ES1)
    ev = read_trace(_write(tmp_path, "t.json", doc))
    assert ev["kind"].value_counts().to_dict() == new["kind"].value_counts().to_dict()


def test_driver_launches_link_like_runtime_ones(tmp_path):
    from emo.graph import build_graph

    doc = _small_doc()
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaLaunchKernel":
            e["name"], e["cat"] = "cuLaunchKernel", "cuda_driver"
    g = build_graph(read_trace(_write(tmp_path, "t.json", doc)))
    assert (g.edges["kind"] == "launch").sum() == (g.nodes["kind"].isin(["kernel", "memcpy"])).sum()


def test_folder_read_in_parallel_equals_serial(monkeypatch):
    import emo.trace.ranks as ranks

    serial = read_trace(real("dlrm_8rank"))
    monkeypatch.setattr(ranks, "PARALLEL_BYTES", 0)  # worker processes even for these small files
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert ranks.readers(sorted(real("dlrm_8rank").iterdir())) == 4
    parallel = read_trace(real("dlrm_8rank"))
    assert parallel.equals(serial)


def test_parallel_reader_passes_the_one_line_error_on(tmp_path, monkeypatch):
    import emo.trace.ranks as ranks

    monkeypatch.setattr(ranks, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    _write(tmp_path, "a.json", _small_doc())
    (tmp_path / "b.json").write_bytes(b'{"traceEvents": [')
    with pytest.raises(ValueError, match=r"b\.json: truncated or malformed JSON"):
        read_trace(tmp_path)


def test_plain_json_reads_like_its_gzip(tmp_path):
    """A plain file (parsed from a memory map), its gzipped copy, the bare-array form with leading
    whitespace: the same table."""
    doc = _small_doc()
    plain, bare = tmp_path / "t.json", tmp_path / "bare.json"
    plain.write_text(json.dumps(doc))
    bare.write_text("  \n" + json.dumps(doc["traceEvents"]))
    want = read_trace(ES1)
    assert read_trace(plain).equals(want)
    assert read_trace(bare).equals(want)


def test_missing_name_is_one_line(tmp_path):
    doc = _small_doc()
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    del k["name"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"t\.json: event #\d+ \(kernel\) lacks the field 'name'"):
        read_trace(p)
