"""The predictor's fast paths give the plain prediction to the bit (issue 49): the clock timelines
laid out compiled (emo.model.timelines) against the requests as the applier issues them, and a
policy predicted at several latencies in one pass over the graph (predict_lanes) against one
prediction per latency."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_optimize_verify import CLOCKS, one_signature_model

from emo.graph.graph import EDGE_COLUMNS, NODE_COLUMNS, Graph, typed
from emo.model.predict import clock_timelines, default_pass, pack_tables, predict, predict_lanes, with_node_times
from emo.policy import FrequencyPolicy, Step, issue_plan

MS = 1_000_000


def _tables():
    """Two GPUs, each a chain of packs of 5-20 ms beside a long collective, one rank each; the host
    marks three iterations on each rank (ProfilerStep anchors)."""
    rows, edges = [], []
    for r in range(2):
        base = len(rows)
        for i, d in enumerate([15, 20, 5, 12, 18, 9]):
            rows.append(("kernel", r, 0, 7, -1, sum([15, 20, 5, 12, 18, 9][:i]) * MS, d * MS, f"k{i}", base + i))
            if i:
                edges.append((base + i - 1, base + i, "stream", False))
        rows.append(("collective", r, 0, 8, -1, 0, 60 * MS, "L", base + 6))
    rows.append(("sync", 0, -1, -1, 1, 80 * MS, 10_000, "sync", len(rows)))
    edges += [(5, 14, "sync", False), (12, 14, "sync", False), (6, 14, "sync", False), (13, 14, "sync", False)]
    graph = Graph(
        typed(pd.DataFrame(rows, columns=list(NODE_COLUMNS)), NODE_COLUMNS),
        typed(pd.DataFrame(edges, columns=list(EDGE_COLUMNS)), EDGE_COLUMNS),
    )
    kernels = [i for i, row in enumerate(rows) if row[0] == "kernel"]
    packs = pd.DataFrame({"node": kernels, "signature": "s", "dur_ns": [rows[i][6] for i in kernels]})
    model = one_signature_model()
    anchors = pd.DataFrame(
        {"rank": [0, 0, 0, 1, 1, 1], "iteration": [0, 1, 2] * 2, "node": [0, 2, 4, 7, 9, 11], "offset_ns": 0.0}
    )
    return pack_tables(graph, packs, model, anchors)


def _policy(rng) -> FrequencyPolicy:
    steps = {}
    for d in range(2):
        t = np.sort(rng.uniform(0, 30, size=rng.integers(1, 6)))
        steps[d] = [Step(float(x), int(rng.choice(CLOCKS)), None if rng.random() < 0.5 else 3.0) for x in t]
    return FrequencyPolicy(gpu="a100", steps=steps, period_ms=30.0, lead_ms=4.0)


def _reference(t, policy, marks, up_v, down_v, end_ns):
    """The requests as the applier issues them, in plain Python (the rules clock_timelines states)."""
    snap = lambda mhz: int(np.argmin(np.abs(t.clocks_mhz - float(mhz))))  # noqa: E731
    out = []
    for g in range(len(t.device_keys)):
        steps = sorted(policy.steps[g], key=lambda s: s.t_ms)
        plan = [(i.at_s * 1e9, snap(i.sm_mhz)) for i in issue_plan(steps, lead_ms=policy.lead_ms, period_ms=30.0)]
        m = list(marks[g])
        m = [m[0] - (m[1] - m[0] if len(m) > 1 else 30e6)] + m
        issued = sorted(
            [
                (x + at, ci)
                for k, x in enumerate(m)
                for at, ci in plan
                if x + at < (m[k + 1] if k + 1 < len(m) else end_ns)
            ],
            key=lambda x: x[0],
        )
        ts, cis, before = [-np.inf], [snap(steps[0].sm_mhz)], snap(steps[0].sm_mhz)
        land = []
        for at, ci in issued:
            land.append((at + (up_v[ci] if ci > before else down_v[ci]) * 1e6, ci))
            before = ci
        for i, (x, ci) in enumerate(land):
            if all(x < y for y, _ in land[i + 1 :]):
                ts.append(x)
                cis.append(ci)
        out.append((ts, cis))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_timelines_are_the_requests_as_the_applier_issues_them(seed):
    rng = np.random.default_rng(seed)
    t, policy = _tables(), _policy(rng)
    marks = np.sort(rng.uniform(0, 90e6, size=(2, 3)), axis=1)
    up, down = rng.uniform(1, 12, size=3), rng.uniform(1, 12, size=3)
    ptr, ts, ci = clock_timelines(t, policy, marks, (up, down), end_ns=120e6)
    for g, (want_t, want_c) in enumerate(_reference(t, policy, marks, up, down, 120e6)):
        assert ts[ptr[g] : ptr[g + 1]].tolist() == want_t
        assert ci[ptr[g] : ptr[g + 1]].tolist() == want_c


@pytest.mark.parametrize("seed", range(4))
def test_predict_lanes_is_predict_at_each_latency_to_the_bit(seed):
    rng = np.random.default_rng(seed)
    t, policy = _tables(), _policy(rng)
    lats = [2.0, (9.0, 1.0), (np.array([1.0, 4.0, 12.0]), np.array([0.5, 2.0, 3.0])), 25.0]
    for lane, x in zip(predict_lanes(t, policy, lats), lats):
        one = predict(t, policy, transition_ms=x)
        assert (lane.makespan_ns, lane.energy_j, lane.idle_energy_j) == (
            one.makespan_ns,
            one.energy_j,
            one.idle_energy_j,
        )
        assert np.array_equal(lane.start_ns, one.start_ns) and np.array_equal(lane.finish_ns, one.finish_ns)
        assert np.array_equal(lane.idle_per_device_j, one.idle_per_device_j)


def test_the_default_clock_pass_is_made_once_and_never_written():
    t = _tables()
    first = predict(t, None)
    cached = default_pass(t)
    predict(t, _policy(np.random.default_rng(0)), transition_ms=5.0)
    assert default_pass(t) is cached and not cached[1].flags.writeable
    again = predict(t, None)
    assert again.makespan_ns == first.makespan_ns and np.array_equal(again.start_ns, first.start_ns)


def test_node_times_left_to_gather_are_the_same_once_gathered():
    t, policy = _tables(), _policy(np.random.default_rng(3))
    full = predict_lanes(t, policy, [2.0, 9.0])
    left = predict_lanes(t, policy, [2.0, 9.0], node_times=False)
    for a, b in zip(full, left):
        assert len(b.start_ns) == 0 and b.energy_j == a.energy_j
        b = with_node_times(t, b)
        assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.finish_ns, b.finish_ns)
