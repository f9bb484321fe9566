"""emo.trace.cupti: CUPTI activity rows (as the tracer normalises them) -> Kineto JSON that the
project's trace reader accepts. The rows are what cupti-python would hand over; no GPU needed."""

from __future__ import annotations

import pytest

from emo.trace.cupti import CuptiTracer, import_cupti, to_kineto

T0 = 1_000_000_000  # ns


def _rows():
    rt = lambda corr, name, start, dur, cbid=211: {  # noqa: E731
        "kind": "runtime",
        "name": name,
        "cbid": cbid,
        "start": T0 + start,
        "end": T0 + start + dur,
        "process_id": 42,
        "thread_id": 43,
        "correlation_id": corr,
    }
    return [
        {"kind": "context", "context_id": 1, "device_id": 0},
        rt(10, "cudaLaunchKernel_v7000", 1_000, 5_000),
        {
            "kind": "kernel",
            "name": "gemm",
            "start": T0 + 8_000,
            "end": T0 + 58_000,
            "device_id": 0,
            "context_id": 1,
            "stream_id": 7,
            "correlation_id": 10,
            "grid": (108, 1, 1),
            "block": (256, 1, 1),
            "registers_per_thread": 64,
            "shared_memory": 49152,
        },
        rt(11, "cudaEventRecord", 7_000, 1_000, cbid=135),
        {"kind": "cuda_event", "context_id": 1, "stream_id": 7, "correlation_id": 11, "event_id": 5},
        rt(12, "cudaStreamWaitEvent", 9_000, 1_000, cbid=147),
        {
            "kind": "sync",
            "sync_type": "STREAM_WAIT_EVENT",
            "start": T0 + 9_000,
            "end": T0 + 9_500,
            "context_id": 1,
            "stream_id": 13,
            "correlation_id": 12,
            "cuda_event_id": 5,
        },
        rt(13, "cudaMemcpyAsync", 10_000, 2_000, cbid=41),
        {
            "kind": "memcpy",
            "copy_kind": "DTOH",
            "bytes": 4096,
            "start": T0 + 60_000,
            "end": T0 + 61_000,
            "device_id": 0,
            "context_id": 1,
            "stream_id": 7,
            "correlation_id": 13,
        },
        rt(14, "cudaStreamSynchronize", 12_000, 50_000, cbid=131),
        {
            "kind": "sync",
            "sync_type": "STREAM_SYNCHRONIZE",
            "start": T0 + 12_000,
            "end": T0 + 62_000,
            "context_id": 1,
            "stream_id": 7,
            "correlation_id": 14,
            "cuda_event_id": 0,
        },
    ]


def test_rows_become_kineto_events():
    d = to_kineto(_rows(), steps_ns=[T0, T0 + 63_000], pid=42, tid=43)
    ev = d["traceEvents"]
    by_cat = {}
    for e in ev:
        by_cat.setdefault(e.get("cat"), []).append(e)
    k = by_cat["kernel"][0]
    assert (k["pid"], k["tid"], k["ts"], k["dur"]) == (0, 7, 1_000_008.0, 50.0)  # device, stream, us
    assert k["args"]["correlation"] == 10 and k["args"]["grid"] == [108, 1, 1]
    launch = next(e for e in by_cat["cuda_runtime"] if e["args"]["correlation"] == 10)
    assert launch["name"] == "cudaLaunchKernel" and (launch["pid"], launch["tid"]) == (42, 43)  # _v7000 gone
    flows = by_cat["ac2g"]
    assert {(f["ph"], f["id"]) for f in flows} == {("s", 10), ("f", 10), ("s", 13), ("f", 13)}
    wait = next(e for e in by_cat["cuda_sync"] if e["name"] == "Stream Wait Event")
    assert wait["args"]["wait_on_cuda_event_record_corr_id"] == 11 and wait["args"]["wait_on_stream"] == 7
    assert wait["tid"] == 13
    assert by_cat["gpu_memcpy"][0]["name"] == "Memcpy DtoH" and by_cat["gpu_memcpy"][0]["args"]["bytes"] == 4096
    assert [e["name"] for e in by_cat["user_annotation"]] == ["ProfilerStep#0"]
    assert [e["ts"] for e in ev if e["ph"] != "M"] == sorted(e["ts"] for e in ev if e["ph"] != "M")


def test_the_project_reader_accepts_the_tracer_output(tmp_path):
    from emo.io import write_json
    from emo.trace import read_trace

    path = tmp_path / "cupti.json.gz"
    write_json(path, to_kineto(_rows(), steps_ns=[T0, T0 + 63_000], pid=42, tid=43), gz=True)
    events = read_trace(path)
    assert (events["kind"] == "kernel").sum() == 1
    assert len(events) >= 5


def test_missing_cupti_python_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupti", None)  # as if not installed
    with pytest.raises(RuntimeError, match="pip install 'emo\\[gpu\\]'"):
        import_cupti()
    with pytest.raises(RuntimeError, match="cupti-python is not installed"):
        with CuptiTracer():
            pass


def test_activity_records_are_normalised_with_the_real_enums(monkeypatch):
    """Fake activity records (attribute names from cupti-python's stubs), real cupti enums."""
    from types import SimpleNamespace as NS

    c = pytest.importorskip("cupti.cupti")
    monkeypatch.setattr(c, "get_callback_name", lambda domain, cbid: "cudaLaunchKernel_v7000")
    K = c.ActivityKind
    t = CuptiTracer()
    t._cupti = c
    t._completed(
        [
            NS(
                kind=K.CONCURRENT_KERNEL,
                name="k",
                start=5,
                end=9,
                device_id=0,
                context_id=1,
                stream_id=7,
                correlation_id=3,
                grid_x=2,
                grid_y=1,
                grid_z=1,
                block_x=128,
                block_y=1,
                block_z=1,
                registers_per_thread=32,
                static_shared_memory=0,
                dynamic_shared_memory=1024,
            ),
            NS(kind=K.RUNTIME, cbid=211, start=1, end=4, process_id=9, thread_id=9, correlation_id=3),
            NS(
                kind=K.MEMCPY,
                copy_kind=int(c.ActivityMemcpyKind.HTOD),
                bytes=64,
                start=10,
                end=12,
                device_id=0,
                context_id=1,
                stream_id=7,
                correlation_id=4,
            ),
            NS(
                kind=K.SYNCHRONIZATION,
                type=int(c.ActivitySynchronizationType.CONTEXT_SYNCHRONIZE),
                start=12,
                end=20,
                context_id=1,
                stream_id=0xFFFFFFFF,
                correlation_id=5,
                cuda_event_id=0,
            ),
            NS(kind=K.MARKER),  # kinds the trace does not use are dropped
        ]
    )
    kinds = [r["kind"] for r in t.rows]
    assert kinds == ["kernel", "runtime", "memcpy", "sync"]
    assert t.rows[0]["shared_memory"] == 1024 and t.rows[2]["copy_kind"] == "HTOD"
    assert t.rows[3]["sync_type"] == "CONTEXT_SYNCHRONIZE"
    ev = to_kineto(t.rows, pid=9, tid=9)["traceEvents"]
    sync = next(e for e in ev if e.get("cat") == "cuda_sync")
    assert sync["name"] == "Context Sync" and sync["tid"] == -1
    assert next(e for e in ev if e.get("cat") == "cuda_runtime")["name"] == "cudaLaunchKernel"
