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
def test_perseus_runs_online_on_the_virtual_gpu_and_counts_its_profiling(monkeypatch):
    pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    from emo.baselines import OnlineContext, run_online
    from emo.config import GpuConfig, OptimizerConfig, typed
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
            "gpu.settle_s=1",
        ]
    )
    dev = open_device(cfg["gpu"])
    runs: list[tuple[object, float]] = []  # (policy, device seconds) of every run, in order
    real_run, real_set_policy = dev.run, dev.set_policy
    current: dict = {"policy": None}

    def set_policy(policy):
        current["policy"] = policy
        real_set_policy(policy)

    def run(*a, **kw):
        r = real_run(*a, **kw)
        runs.append((current["policy"], r.time_s))
        return r

    monkeypatch.setattr(dev, "set_policy", set_policy)
    monkeypatch.setattr(dev, "run", run)
    try:
        base = dev.run(cfg["workload"], 2, warmup=1)
        r = run_online(
            OnlineContext(
                dev,
                cfg["workload"],
                sorted(base.energy_per_device_j),
                0.05,
                typed(OptimizerConfig, cfg["optimizer"]),
                typed(GpuConfig, cfg["gpu"]),
                iterations=2,
                warmup=1,
            )
        )
    finally:
        dev.close()
    s = r.setting
    assert s["per"] == "instruction" and s["profiled_clocks"][0] == max(s["profiled_clocks"])
    assert s["profiling_gpu_s"] == pytest.approx(r.explore.time_s * 2) and r.explore.energy_j > 0
    assert all(len(v) == 8 for v in s["instruction_clocks"].values())  # 4 forwards + 4 backwards per stage
    # the sweep ends at its lowest clock, on a cooled die: gpu.settle_s at the max clock, then the plan
    *_, (swept, _), (max1, t1), (max2, t2), (plan, _) = runs
    assert swept.steps[0][0].sm_mhz == min(s["profiled_clocks"]) and max1 is max2 is None
    assert 0.95 <= t1 + t2 <= 1.0 + t1 and plan.trigger is not None  # settle_s, rounded up to an iteration


# ---------------------------------------------------------------- Perseus's controller on the virtual GPU
SCOPES = ("forward_step", "backward_step")


def _pp_device(*over: str):
    """A tiny PP2 workload (4 micro-batches: 8 instructions per stage) and a virtual A100 for it."""
    from emo.device.backends import open_device
    from emo.workflow.plan import compose

    cfg = compose(["workload=pp", "workload.pp=2", "workload.microbatches=4", "gpu.seed=0", *over])
    return cfg["workload"], open_device(cfg["gpu"])


def _triggered(dev, clocks: list[int], synchronize: bool):
    from emo.policy import FrequencyPolicy, Step, Trigger

    return FrequencyPolicy(
        gpu=dev.name,
        steps={d: [Step(0.0, c) for c in clocks] for d in (0, 1)},
        trigger=Trigger(SCOPES, synchronize),
    )


def test_a_triggered_policy_holding_the_max_clock_is_the_max_clock():
    from emo.policy import FrequencyPolicy

    wl, dev = _pp_device("gpu.noise=0")
    top = dev.default_clock()
    try:
        per_iter = {}
        for name, policy in (
            ("timed", FrequencyPolicy.static(dev.name, [0, 1], top)),
            ("no_sync", _triggered(dev, [top] * 8, False)),
            ("sync", _triggered(dev, [top] * 8, True)),
        ):
            dev.set_policy(policy)
            per_iter[name] = dev.run(wl, 3, warmup=1).time_s / 3
    finally:
        dev.close()
    # holding the clock it already has, a triggered policy without the synchronize is the max clock
    assert per_iter["no_sync"] == pytest.approx(per_iter["timed"], rel=2e-3)
    # with it, the host waits for the GPU to drain at every instruction, which can only cost time
    assert per_iter["sync"] >= per_iter["no_sync"]


@pytest.mark.parametrize("recv, cost", [("paired", (1.0, 1.01)), ("early", (1.2, 2.0))])
def test_the_synchronize_serialises_the_stages_only_where_receives_are_posted_early(recv, cost):
    # Megatron posts a gradient's receive with the send after the forward before that gradient's
    # backward; posted one instruction earlier, a device-wide synchronize waits for the next stage
    wl, dev = _pp_device("gpu.noise=0", f"workload.recv={recv}")
    top = dev.default_clock()
    try:
        per_iter = {}
        for sync in (False, True):
            dev.set_policy(_triggered(dev, [top] * 8, sync))
            per_iter[sync] = dev.run(wl, 3, warmup=1).time_s / 3
    finally:
        dev.close()
    assert cost[0] <= per_iter[True] / per_iter[False] <= cost[1]


