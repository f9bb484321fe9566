"""`emo analyze` says when it is unsure (issue 48, item 7): a trace damaged in a way that changes the
answer without breaking it (stream ids missing or not integers, an event without its phase or
category, a host event without its thread, events dropped or moved, part of a run's ranks, an nsys
export whose StringIds do not name its calls) is refused or answered with `warnings`, never a
confident number; the undamaged real traces carry none."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from emo.cli import main
from tests.real_traces import real

GPU_OPS = ("kernel", "gpu_memcpy", "gpu_memset")


def analyze(path, capsys) -> tuple[int, dict | None, str]:
    code = main(["analyze", str(path), "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else None, out.err


def doc(name: str) -> dict:
    return json.loads(gzip.decompress(real(name).read_bytes()))


def write(path: Path, d: dict) -> Path:
    path.write_text(json.dumps(d))
    return path


def warned(s: dict, *words: str) -> bool:
    return any(all(w in x for w in words) for x in s["warnings"])


ES1 = "hta_event_sync_a100_1stream.json.gz"
AX = "hta_alexnet_a100_2stream_cudasync.json.gz"


@pytest.mark.parametrize("name", [ES1, AX, "hta_event_sync_a100_3stream.json.gz"])
def test_the_bundled_traces_carry_no_warning(capsys, name):
    code, s, _ = analyze(real(name), capsys)
    assert code == 0 and s["warnings"] == []


def test_stream_ids_written_as_text_are_not_ids(tmp_path, capsys):
    """Was: "12" read as stream 12, and the 1-stream trace's slack 76 us instead of 10, no note."""
    clean = analyze(real(ES1), capsys)[1]
    d = doc(ES1)
    for e in [e for e in d["traceEvents"] if e.get("cat") in GPU_OPS][::2]:
        e["args"]["stream"] = "12"
    code, s, _ = analyze(write(tmp_path / "t.json", d), capsys)
    assert code == 0 and warned(s, "no valid stream id", "tid")
    assert s["slack_us"] == clean["slack_us"]  # taken from the track Kineto drew them on


@pytest.mark.parametrize("value", [0, None])
def test_a_stream_id_missing_or_other_than_its_track_is_flagged(tmp_path, capsys, value):
    d = doc(AX)
    for e in [e for e in d["traceEvents"] if e.get("cat") in GPU_OPS][::2]:
        if value is None:
            e["args"].pop("stream")
        else:
            e["args"]["stream"] = value
    code, s, _ = analyze(write(tmp_path / "t.json", d), capsys)
    assert code == 0
    assert warned(s, "no valid stream id") if value is None else warned(s, "other than their track (tid)")


def test_a_device_id_other_than_its_track_is_flagged(tmp_path, capsys):
    d = doc(AX)
    for e in [e for e in d["traceEvents"] if e.get("cat") == "kernel"][:3]:
        e["args"]["device"] = 12
    code, s, _ = analyze(write(tmp_path / "t.json", d), capsys)
    assert code == 0 and warned(s, "3 of 98 GPU ops name a device", "(pid)")


def _one_removed(field: str, name: str) -> dict:
    d = doc(ES1)
    e = next(e for e in d["traceEvents"] if e.get("name") == name and e.get("ph") == "X")
    e.pop(field)
    return d


@pytest.mark.parametrize(
    ("field", "name", "words"),
    [
        # was: slack 100 us instead of 10, no note
        ("ph", "cudaStreamSynchronize", ("no valid phase ('ph')",)),
        ("cat", "cudaStreamSynchronize", ("no category ('cat')",)),
        # was: gpu_compute 0 on the critical path instead of 36 us, no note
        ("pid", "cudaEventSynchronize", ("no valid pid or tid",)),
        ("tid", "cudaEventSynchronize", ("no valid pid or tid",)),
    ],
)
def test_one_event_without_a_field_is_flagged(tmp_path, capsys, field, name, words):
    code, s, _ = analyze(write(tmp_path / "t.json", _one_removed(field, name)), capsys)
    assert code == 0 and warned(s, *words), s["warnings"]


def test_a_skipped_gpu_op_leaves_its_launch_flow_pointing_at_nothing(tmp_path, capsys):
    d = doc(ES1)
    kernel = next(e for e in d["traceEvents"] if e.get("cat") == "kernel")
    d["traceEvents"].remove(kernel)
    code, s, _ = analyze(write(tmp_path / "t.json", d), capsys)
    assert code == 0 and warned(s, "1 launch flows (ac2g) point at no event", "dropped or moved")


def test_an_event_moved_far_in_time_is_flagged(tmp_path, capsys):
    """Was: a critical path of 1000 s (a cpu_op moved 1000 s back), no note."""
    d = doc(ES1)
    next(e for e in d["traceEvents"] if e.get("cat") == "cpu_op")["ts"] -= 1e9
    code, s, _ = analyze(write(tmp_path / "t.json", d), capsys)
    assert code == 0 and warned(s, "an idle gap of 1e+03 s", "events shifted in time?")


def _dlrm_half(tmp_path: Path, with_info: bool) -> Path:
    folder = tmp_path / "dlrm4"
    folder.mkdir()
    for f in sorted(real("dlrm_8rank").glob("*.json.gz"))[:4]:
        d = json.loads(gzip.decompress(f.read_bytes()))
        if not with_info:
            d.pop("distributedInfo")
        write(folder / f.name.removesuffix(".gz"), d)
    return folder


