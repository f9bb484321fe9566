"""Property test of packing: under random per-pack clocks (stretch factors applied to every member
kernel), the what-if makespan of the pack graph equals the kernel graph's within 0.5 %, never shorter."""

from __future__ import annotations

from pathlib import Path

import pytest
from pack_graphs import random_graph

from emo.graph import build_graph
from emo.pack import pack
from emo.pack.check import makespan_gaps
from emo.trace import read_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
REAL = [
    "hta_alexnet_a100_2stream_cudasync.json.gz",
    "hta_event_sync_a100_3stream.json.gz",
    "hta_event_sync_a100_1stream.json.gz",
    "dlrm_8rank",
    "pipit_nsys_cloverleaf_a100.sqlite",
]


def check(graph, name, trials=20, seed=0):
    pg = pack(graph, 5.0)
    gaps = makespan_gaps(graph, pg, trials=trials, seed=seed)
    print(
        f"{name}: {len(pg.packs)} packs of {int((graph.nodes['kind'] == 'kernel').sum())} kernels; "
        f"pack graph longer in {(gaps > 0).mean():.0%} of trials, by at most {gaps.max():.4%}"
    )
    assert gaps[0] == 0, f"{name}: the pack graph does not reproduce the recorded timeline"
    assert gaps.min() >= 0, f"{name}: the pack graph is shorter than the kernel graph ({gaps.min():.4%})"
    assert gaps.max() <= 0.005, f"{name}: the pack graph is {gaps.max():.3%} longer"
    return gaps


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs(seed):
    check(random_graph(seed, ranks=1 + seed % 3), f"random#{seed}", seed=seed)


@pytest.mark.parametrize("name", REAL)
def test_real_traces(name):
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    check(build_graph(read_trace(path)), name)


@pytest.mark.parametrize(
    "overrides",
    [
        ["workload=tp", "workload.model.layers=1", "workload.model.seq=1024"],
        [
            "workload=pp",
            "workload.pp=2",
            "workload.model.layers=2",
            "workload.microbatches=2",
            "workload.model.seq=512",
        ],
        ["workload=offload", "workload.model.layers=2", "workload.decode_tokens=2"],
    ],
)
def test_virtual_traces(overrides, tmp_path):
    from emo.device.backends import open_device
    from emo.workflow.plan import compose

    cfg = compose(overrides)
    open_device(cfg["gpu"]).run(cfg["workload"], 2, warmup=1, trace_dir=tmp_path)
    check(build_graph(read_trace(tmp_path)), cfg["workload"]["kind"], trials=10)
