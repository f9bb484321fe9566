"""`emo analyze` on bad input: one line `emo: error: FILE: problem`, exit != 0, nothing written
(issue 13's list), and partial rank sets that are matched only where every member is present."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from emo.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared real traces not present")
ES1 = TRACES / "hta_event_sync_a100_1stream.json.gz"
NSYS = TRACES / "pipit_nsys_cloverleaf_a100.sqlite"
DLRM = sorted((TRACES / "dlrm_8rank").glob("*.json.gz"))


def analyze(argv, capsys) -> tuple[int, str, str]:
    code = main(["analyze", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str, *parts: str) -> None:
    assert err.count("\n") == 1 and err.startswith("emo: error: "), err
    for p in parts:
        assert p in err, (p, err)


def doc(path: Path = ES1) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def write(path: Path, d: dict) -> Path:
    path.write_bytes(json.dumps(d).encode())
    return path


def nsys_copy(tmp_path: Path, *sql: str) -> Path:
    p = tmp_path / "run.sqlite"
    shutil.copy(NSYS, p)
    p.chmod(0o644)
    con = sqlite3.connect(p)
    for q in sql:
        con.execute(q)
    con.commit()
    con.close()
    return p


def test_an_annotation_the_trace_lacks_names_the_file_and_the_option(capsys):
    code, _, err = analyze([ES1, "--annotation", "NoSuch"], capsys)
    assert code == 2
    one_line(err, f"{ES1}: --annotation 'NoSuch': instance 0 not found on rank 0 (0 instance(s))")


def test_nsys_missing_column(tmp_path, capsys):
    p = nsys_copy(tmp_path, "alter table CUPTI_ACTIVITY_KIND_KERNEL drop column demangledName")
    code, _, err = analyze([p], capsys)
    assert code == 2
    one_line(err, f"{p}: table CUPTI_ACTIVITY_KIND_KERNEL lacks the column 'demangledName'")


@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"])
def test_nsys_without_kernel_or_runtime_table(tmp_path, capsys, table):
    p = nsys_copy(tmp_path, f"drop table {table}")
    code, _, err = analyze([p], capsys)
    assert code == 2
    one_line(err, f"{p}: nsys export without a {table} table", "--trace=cuda")


def test_folder_mixing_runs_by_time(tmp_path, capsys):
    shutil.copy(DLRM[0], tmp_path / DLRM[0].name)
    late = doc(DLRM[1])
    for e in late["traceEvents"]:
        if "ts" in e:
            e["ts"] += 154 * 86400e6  # the same job 154 days later
    write(tmp_path / "worker1.json", late)
    code, _, err = analyze([tmp_path], capsys)
    assert code == 2
    one_line(err, "worker1.json: its events start", "not ranks of one run")


def test_folder_mixing_world_sizes(tmp_path, capsys):
    shutil.copy(DLRM[0], tmp_path / DLRM[0].name)
    other = doc(DLRM[1])
    other["distributedInfo"]["world_size"] = 4
    write(tmp_path / "worker1.json", other)
    code, _, err = analyze([tmp_path], capsys)
    assert code == 2
    one_line(err, "world_size 8", "says 4", "ranks of different runs")


def test_duplicated_correlation_on_separate_calls(tmp_path, capsys):
    d = doc()
    launch = next(e for e in d["traceEvents"] if e.get("name") == "cudaLaunchKernel")
    end = max(e["ts"] + e.get("dur", 0) for e in d["traceEvents"] if "ts" in e)
    d["traceEvents"].append({**launch, "ts": end + 100})  # a second call reusing the id
    p = write(tmp_path / "t.json", d)
    code, _, err = analyze([p], capsys)
    assert code == 2
    one_line(err, f"{p}: correlation id {launch['args']['correlation']} is used by two separate runtime calls")


def test_duplicated_correlation_on_gpu_ops(tmp_path, capsys):
    d = doc()
    kernel = next(e for e in d["traceEvents"] if e.get("cat") == "kernel")
    end = max(e["ts"] + e.get("dur", 0) for e in d["traceEvents"] if "ts" in e)
    d["traceEvents"].append({**kernel, "ts": end + 100})  # a second kernel of one launch
    p = write(tmp_path / "t.json", d)
    code, _, err = analyze([p], capsys)
    assert code == 2
    one_line(err, f"{p}: correlation id {kernel['args']['correlation']} is shared by several GPU ops")


def test_hip_runtime_category_refused(tmp_path, capsys):
    d = doc()
    for e in d["traceEvents"]:
        if e.get("cat") == "cuda_runtime":
            e["cat"] = "hip_runtime"
    p = write(tmp_path / "t.json", d)
    code, _, err = analyze([p], capsys)
    assert code == 2
    one_line(err, f"{p}: a ROCm/HIP trace (category 'hip_runtime')")


def test_duration_beyond_int64_ns(tmp_path, capsys):
    d = doc()
    next(e for e in d["traceEvents"] if e.get("cat") == "kernel")["dur"] = 1e16
    p = write(tmp_path / "t.json", d)
    code, _, err = analyze([p], capsys)
    assert code == 2
    one_line(err, f"{p}: event #", "has a duration of 1e+16 us, beyond what int64 nanoseconds hold")
    assert "negative" not in err


def _failing(exc: OSError):
    def fail(*a, **k):
        raise exc

    return fail


def test_perfetto_to_read_only_folder(tmp_path, capsys, monkeypatch):
    import emo.io

    monkeypatch.setattr(emo.io.os, "open", _failing(PermissionError(errno.EACCES, "Permission denied")))
    out = tmp_path / "ro" / "out.json"
    out.parent.mkdir()
    code, text, err = analyze([ES1, "--perfetto", out], capsys)
    assert code == 2 and text == ""
    one_line(err, f"{out}: cannot write (Permission denied)")
    assert not out.exists()


def test_perfetto_to_full_disk_leaves_nothing(tmp_path, capsys, monkeypatch):
    import emo.io

    class Full:
        def __init__(self, path, *a, **k):
            self.f = open(path, "wb")

        def write(self, data):
            self.f.write(data[: len(data) // 2])  # half of it lands, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    monkeypatch.setattr(emo.io.gzip, "open", Full)
    out = tmp_path / "out.json.gz"
    code, _, err = analyze([ES1, "--perfetto", out], capsys)
    assert code == 2
    one_line(err, f"{out}: cannot write (No space left on device)")
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_closed_pipe_is_not_an_error():
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written (`| head -1` after its line)
    p = subprocess.run(
        [sys.executable, "-m", "emo.cli", "analyze", str(ES1)],
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    os.close(w)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_dependency_cycle_names_the_file(capsys, monkeypatch):
    import pandas as pd

    import emo.graph
    from emo.graph.graph import EDGE_COLUMNS, NODE_COLUMNS, Graph, typed

    def cyclic(events):
        nodes = typed(
            pd.DataFrame(
                {
                    "kind": ["kernel", "kernel"],
                    "rank": 0,
                    "device": 0,
                    "stream": 7,
                    "thread": -1,
                    "start_ns": [0, 10],
                    "dur_ns": 5,
                    "name": "k",
                    "event": [0, 1],
                }
            ),
            NODE_COLUMNS,
        )
        edges = typed(pd.DataFrame({"src": [0, 1], "dst": [1, 0], "kind": "stream", "from_start": False}), EDGE_COLUMNS)
        return Graph(nodes, edges, {})

    monkeypatch.setattr(emo.graph, "build_graph", cyclic)
    code, _, err = analyze([ES1], capsys)
    assert code == 2
    one_line(err, f"{ES1}: dependency cycle")


# ---------------------------------------------------------------- partial rank sets


def _ranks(tmp_path: Path, n: int, world: int | None = None, group: str | None = None) -> Path:
    """The first n DLRM ranks; optionally declaring another world size and naming the NCCL group."""
    for f in DLRM[:n]:
        d = doc(f)
        if world:
            d["distributedInfo"]["world_size"] = world
        if group is not None:
            for e in d["traceEvents"]:
                if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
                    e["args"]["Process Group Name"] = "0"
                    e["args"]["Process Group Ranks"] = group
        write(tmp_path / f.name.replace(".gz", ""), d)
    return tmp_path


def test_two_of_eight_ranks_match_nothing_and_say_why(tmp_path, capsys):
    code, out, _ = analyze([_ranks(tmp_path, 2), "--annotation", "ProfilerStep", "--json"], capsys)
    s = json.loads(out)
    assert code == 0 and s["ranks"] == [0, 1]
    assert s["collectives"] == 8 and s["collectives_matched"] == 0
    assert {u["why"] for u in s["collectives_unmatched"]} == {"ranks 2-7 are absent from the trace"}
    assert sum(u["instances"] for u in s["collectives_unmatched"]) == 8
    assert s["replay_error_us"] == 0 and s["collective_waits"]["wait_us_by_rank"] == {}  # no invented wait


def test_declared_world_larger_than_the_files(tmp_path, capsys):
    code, out, _ = analyze([_ranks(tmp_path, 8, world=128), "--annotation", "ProfilerStep", "--json"], capsys)
    s = json.loads(out)
    assert s["collectives_matched"] == 0 and s["replay_error_us"] == 0
    assert {u["why"] for u in s["collectives_unmatched"]} == {"ranks 8-127 are absent from the trace"}


def test_named_group_complete_inside_a_larger_world(tmp_path, capsys):
    folder = _ranks(tmp_path, 8, world=128, group="[0, 1, 2, 3, 4, 5, 6, 7]")
    code, out, _ = analyze([folder, "--annotation", "ProfilerStep", "--json"], capsys)
    s = json.loads(out)
    assert s["collectives_matched"] == 8 and s["collectives_unmatched"] == [] and s["replay_error_us"] == 0


def test_named_group_without_members_in_a_partial_world(tmp_path, capsys):
    folder = _ranks(tmp_path, 2, world=128, group="")
    for f in folder.iterdir():  # a group name but no member list: membership unknown
        d = json.loads(f.read_bytes())
        for e in d["traceEvents"]:
            e.get("args", {}).pop("Process Group Ranks", None)
        write(f, d)
    code, out, _ = analyze([folder, "--annotation", "ProfilerStep", "--json"], capsys)
    s = json.loads(out)
    assert s["collectives_matched"] == 0 and s["replay_error_us"] == 0
    assert (
        s["collectives_unmatched"][0]["why"] == "the trace does not name the group's members and holds 2 of 128 ranks"
    )


def test_one_kernel_and_no_host_events(tmp_path, capsys):
    # GPU ops without the runtime calls that launched them: what bound them is not in the trace, so
    # a critical path would be made up (issue 36: 263 us where the real one was 3154 us): refused
    t = write(
        tmp_path / "one.json",
        {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k0",
                    "pid": 0,
                    "tid": 7,
                    "ts": 100.0,
                    "dur": 50.0,
                    "args": {"device": 0, "stream": 7, "correlation": 1},
                }
            ]
        },
    )
    code, out, err = analyze([t, "--json"], capsys)
    assert code == 2 and out == ""
    one_line(err, f"{t}: 1 of 1 GPU ops have no runtime call that launched them", "record CPU and CUDA activity")
    t = write(
        tmp_path / "two.json",
        {
            "traceEvents": [  # with its launch: the kernel is the path's end
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 0,
                    "tid": 1,
                    "ts": 90.0,
                    "dur": 5.0,
                    "args": {"correlation": 1},
                },
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k0",
                    "pid": 0,
                    "tid": 7,
                    "ts": 100.0,
                    "dur": 50.0,
                    "args": {"device": 0, "stream": 7, "correlation": 1},
                },
            ]
        },
    )
    code, out, err = analyze([t, "--json"], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert s["critical_path_us"] == pytest.approx(60.0) and s["gpu_ops_without_launch"] == 0