def test_half_of_a_run_without_distributed_info_is_not_a_complete_run(tmp_path, capsys):
    """Was: 4 of 8 DLRM ranks analysed as a complete 4-rank job, every collective matched, no note."""
    code, s, _ = analyze(_dlrm_half(tmp_path, with_info=False), capsys)
    assert code == 0 and warned(s, "4 ranks, but the trace does not say how many the run had")


def test_half_of_a_run_says_which_ranks_are_absent(tmp_path, capsys):
    code, s, _ = analyze(_dlrm_half(tmp_path, with_info=True), capsys)
    assert code == 0 and warned(s, "4 of the run's 8 ranks are absent from the trace (4-7)")


def test_the_whole_dlrm_run_says_only_what_its_window_cut(capsys):
    code, s, _ = analyze(real("dlrm_8rank"), capsys)
    assert code == 0 and len(s["warnings"]) == 1 and warned(s, "128 GPU ops have no launching call")


def _nsys(tmp_path: Path, *sql: str) -> Path:
    p = tmp_path / "run.sqlite"
    shutil.copy(real("pipit_nsys_cloverleaf_a100.sqlite"), p)
    p.chmod(0o644)
    con = sqlite3.connect(p)
    for q in sql:
        con.execute(q)
    con.commit()
    con.close()
    return p


def test_the_nsys_export_carries_no_warning(tmp_path, capsys):
    code, s, _ = analyze(real("pipit_nsys_cloverleaf_a100.sqlite"), capsys)
    assert code == 0 and s["warnings"] == []


@pytest.mark.parametrize(
    "sql", ["delete from StringIds", "update StringIds set id = id + 100000", "update StringIds set value = 'x'"]
)
def test_an_nsys_export_whose_string_table_names_no_call_is_refused(tmp_path, capsys, sql):
    """Was: read as 100 % CPU (every launch and synchronisation unnamed), exit 0."""
    p = _nsys(tmp_path, sql)
    code, _, err = analyze(p, capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{p}: 3048 of 3048 CUDA API calls" in err and "StringIds" in err


def test_an_nsys_export_with_its_synchronising_calls_unnamed_is_refused(tmp_path, capsys):
    """Was: gpu_compute 46143 us on the critical path instead of 294405 (each cudaDeviceSynchronize
    unnamed, so no wait), exit 0 and no note."""
    p = _nsys(tmp_path, "delete from StringIds where value like 'cudaDevice%'")
    code, _, err = analyze(p, capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{p}: 1312 of 1312 synchronising CUDA calls have no name in StringIds" in err


def test_an_nsys_export_with_some_other_calls_unnamed_is_flagged(tmp_path, capsys):
    clean = analyze(real("pipit_nsys_cloverleaf_a100.sqlite"), capsys)[1]
    p = _nsys(tmp_path, "delete from StringIds where value like 'cudaMalloc%' or value like 'cudaLaunch%'")
    code, s, _ = analyze(p, capsys)
    assert code == 0 and warned(s, "1388 of 3048 CUDA API calls", "not recognised")
    assert s["critical_path_us"] == clean["critical_path_us"]


def test_kernels_unnamed_in_an_nsys_export_are_flagged(tmp_path, capsys):
    p = _nsys(
        tmp_path, "delete from StringIds where id in (select demangledName from CUPTI_ACTIVITY_KIND_KERNEL limit 1)"
    )
    code, s, _ = analyze(p, capsys)
    assert code == 0 and warned(s, "kernels have no name in StringIds")


def test_warnings_are_printed_and_reach_the_graph_summary(tmp_path, capsys):
    from emo.graph import build_graph, summary
    from emo.trace import read_trace

    p = write(tmp_path / "t.json", _one_removed("ph", "cudaStreamSynchronize"))
    assert main(["analyze", str(p)]) == 0
    assert "warning: 1 events have no valid phase ('ph')" in capsys.readouterr().out
    events = read_trace(p)
    events.to_parquet(tmp_path / "events.parquet")  # as the trace stage hands them to the graph stage
    s = summary(build_graph(pd.read_parquet(tmp_path / "events.parquet")))
    assert any("no valid phase" in w for w in s["warnings"])


def test_the_graph_stage_logs_the_warnings_and_writes_them(tmp_path, caplog):
    import logging

    from emo.stages import graph as stage
    from emo.trace import read_trace

    read_trace(write(tmp_path / "t.json", _one_removed("ph", "cudaStreamSynchronize"))).to_parquet(
        tmp_path / "events.parquet"
    )
    (tmp_path / "measured.json").write_text("{}")  # a recorded trace: nothing measured
    out = tmp_path / "out"
    out.mkdir()
    with caplog.at_level(logging.WARNING, logger="emo"):
        stage.run({}, {"events": tmp_path / "events.parquet", "measured": tmp_path / "measured.json"}, out)
    assert "graph: 1 events have no valid phase ('ph')" in caplog.text
    assert any("no valid phase" in w for w in json.loads((out / "summary.json").read_text())["warnings"])
