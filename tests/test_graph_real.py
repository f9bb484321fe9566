"""The execution graph on the real traces: HTA parity, replay error, cross-rank collectives."""

from __future__ import annotations

import numpy as np
import pytest
from real_traces import real  # noqa: E402  (bundled small traces, the rest from ../shared)

from emo.graph import Graph, build_graph, summary
from emo.graph.hta import hta_critical_path
from emo.graph.whatif import compile_graph, whatif
from emo.trace import clip_window, read_trace

ALEX = "hta_alexnet_a100_2stream_cudasync.json.gz"
# HTA 0.5.0's critical path (us) on these files, from shared/data/traces/README.md
HTA_TABLE = [
    (ALEX, 0, "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1, 35834),
    (ALEX, 0, "", 0, 43355655),
    ("hta_event_sync_a100_3stream.json.gz", 0, "", 0, 1178),
    ("hta_event_sync_a100_1stream.json.gz", 0, "ProfilerStep", 0, 2401),
] + [("dlrm_8rank", r, "ProfilerStep", 0, cp) for r, cp in enumerate([4744, 8958, 4719, 7842, 6216, 6024, 4705, 4521])]
ALL = [
    ALEX,
    "hta_event_sync_a100_3stream.json.gz",
    "hta_event_sync_a100_1stream.json.gz",
    "dlrm_8rank",
    "pipit_nsys_cloverleaf_a100.sqlite",
]

_cache: dict = {}


def events(name):
    if name not in _cache:
        _cache[name] = read_trace(real(name))
    return _cache[name]


@pytest.mark.parametrize("name,rank,annotation,instance,hta_us", HTA_TABLE)
def test_hta_compatible_equals_hta(name, rank, annotation, instance, hta_us):
    h = hta_critical_path(events(name), rank, annotation, instance)
    assert abs(h.cp_us - hta_us) <= 0.001 * hta_us, (h.cp_us, hta_us)


@pytest.mark.parametrize("name", ALL)
def test_replay_reproduces_recorded_timeline(name):
    g = build_graph(events(name))
    r = whatif(compile_graph(g))
    assert r.replay_error_ns == 0
    # the default graph is makespan-faithful: its critical path spans the whole recorded run
    n = g.nodes
    assert r.makespan_ns == int((n["start_ns"] + n["dur_ns"]).max() - n["start_ns"].min())


def test_alexnet_dependencies_present():
    g = build_graph(events(ALEX))
    kinds = g.edges["kind"].value_counts()
    assert kinds["event"] >= 1 and kinds["sync"] >= 1 and kinds["launch"] >= 90


@pytest.fixture(scope="module")
def dlrm():
    w = clip_window(events("dlrm_8rank"), "ProfilerStep", 0)
    g = build_graph(w)
    c = compile_graph(g)
    r = whatif(c)
    return g, r, summary(g, r, c)


def test_dlrm_collectives_matched_across_ranks(dlrm):
    g, r, s = dlrm
    assert s["collectives"] == 8 and s["collectives_matched"] == 8
    assert s["ranks"] == list(range(8))
    assert (g.nodes["kind"] == "rendezvous").sum() == 8
    assert s["replay_error_us"] == 0


def test_dlrm_critical_path_crosses_ranks(dlrm):
    g, r, s = dlrm
    assert len(s["critical_path_ranks"]) >= 2
    kinds = set(g.nodes["kind"].to_numpy()[r.critical_path])
    assert "rendezvous" in kinds


def test_dlrm_wait_attributed_to_the_rank_waited_for(dlrm):
    g, r, s = dlrm
    waits = s["collective_waits"]
    # ranks 1, 3, 4, 5 are the ones HTA sees as mostly communication: they waited longest ...
    by_rank = waits["wait_us_by_rank"]
    assert min(by_rank[k] for k in (1, 3, 4, 5)) > max(by_rank[k] for k in (2, 6, 7))
    # ... for the ranks that arrived last, whose earlier work is what the merged path runs through
    waited_for = waits["waited_for_us_by_rank"]
    top = max(waited_for, key=waited_for.get)
    assert top not in (1, 3)
    path_ranks = set(g.nodes["rank"].to_numpy()[r.critical_path])
    assert top in path_ranks
    # on the path, the rendezvous is entered from the last-arriving rank's own work
    rv = [v for v in r.critical_path if g.nodes["kind"].iat[v] == "rendezvous"][0]
    pred = r.critical_pred[rv]
    arrivals = g.edges[(g.edges["dst"] == rv)]["src"].to_numpy()
    assert g.nodes["start_ns"].iat[pred] == g.nodes["start_ns"].to_numpy()[arrivals].max()


def test_graph_save_load_roundtrip(tmp_path):
    g = build_graph(events("hta_event_sync_a100_3stream.json.gz"))
    g.save(tmp_path)
    h = Graph.load(tmp_path)
    assert h.nodes.equals(g.nodes) and h.edges.equals(g.edges)
    assert whatif(compile_graph(h)).makespan_ns == whatif(compile_graph(g)).makespan_ns


def test_node_ids_and_dtypes():
    g = build_graph(events("hta_event_sync_a100_3stream.json.gz"))
    assert (g.nodes.index.to_numpy() == np.arange(len(g.nodes))).all()
    assert str(g.nodes["start_ns"].dtype) == "int64" and str(g.edges["src"].dtype) == "int64"
    assert g.edges["src"].between(0, len(g.nodes) - 1).all()


def test_saved_graph_keeps_its_summary(dlrm, tmp_path):
    g, r, s = dlrm
    g.save(tmp_path)
    s2 = summary(Graph.load(tmp_path))
    for key in ("critical_path_us", "makespan_us", "replay_error_us", "collectives_matched", "ranks", "slack_us"):
        assert s2[key] == s[key], key


def test_hta_distinct_is_np_unique():
    from emo.graph.hta import _distinct

    rng = np.random.default_rng(0)
    for x in (np.zeros(0, np.int64), np.array([3]), rng.integers(-5, 5, 100), rng.integers(0, 2**40, 1000)):
        assert np.array_equal(_distinct(x), np.unique(x))
