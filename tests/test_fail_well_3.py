"""Failing well, round 3 (issue 36): no user file destroyed (outputs over inputs, devices, existing
files; temporary copies bounded; only what EMO made is cleaned), no stale or confident wrong answer."""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from emo.cli import main

BUNDLED = Path(__file__).resolve().parent / "data" / "traces"
ES1 = BUNDLED / "hta_event_sync_a100_1stream.json.gz"


def cli(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str, *parts: str) -> None:
    assert err.count("\n") == 1 and err.startswith("emo: error: "), err
    for p in parts:
        assert p in err, (p, err)


# --------------------------------------------------------------------------- outputs never destroy a file
def test_perfetto_over_its_own_input_a_device_or_an_existing_file_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.json.gz"
    shutil.copy(ES1, trace)
    before = trace.read_bytes()
    code, _, err = cli(["analyze", trace, "--perfetto", trace], capsys)
    assert code == 2 and trace.read_bytes() == before
    one_line(err, f"--perfetto {trace}: cannot write (it is the PATH input)")
    code, _, err = cli(["analyze", trace, "--perfetto", trace, "--force"], capsys)  # never, even with --force
    assert code == 2 and trace.read_bytes() == before

    code, _, err = cli(["analyze", trace, "--perfetto", "/dev/null", "--force"], capsys)
    one_line(err, "--perfetto /dev/null: cannot write (not a regular file)")
    assert Path("/dev/null").is_char_device()

    out = tmp_path / "out.json"
    out.write_text("mine")
    code, _, err = cli(["analyze", trace, "--perfetto", out], capsys)
    one_line(err, "it exists; pass --force to replace it")
    assert out.read_text() == "mine"
    assert cli(["analyze", trace, "--perfetto", out, "--force"], capsys)[0] == 0 and "traceEvents" in out.read_text()

    code, _, err = cli(["analyze", trace, "--perfetto", tmp_path / "no" / "such" / "x.json"], capsys)
    one_line(err, f"no folder {tmp_path / 'no' / 'such'}")
    assert not (tmp_path / "no").exists()

    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    code, _, err = cli(["analyze", trace, "--perfetto", link], capsys)
    one_line(err, "a symbolic link")
    assert link.is_symlink()


def test_model_fit_out_over_its_bench_input_is_refused(tmp_path, capsys):
    bench = tmp_path / "b.csv"
    bench.write_text("name,sm_mhz,time_s,energy_j\na,1000,1.0,100\na,1500,0.7,110\n")
    targets = tmp_path / "t.csv"
    targets.write_text("name,sm_mhz,time_s,energy_j\nk,1500,0.1,10\n")
    before = bench.read_bytes()
    code, _, err = cli(["model", "fit", "--bench", bench, "--targets", targets, "--out", bench], capsys)
    one_line(err, f"--out {bench}: cannot write (it is the --bench input)")
    assert code == 2 and bench.read_bytes() == before
    code, _, err = cli(["model", "fit", "--bench", bench, "--targets", targets, "--out", targets, "--force"], capsys)
    one_line(err, "it is the --targets input")


# --------------------------------------------------------------------------- temporary copies are bounded and removed
def test_a_pipe_or_device_is_copied_only_up_to_a_bound(tmp_path, capsys, monkeypatch):
    import tempfile

    from emo.trace import read

    monkeypatch.setattr(read, "SPOOL_LIMIT_BYTES", 8 << 20)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, _, err = cli(["analyze", "/dev/zero"], capsys)
    assert code == 2
    one_line(err, "/dev/zero: more than 8 MiB from a pipe or device: refused")
    assert list(tmp_path.iterdir()) == []  # the copy is gone


def test_sigterm_while_a_pipe_is_copied_removes_the_copy(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    p = subprocess.Popen([sys.executable, "-m", "emo.cli", "analyze", "/dev/zero"], stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(tmp_path)})
    end = time.monotonic() + 60
    while not any(tmp_path.glob("emo-trace-*/trace")) and time.monotonic() < end and p.poll() is None:
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 128 + signal.SIGTERM and err == "emo: interrupted (SIGTERM)\n", err
    assert list(tmp_path.iterdir()) == []


def test_a_gzip_bomb_is_refused_before_it_is_held_in_memory(tmp_path, capsys):
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (200 << 20) + b"]}"))
    code, _, err = cli(["analyze", bomb], capsys)
    assert code == 2
    one_line(err, f"{bomb}: inflates to more than 64 MiB", "a gzip bomb?")


# --------------------------------------------------------------------------- EMO deletes only what it made
def test_cleanup_removes_only_what_emo_made(tmp_path):
    from emo.locks import cleanup

    res = tmp_path / "results"
    mine = [res / "trace" / ".0123456789ab.emo-stage-k2j4_x9q.tmp", res / "trace" / ".0123456789ab.x1y2z3w4.tmp",
            res / "graph" / "0123456789ab", res / ".emo-errors-4242.jsonl"]
    theirs = [res / "trace" / ".vscode.tmp" / "settings.json", res / "trace" / "notes", res / "trace" / ".cache.tmp",
              res / "graph" / "0123456789abX", res / "emo-errors-1.jsonl"]
    for p in mine[:3] + theirs[1:4]:
        p.mkdir(parents=True)
    for p in [mine[3], theirs[0], theirs[4]]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    assert sorted(cleanup(res)) == sorted(mine)
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in mine)


def test_a_stage_marks_its_hidden_folder():
    import re

    from emo.locks import STAGE_TMP

    src = (Path(__file__).resolve().parents[1] / "emo" / "stages" / "__init__.py").read_text()
    prefix = re.search(r'mkdtemp\(prefix=f"\.\{out\.name\}\.([^"]+)", suffix="\.tmp"', src).group(1)
    assert STAGE_TMP.fullmatch(f".0123456789ab.{prefix}abc_123x.tmp")