@pytest.mark.parametrize("synchronize", [False, True])
def test_triggered_clock_changes_land_a_latency_after_the_hosts_scope_entries(synchronize):
    """Forwards at a low clock, backwards at the max: each request is made where the host enters the
    instruction's scope (after its cudaDeviceSynchronize returns, when synchronizing) and lands the
    virtual GPU's clock-change latency later (fixed here); a request repeating the clock is none."""
    from emo.workloads import build_program

    wl, dev = _pp_device(
        "gpu.physics.clock_delay_ms=[3.0,3.0]", "gpu.physics.clock_tail_prob=0", "gpu.physics.clock_target_slope=0"
    )
    top = dev.default_clock()
    low = dev.supported_clocks()[len(dev.supported_clocks()) // 2]
    prog = build_program(wl, dev.name)
    try:
        dev.set_policy(None)
        dev.run(wl, 1, warmup=0)  # every GPU at the max clock
        kinds = {}
        for r in (0, 1):
            kinds[r] = [str(op[1]) for op in prog.ops[r] if op[0] == 10 and str(op[1]) in SCOPES]  # Op.BEGIN
        clocks = {r: [low if k == "forward_step" else top for k in kinds[r]] for r in (0, 1)}
        from emo.policy import FrequencyPolicy, Step, Trigger

        policy = FrequencyPolicy(
            gpu=dev.name,
            steps={r: [Step(0.0, c) for c in clocks[r]] for r in (0, 1)},
            trigger=Trigger(SCOPES, synchronize),
        )
        dev.set_policy(policy)
        res = dev.simulate(prog, 2, policy=policy)
    finally:
        dev.close()
    for r in (0, 1):
        rec, g = res.ranks[r], res.gpus[r]
        if synchronize:  # the request follows the cudaDeviceSynchronize inserted at each scope entry
            asked = sorted(t0 + d for rt, t0, d, *_ in rec.host if rt == 7)
        else:
            asked = sorted(t0 for name, t0, _d, _e in rec.annotations if name in SCOPES)
        assert len(asked) == 2 * len(kinds[r])  # one per instruction per iteration
        seq = clocks[r] * 2
        changes = [asked[i] for i in range(len(seq)) if seq[i] != (seq[i - 1] if i else top)]
        lat = {c: dev.gp.clock_delay_ns(np.random.default_rng(0), dev.clock_index(c)) for c in (low, top)}
        landed = list(zip(g.clock_t[1:], g.clock_ci[1:]))
        assert len(landed) == len(changes) > 0
        for (t, ci), t_ask in zip(landed, changes):
            assert t == pytest.approx(t_ask + lat[dev.clocks[ci]], abs=1.0)  # ns


def test_a_triggered_policy_round_trips_and_is_refused_by_the_time_based_applier(tmp_path):
    from emo import loop
    from emo.policy import FrequencyPolicy, Step, Trigger

    p = FrequencyPolicy(
        gpu="a100",
        steps={0: [Step(0.0, 1410), Step(1.5, 1005), Step(1.5, 1410)], 3: [Step(0.0, 900)]},
        period_ms=12.0,
        meta={"method": "perseus"},
        trigger=Trigger(["forward_step", "backward_step"], True),
    )
    d = p.to_dict()
    assert d["trigger"] == {"scopes": ["forward_step", "backward_step"], "synchronize": True}
    assert FrequencyPolicy.from_dict(d) == p
    p.save(tmp_path / "policy.json")
    assert FrequencyPolicy.load(tmp_path / "policy.json") == p
    timed = FrequencyPolicy.static("a100", 2, 1200)
    assert "trigger" not in timed.to_dict() and FrequencyPolicy.from_dict(timed.to_dict()) == timed
    with pytest.raises(ValueError, match="trigger.scopes"):
        Trigger((), False)
    with pytest.raises(ValueError, match=r"policy\.json: a host-triggered policy .* cannot be applied on real GPUs"):
        loop.apply(tmp_path / "policy.json")


def test_perseus_policy_is_triggered_at_each_instruction_after_a_synchronize():
    from emo.baselines.perseus import TRIGGER, policy_of

    s = schedule(_trace(ORDER, DUR), stage_of([0, 1], 2))
    mhz = np.where(s.kind == "forward", 1005, 1410)
    p = policy_of(s, mhz, s.dur_ns.astype(float), {0: 0, 1: 1}, [0, 1], "a100", 0.0)
    assert p.trigger == TRIGGER and TRIGGER.synchronize and set(TRIGGER.scopes) == set(SCOPES)
    for r, seq in enumerate(ORDER):  # one step per instruction, in the stage's instruction order
        assert [st.sm_mhz for st in p.steps[r]] == [1005 if k == "forward" else 1410 for k, _ in seq]


def test_perseus_refuses_a_device_that_cannot_run_its_triggered_policy_before_profiling():
    from emo.baselines.perseus import run_perseus
    from emo.config import PerseusOptions

    class Hardware:  # e.g. NvmlDevice: its runtime applier issues steps at times
        name = "a100"

        def __getattribute__(self, item):
            if item in ("runs_triggered_policies", "__class__"):
                return object.__getattribute__(self, item)
            raise AssertionError(f"touched the device ({item}) before refusing")

    with pytest.raises(ValueError, match="host-triggered .* only the virtual GPU"):
        run_perseus(Hardware(), {}, [0, 1], 0.0, PerseusOptions(), min_clock_fraction=0.5, iterations=1, warmup=0)
