"""emo.analyze.Trace: the analysis `emo analyze` prints, as a library."""

from pathlib import Path

import numpy as np
import pytest

from emo.analyze import Trace, analyze_trace

TRACE = Path(__file__).parent / "data/traces/hta_event_sync_a100_3stream.json.gz"


@pytest.fixture(scope="module")
def t():
    return Trace(TRACE)


def test_the_facade_says_what_emo_analyze_says(t):
    s = analyze_trace(TRACE).summary
    assert t.summary() == s
    assert t.breakdown() == s["breakdown_us"]
    cp = t.critical_path()
    assert len(cp) == s["critical_path_nodes"]
    assert (cp["dur_ns"].sum() + cp["delay_ns"].sum()) / 1e3 == pytest.approx(s["critical_path_us"])
    assert set(cp["name"]) <= set(t.graph.nodes["name"])
    slack = t.slack()
    assert (slack["slack_ns"] > 0).all() and (slack["end_ns"] >= slack["start_ns"]).all()


def test_whatif(t):
    same = t.whatif()
    assert same["makespan_us"] == pytest.approx(same["recorded_makespan_us"])
    nodes = t.graph.nodes
    longer = nodes["dur_ns"].to_numpy(np.int64).copy()
    longer[t.critical_path()["node"].to_numpy()[-1]] += 1_000_000  # the path's last node, 1 ms longer
    assert t.whatif(longer)["makespan_us"] == pytest.approx(same["makespan_us"] + 1000, abs=1)
    faster = t.whatif(scale={".": 0.0})  # every GPU op takes no time: the CPU alone sets the makespan
    assert faster["makespan_us"] <= same["makespan_us"]
    with pytest.raises(ValueError, match="dur_ns has 3 values"):
        t.whatif([1, 2, 3])


def test_perfetto(t, tmp_path):
    t.write_perfetto(tmp_path / "out.json")
    assert "EMO critical path" in (tmp_path / "out.json").read_text()
