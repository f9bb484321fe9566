"""`emo analyze`: the JSON it prints, the Perfetto write-back, and bad input."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import pytest

from emo.cli import analyze

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared real traces not present")
KEYS = {
    "critical_path_us",
    "makespan_us",
    "breakdown_us",
    "replay_error_us",
    "ranks",
    "collectives_matched",
    "slack_us",
}


def run(argv, capsys):
    """Through emo.cli.main (ValueError -> one line, exit 2); our sub-command alone if the CLI
    cannot be built (another sub-command module broken), so this file tests only emo analyze."""
    try:
        from emo.cli import build_parser, main

        build_parser()
    except Exception:
        main = _direct
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _direct(argv):
    p = argparse.ArgumentParser(prog="emo")
    analyze.register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"emo: error: {e}", file=sys.stderr)
        return 2


def test_json_keys_and_hta_mode(capsys):
    code, out, _ = run(
        [
            "analyze",
            str(TRACES / "hta_event_sync_a100_1stream.json.gz"),
            "--annotation",
            "ProfilerStep",
            "--hta-compatible",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    s = json.loads(out)
    assert KEYS <= set(s)
    assert s["critical_path_us"] == 2401 and s["hta"]["0"]["critical_path_us"] == 2401
    assert s["replay_error_us"] == 0 and s["ranks"] == [0] and "rank0/gpu0" in s["slack_us"]
    assert abs(sum(s["breakdown_us"].values()) - s["emo_critical_path_us"]) < 1e-3


def test_perfetto_write_back(tmp_path, capsys):
    out = tmp_path / "out.json.gz"
    code, text, _ = run(
        ["analyze", str(TRACES / "hta_alexnet_a100_2stream_cudasync.json.gz"), "--perfetto", str(out)], capsys
    )
    assert code == 0 and "critical path" in text
    doc = json.loads(gzip.decompress(out.read_bytes()))
    src = json.loads(gzip.decompress((TRACES / "hta_alexnet_a100_2stream_cudasync.json.gz").read_bytes()))
    n = len(src["traceEvents"])
    assert doc["traceEvents"][:n] == src["traceEvents"]  # the original trace, untouched
    extra = doc["traceEvents"][n:]
    pids = {e["pid"] for e in extra}
    assert pids == {"EMO critical path", "EMO slack"}
    cp = [e for e in extra if e["pid"] == "EMO critical path" and e["ph"] == "X"]
    assert len(cp) > 100 and all(e["dur"] >= 0 for e in cp)
    assert any(e["pid"] == "EMO slack" and e["ph"] == "X" for e in extra)


def test_bad_trace_one_line_error_nothing_written(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "kernel"')
    out = tmp_path / "out.json"
    code, _, err = run(["analyze", str(bad), "--perfetto", str(out), "--json"], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "bad.json: truncated or malformed JSON" in err
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_dlrm_rank_filter(capsys):
    code, out, _ = run(
        [
            "analyze",
            str(TRACES / "dlrm_8rank"),
            "--rank",
            "3",
            "--annotation",
            "ProfilerStep",
            "--hta-compatible",
            "--json",
        ],
        capsys,
    )
    s = json.loads(out)
    assert code == 0 and s["ranks"] == [3] and s["critical_path_us"] == 7842
    assert s["collectives_matched"] == 0  # one rank alone has no peer to match
