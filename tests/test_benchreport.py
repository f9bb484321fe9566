"""docs/results.md is written by the benchmark scripts: one marked section replaced, the rest kept."""

import argparse
import re
import sys
from pathlib import Path

import pytest

from emo import benchreport

ROOT = Path(__file__).resolve().parents[1]

DOC = """# Results

## A
<!-- results:a -->
old a
<!-- /results:a -->

How to read A: kept.

<!-- results:b-2 -->
old b
<!-- /results:b-2 -->
"""


def test_replace_section_replaces_only_that_section():
    new = benchreport.replace_section(DOC, "a", "| x |\n|---|\n| 1 |\n")
    assert benchreport.section(new, "a") == "| x |\n|---|\n| 1 |"
    assert benchreport.section(new, "b-2") == "old b"
    assert new.replace("| x |\n|---|\n| 1 |", "old a") == DOC
    # replacing twice gives the same file
    assert benchreport.replace_section(new, "a", "| x |\n|---|\n| 1 |") == new


@pytest.mark.parametrize(
    "doc",
    [DOC.replace("<!-- /results:a -->\n", ""), DOC + "<!-- results:a -->\n<!-- /results:a -->\n", "nothing here"],
)
def test_a_section_without_one_pair_of_markers_is_refused(doc):
    with pytest.raises(ValueError, match="section 'a' needs one"):
        benchreport.replace_section(doc, "a", "x")


def test_bad_names_and_reversed_markers_are_refused():
    with pytest.raises(ValueError, match="lower-case"):
        benchreport.markers("A b")
    with pytest.raises(ValueError, match="ends before it begins"):
        benchreport.replace_section("<!-- /results:a -->\n<!-- results:a -->\n", "a", "x")


def test_write_section_stamps_once(tmp_path):
    f = tmp_path / "results.md"
    f.write_text(DOC)
    benchreport.write_section("a", "table", command="python benchmarks/x.py --quick", path=f, at="abc", on="box")
    body = benchreport.section(f.read_text(), "a")
    assert re.fullmatch(r"Written by `python benchmarks/x.py --quick` at commit abc on box, [^\n]+\.\n\ntable", body)
    benchreport.write_section("a", "table 2", command="python benchmarks/x.py", path=f, at="def", on="box")
    assert f.read_text().count("Written by") == 1 and "table 2" in f.read_text()


def test_recording_writes_the_output_of_a_run_that_succeeds(tmp_path, capsys):
    f = tmp_path / "results.md"
    f.write_text(DOC)
    ap = argparse.ArgumentParser()
    benchreport.add_flag(ap)
    argv = ["benchmarks/x.py", "--quick", benchreport.FLAG]
    assert ap.parse_args(argv[2:]).write_results
    with pytest.raises(SystemExit) as e, benchreport.recording("a", argv=argv, path=f):
        print("speedup vs HTA: 36.3")
        sys.exit(0)
    assert e.value.code == 0
    body = benchreport.section(f.read_text(), "a")
    assert "`python benchmarks/x.py --quick`" in body and body.endswith("```\nspeedup vs HTA: 36.3\n```")
    assert "speedup vs HTA: 36.3" in capsys.readouterr().out  # still printed


def test_recording_writes_nothing_on_failure_or_without_the_flag(tmp_path):
    f = tmp_path / "results.md"
    f.write_text(DOC)
    with pytest.raises(SystemExit), benchreport.recording("a", argv=["x.py", benchreport.FLAG], path=f):
        print("half a table")
        sys.exit(1)
    with pytest.raises(RuntimeError), benchreport.recording("a", argv=["x.py", benchreport.FLAG], path=f):
        raise RuntimeError("boom")
    with benchreport.recording("a", argv=["x.py"], path=f):
        print("a table")
    assert f.read_text() == DOC


def test_results_md_has_every_section_a_script_writes():
    """Each script wired with --write-results declares its sections (RESULTS_SECTIONS), and
    docs/results.md holds each of them once."""
    text = (ROOT / "docs" / "results.md").read_text()
    wired = 0
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        src = script.read_text()
        if "benchreport.recording(" not in src:
            continue
        wired += 1
        assert "benchreport.add_flag(" in src, script.name
        (names,) = re.findall(r"^RESULTS_SECTIONS = \(([^)]*)\)", src, re.M)
        for name in re.findall(r'"([a-z0-9-]+)"', names):
            benchreport.replace_section(text, name, "x")  # one pair of markers
    assert wired >= 10
