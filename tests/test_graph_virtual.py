"""The graph on virtual-GPU traces: replay is exact, and the what-if prediction of a changed kernel
duration equals what the virtual GPU then measures (within slack: nothing moves; beyond: the end
moves by exactly the excess)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from emo.device.sim import SimDevice
from emo.graph import build_graph
from emo.graph.whatif import compile_graph, whatif
from emo.trace import read_trace
from emo.workloads import build_program

ROOT = Path(__file__).resolve().parents[1]
SMALL_TP = {"kind": "tp", "tp": 2, "chunks": 2, "model": {"layers": 2, "seq": 1024}}
SMALL_PP = {"kind": "pp", "pp": 4, "microbatches": 4, "model": {"layers": 8, "seq": 1024}}
GPU_KINDS = ["kernel", "memcpy", "memset", "collective", "coll_wait"]


@pytest.fixture(scope="module")
def a100():
    from hydra import compose, initialize_config_dir

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        # exact timing semantics: no noise, and no compute-communication contention (the what-if keeps
        # a collective's recorded duration; on the virtual GPU a stretched kernel beside a transfer
        # would re-rate it)
        return compose(
            "config",
            overrides=[
                "gpu=a100",
                "gpu.noise=0",
                "gpu.physics.comm_sm_fraction=0",
                "gpu.physics.comm_hbm_per_link_byte=0",
                # and no profiler cost: each of its records is one more rounded timestamp, and this
                # compares two traced runs to the ns (the cost itself: tests/test_untraced.py)
                "gpu.physics.trace_overhead_us=0",
            ],
        ).gpu


def traced(gpu, program, folder: Path):
    dev = SimDevice(gpu)
    try:
        dev.run(program, 2, warmup=1, trace_dir=folder)
    finally:
        dev.close()
    g = build_graph(read_trace(folder))
    c = compile_graph(g)
    return g, c, whatif(c)


def stretched(program, name: str, factor: float):
    """The same program with every launch of kernel `name` doing `factor` times the work."""
    kernels = list(program.kernels)
    j = next(i for i, k in enumerate(kernels) if k.name == name)
    w = kernels[j].work
    w2 = dataclasses.replace(
        w, **{f.name: getattr(w, f.name) * factor for f in dataclasses.fields(w) if f.name != "active_warps"}
    )
    kernels[j] = dataclasses.replace(kernels[j], work=w2)
    return dataclasses.replace(program, kernels=kernels)


def gpu_ops(g):
    """GPU nodes keyed by (rank, device, stream, kind, ordinal on the stream): the same op in two runs."""
    m = g.nodes[g.nodes["kind"].isin(GPU_KINDS)]
    m = m.sort_values(["rank", "device", "stream", "kind", "start_ns"], kind="stable")
    m = m.assign(ord=m.groupby(["rank", "device", "stream", "kind"]).cumcount())
    return m.reset_index(names="node").set_index(["rank", "device", "stream", "kind", "ord"])


@pytest.mark.parametrize("workload,excess", [(SMALL_TP, 0.5), (SMALL_TP, 3.0), (SMALL_PP, 0.5)])
def test_whatif_matches_the_virtual_gpu(a100, tmp_path, workload, excess):
    program = build_program(workload, gpu="a100")
    g, c, r = traced(a100, program, tmp_path / "a")
    assert r.replay_error_ns == 0
    assert g.meta["collectives_matched"] == g.meta["collectives"] > 0
    # a kernel (one spec, several launches, none tiny) with slack everywhere it runs
    n = g.nodes.assign(slack=r.slack_ns)
    k = n[n["kind"] == "kernel"].groupby("name").agg(slack=("slack", "min"), dur=("dur_ns", "mean"))
    unique = {s.name for s in program.kernels}
    k = k[k.index.isin(unique) & (k["dur"] >= 5000) & (k["slack"] > 1000)]
    k = k[[sum(s.name == nm for s in program.kernels) == 1 for nm in k.index]]
    name = (k["slack"] / k["dur"]).idxmax()
    slack, dur = k.loc[name, "slack"], k.loc[name, "dur"]
    g2, c2, r2 = traced(a100, stretched(program, name, 1 + excess * slack / dur), tmp_path / "b")
    a, b = gpu_ops(g), gpu_ops(g2)
    assert len(a) == len(b)
    j = a.merge(b, left_index=True, right_index=True, suffixes=("", "_b"))
    new = g.nodes["dur_ns"].to_numpy().copy()
    changed = j[j["name"] == name]
    new[changed["node"].to_numpy()] = changed["dur_ns_b"].to_numpy()
    pred = whatif(c, new)
    if excess < 1:
        assert r2.makespan_ns == r.makespan_ns  # the virtual GPU: nothing moved at the end
    else:
        assert r2.makespan_ns > r.makespan_ns
    assert abs(pred.makespan_ns - r2.makespan_ns) <= 2  # ns: timestamp rounding
    measured = j["start_ns_b"].to_numpy() - c2.t0
    assert np.abs(pred.start_ns[j["node"].to_numpy()] - measured).max() <= 2
