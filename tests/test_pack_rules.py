"""The packs obey the paper's rules (and ours), on random graphs and on a virtual trace."""

from __future__ import annotations

import pytest
from pack_graphs import random_graph

from emo.graph import build_graph
from emo.graph.whatif import compile_graph, whatif
from emo.pack import members_of, pack, signature


@pytest.fixture(scope="module")
def virtual_graph(tmp_path_factory):
    from emo.device.backends import open_device
    from emo.trace import read_trace
    from emo.workflow.plan import compose

    cfg = compose(["workload.model.layers=1", "workload.model.seq=1024"])
    d = tmp_path_factory.mktemp("trace")
    dev = open_device(cfg["gpu"])
    dev.run(cfg["workload"], 2, warmup=1, trace_dir=d)
    return build_graph(read_trace(d))


def graphs(virtual_graph):
    return [("virtual", virtual_graph)] + [(f"random#{s}", random_graph(s, ranks=2)) for s in range(3)]


@pytest.mark.parametrize("delta_ms", [5.0, 1.0])
def test_rules(virtual_graph, delta_ms):
    for name, g in graphs(virtual_graph):
        pg = pack(g, delta_ms)
        res = whatif(compile_graph(g), slack=False)
        kinds = g.nodes["kind"].to_numpy()
        assert ((pg.pack_of >= 0) == (kinds == "kernel")).all(), f"{name}: only and all compute kernels are packed"
        key = g.nodes[["rank", "device", "stream"]].to_numpy()
        crit = res.critical_pred
        src, dst = g.edges["src"].to_numpy(), g.edges["dst"].to_numpy()
        for p, m in zip(pg.packs.itertuples(), members_of(pg.pack_of, res.start_ns)):
            assert (key[m] == key[m[0]]).all(), f"{name}: pack {p.pack} spans streams"
            assert (crit[m[1:]] == m[:-1]).all(), f"{name}: rule (1) broken in pack {p.pack}"
            for k in m[:-1]:  # rule (2)/(5): a non-final kernel has no dependency leaving the stream
                out = dst[src == k]
                assert set(out.tolist()) <= set(m.tolist()), f"{name}: pack {p.pack} kernel {k} has an edge out"
            assert len(m) == 1 or p.dur_ns <= delta_ms * 1e6, f"{name}: rule (3) broken"
            assert p.dur_ns == res.finish_ns[m[-1]] - res.start_ns[m[0]]
            assert p.signature == signature(g.nodes["name"].to_numpy()[m])
        assert pg.packs.groupby("signature")["first_occurrence"].sum().eq(1).all()


def test_smaller_delta_more_packs(virtual_graph):
    counts = [len(pack(virtual_graph, d).packs) for d in (20.0, 5.0, 1.0, 0.1)]
    assert counts == sorted(counts) and counts[-1] > counts[0]


def test_pack_graph_schema_and_signatures_repeat(virtual_graph):
    pg = pack(virtual_graph, 5.0)
    assert list(pg.graph.nodes.columns) == list(virtual_graph.nodes.columns)
    assert list(pg.graph.edges.columns) == list(virtual_graph.edges.columns)
    assert len(pg.graph.nodes) == len(virtual_graph.nodes) - int((pg.pack_of >= 0).sum()) + len(pg.packs)
    # ranks of a tensor-parallel job and repeated layers share signatures: far fewer than packs
    assert pg.packs["signature"].nunique() < len(pg.packs) / 4
    compile_graph(pg.graph)  # acyclic


def test_bad_delta():
    with pytest.raises(ValueError, match="delta_max_ms"):
        pack(random_graph(0, ranks=1, launches=50), 0.0)
