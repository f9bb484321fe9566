"""Perseus as its code runs it: instructions read from a trace, its 1F1B DAG, lowtime on a profiled
table, one clock per instruction, and the online run on the virtual GPU."""

import numpy as np
import pandas as pd
import pytest

from emo.baselines.perseus_schedule import (
    dag_edges,
    earliest_starts,
    instructions,
    lags,
    schedule,
    stage_of,
)


def _trace(order, dur, gap=120_000):
    """A synthetic 1F1B trace, causally consistent: per rank a ProfilerStep, forward_step /
    backward_step annotations, a launch per instruction and its kernel (and an NCCL kernel after
    it, which must not count); an instruction starts `gap` after its stage's previous one and its
    upstream instruction end."""
    end: dict = {}
    start: dict = {}
    for _ in range(sum(map(len, order))):  # relax to the fixed point (a DAG: len passes suffice)
        for rank, seq in enumerate(order):
            t = 0
            for kind, m in seq:
                up = (rank - 1, kind, m) if kind == "forward" else (rank + 1, kind, m)
                ready = end.get(up, 0) if 0 <= up[0] < len(order) else 0
                st = max(t, ready) + gap
                start[(rank, kind, m)], end[(rank, kind, m)] = st, st + dur[(rank, kind)]
                t = st + dur[(rank, kind)]
    rows, corr = [], 0
    for rank, seq in enumerate(order):
        rows.append(
            {
                "rank": rank,
                "kind": "annotation",
                "name": "ProfilerStep#1",
                "start_ns": 0,
                "dur_ns": 10**9,
                "correlation": -1,
            }
        )
        for kind, m in seq:
            st, d = start[(rank, kind, m)], dur[(rank, kind)]
            rows.append(
                {
                    "rank": rank,
                    "kind": "annotation",
                    "name": f"{kind}_step",
                    "start_ns": st - 20,
                    "dur_ns": 50,
                    "correlation": -1,
                }
            )
            rows.append(
                {
                    "rank": rank,
                    "kind": "runtime",
                    "name": "cudaLaunchKernel",
                    "start_ns": st - 10,
                    "dur_ns": 5,
                    "correlation": corr,
                }
            )
            rows.append(
                {"rank": rank, "kind": "kernel", "name": "gemm", "start_ns": st, "dur_ns": d, "correlation": corr}
            )
            rows.append(
                {
                    "rank": rank,
                    "kind": "kernel",
                    "name": "ncclDevKernel_SendRecv",
                    "start_ns": st + d,
                    "dur_ns": 7,
                    "correlation": corr + 10**6,
                }
            )
            corr += 1
    return pd.DataFrame(rows)


ORDER = [
    [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)],
    [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)],
]
DUR = {
    (0, "forward"): 1_000_000,
    (0, "backward"): 2_000_000,
    (1, "forward"): 1_100_000,
    (1, "backward"): 2_100_000,
}  # ns


def test_instructions_are_the_annotated_forward_and_backward_steps_without_nccl():
    df = instructions(_trace(ORDER, DUR))
    assert len(df) == 8
    assert df.groupby(["rank", "kind"])["dur_ns"].first().to_dict() == {
        (0, "backward"): 2_000_000,
        (0, "forward"): 1_000_000,
        (1, "backward"): 2_100_000,
        (1, "forward"): 1_100_000,
    }
    assert (
        df.groupby(["rank", "kind"])["micro"].apply(list)
        == pd.Series([[0, 1]] * 4, index=df.groupby(["rank", "kind"])["micro"].apply(list).index)
    ).all()


def test_the_dag_is_1f1b_and_the_lags_reproduce_the_traced_starts():
    s = schedule(_trace(ORDER, DUR), stage_of([0, 1], 2))
    a, b = dag_edges(s)
    key = {(int(st), str(k), int(m)): i for i, (st, k, m) in enumerate(zip(s.stage, s.kind, s.micro))}
    edges = set(zip(a.tolist(), b.tolist()))
    assert (key[(0, "forward", 1)], key[(1, "forward", 1)]) in edges  # forward flows down
    assert (key[(1, "backward", 0)], key[(0, "backward", 0)]) in edges  # backward flows up
    assert (key[(1, "forward", 0)], key[(1, "backward", 0)]) in edges  # a stage's own order
    start = earliest_starts(s.dur_ns, a, b, lags(s, a, b))
    assert np.allclose(start, s.offset_ns)


def test_a_trace_without_pipeline_instructions_has_no_schedule():
    ev = _trace(ORDER, DUR)
    ev = ev[~ev["name"].str.endswith("_step")]
    assert schedule(ev, stage_of([0, 1], 1)) is None


def test_stages_follow_megatrons_rank_order():
    assert stage_of(list(range(8)), 2) == {r: r // 4 for r in range(8)}
    assert stage_of([0, 1, 2, 3], 4) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_lowtime_slows_what_is_off_the_critical_path_and_keeps_the_deadline():
    pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    from emo.baselines.perseus import plan

    s = schedule(_trace(ORDER, DUR), stage_of([0, 1], 2))
    clocks = [1410, 1200, 1005, 810]
    table = {}
    for (st, k), d in DUR.items():
        table[(st, k)] = {f: (d * 1410 / f, 1e-6 * d * (0.3 + (f / 1410) ** 2)) for f in clocks}
    mhz, info = plan(s, table, clocks, 0.0, p_blocking_w=0.0, members={0: 1, 1: 1}, max_iterations=200)
    assert info["planned_dag_time_ms"] <= info["dag_time_ms"] * (1 + 1e-6) + info["unit_time_ms"]
    assert mhz.min() < 1410  # the stage that waits runs some instruction slower
    slack_free, _ = plan(s, table, clocks, 1.0, p_blocking_w=0.0, members={0: 1, 1: 1}, max_iterations=200)
    assert slack_free.sum() <= mhz.sum()  # a looser deadline never asks for more clock


@pytest.mark.slow
def test_perseus_runs_online_on_the_virtual_gpu_and_counts_its_profiling():
    pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    from emo.baselines import run_online
    from emo.device.backends import open_device
    from emo.workflow.plan import compose

    cfg = compose(
        [
            "workload=pp",
            "workload.pp=2",
            "workload.microbatches=4",
            "gpu.seed=0",
            "optimizer=perseus",
            "optimizer.perseus.profile_iters=1",
            "optimizer.perseus.warmup_iters=0",
            "optimizer.min_clock_fraction=0.9",
        ]
    )
    dev = open_device(cfg["gpu"])
    try:
        base = dev.run(cfg["workload"], 2, warmup=1)
        r = run_online(
            "perseus",
            dev,
            cfg["workload"],
            sorted(base.energy_per_device_j),
            0.05,
            cfg["optimizer"],
            cfg["gpu"],
            iterations=2,
            warmup=1,
        )
    finally:
        dev.close()
    s = r.setting
    assert s["per"] == "instruction" and s["profiled_clocks"][0] == max(s["profiled_clocks"])
    assert s["profiling_gpu_s"] == pytest.approx(r.explore.time_s * 2) and r.explore.energy_j > 0
    assert all(len(v) == 8 for v in s["instruction_clocks"].values())  # 4 forwards + 4 backwards per stage
