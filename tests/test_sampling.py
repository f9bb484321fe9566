"""Planning a job from a sample of its ranks (emo.sampling, trace.ranks): hybrid jobs to 1,024 GPUs,
the sample must cover every pipeline stage and TP position (one line naming trace.ranks), its events
are one rank per class with collectives joined through their classes, the policy maps every rank to
its class's schedule (meta.ranks) and the virtual GPU follows it, and the sampled chain runs end to
end with validate measuring every rank."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from emo.device.sim.device import NODE_GPUS, SimDevice
from emo.policy import FrequencyPolicy, Step, check_policy
from emo.sampling import canonical_events, class_spread, expand_policy, parse_ranks, sample_of
from emo.workloads import build_program
from emo.workloads.pp import Grid

HYBRID = {"kind": "hybrid", "tp": 2, "pp": 2, "dp": 4}
GRID = (2, 2, 4)  # its (tp, pp, dp)


def test_the_largest_hybrid_job_is_tp8_pp8_dp16_with_its_gradient_all_reduce_over_16_replicas() -> None:
    p = build_program({"kind": "hybrid", "tp": 8, "pp": 8, "dp": 16, "microbatches": 8})
    g = Grid(8, 8, 16)
    assert p.ranks == 1024
    dp = [c for c in p.collectives if c.group.startswith("dp")]
    assert dp and all(len(c.ranks) == 16 for c in dp)
    assert {c.ranks for c in dp} == {g.dp_group(s, t) for s in range(8) for t in range(8)}


def test_replica_covers_every_class_and_lists_and_ranges_parse() -> None:
    s = sample_of(HYBRID, "replica", GRID)
    assert s is not None and s.sampled == (0, 1, 8, 9) and s.world == 16
    assert sample_of(HYBRID, "all", GRID) is None
    assert parse_ranks("0-1, 8-9", 16) == [0, 1, 8, 9] == parse_ranks([9, 8, 1, 0], 16)
    # any sample covering every (stage, TP position), replicas mixed: the first of each class represents it
    s = sample_of(HYBRID, [2, 7, 8, 15, 3], GRID)
    assert s is not None and s.reps == {0: 2, 1: 3, 2: 8, 3: 15}
    assert s.rank_map()[0] == 2 and s.rank_map()[13] == 15  # rank 13: stage 1, replica 2, TP position 1


@pytest.mark.parametrize(
    "spec,words",
    [
        ([0, 1, 8], "leaves stage 1 TP position 1 uncovered (rank 9 is one of them)"),
        ("0-7", "leaves stage 1 TP position 0, stage 1 TP position 1 uncovered"),
        ([0, 99], "ranks of the job (0-15; rank 99 is not one)"),
        ("0-x", "a list of ranks and ranges like 0-7,64-71"),
    ],
)
def test_a_sample_leaving_a_stage_or_tp_position_uncovered_is_refused_in_one_line(spec, words: str) -> None:
    with pytest.raises(ValueError) as e:
        sample_of(HYBRID, spec, GRID)
    text = str(e.value)
    assert "\n" not in text and text.startswith("bad configuration: trace.ranks must be") and words in text


def test_the_configuration_refuses_a_bad_sample_before_any_stage_runs() -> None:
    from emo.workflow.plan import compose

    with pytest.raises(ValueError, match=r"trace\.ranks must be a sample covering every pipeline stage"):
        compose(["workload=hybrid", "workload.dp=4", "trace.ranks=[0,1]"])
    with pytest.raises(ValueError, match=r"trace\.ranks must be all for workload=offload"):
        compose(["workload=offload", "trace.ranks=replica"])
    cfg = compose(["workload=hybrid", "workload.dp=16", "workload.pp=4", "trace.ranks=replica"])
    assert cfg["trace"]["ranks"] == "replica" and compose([])["trace"]["ranks"] == "all"


def _sampled_events(tmp_path: Path, spec):
    from emo.trace import read_trace

    prog = build_program({**HYBRID, "microbatches": 2, "model": {"layers": 2, "seq": 512}})
    dev = SimDevice(_a100())
    s = sample_of(HYBRID, spec, GRID)
    assert s is not None
    dev.run(prog, 1, warmup=0, trace_dir=tmp_path, trace_ranks=list(s.sampled))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"rank{r}.pt.trace.json.gz" for r in s.sampled)
    return s, read_trace(tmp_path)


@pytest.mark.parametrize("spec", ["replica", [2, 3, 8, 15]])
def test_sampled_events_are_one_rank_per_class_with_their_collectives_matched(tmp_path: Path, spec) -> None:
    from emo.graph import build_graph

    s, events = _sampled_events(tmp_path, spec)
    ev = canonical_events(events, s)
    assert sorted(ev["rank"].unique()) == sorted(s.reps.values())
    assert not any("absent" in w for w in ev.attrs["warnings"])
    g = build_graph(ev)
    unmatched = g.meta["collectives_unmatched"]
    # only the data-parallel all-reduces stay alone: their members are one class (the replicas alike)
    assert unmatched and all(u["why"] == "only one rank takes part" and u["group"].startswith("dp") for u in unmatched)
    assert g.meta["collectives_matched"] > 0
    # TP and pipeline collectives all matched: as many as in replica 0's own graph
    if spec != "replica":
        rs, revents = _sampled_events(tmp_path / "r", "replica")
        ref = build_graph(canonical_events(revents, rs))
        assert g.meta["collectives_matched"] == ref.meta["collectives_matched"]


def test_the_policy_maps_every_rank_to_its_class_and_states_the_job_energy() -> None:
    s = sample_of(HYBRID, "replica", GRID)
    assert s is not None
    same = [Step(0.0, 1410), Step(5.0, 1005)]
    pol = FrequencyPolicy(
        gpu="a100",
        steps={0: same, 1: list(same), 8: [Step(0.0, 1200)], 9: [Step(0.0, 1410)]},
        predicted_time_s=0.1,
        predicted_energy_j=40.0,
        meta={"baseline_energy_j": 44.0},
    )
    info = expand_policy(pol, s)
    assert info["schedules"] == 3 and sorted(pol.steps) == [0, 8, 9]  # ranks 0 and 1 share one schedule
    assert pol.predicted_energy_j == 160.0 and pol.meta["baseline_energy_j"] == 176.0  # x 4 replicas
    back = FrequencyPolicy.from_dict(json.loads(json.dumps(pol.to_dict())))
    check_policy(back, "policy.json", world_size=16)  # covers every rank of the job
    assert back.meta["ranks"]["5"] == 0 and back.meta["ranks"]["14"] == 8 and back.meta["ranks"]["15"] == 9
    assert "assumed to run as its class's sampled rank does" in back.meta["sample"]["assumption"]
    spread = class_spread(back.meta, {str(r): 10.0 + (r == 13) for r in range(16)})
    assert spread is not None and spread["unsampled_ranks_measured"] == 12
    assert spread["energy_vs_class_rep_max_abs_pct"] == pytest.approx(10.0)


def _a100() -> dict:
    from emo.workflow.plan import compose

    return compose([])["gpu"]


def test_the_virtual_gpu_follows_meta_ranks_as_it_follows_per_rank_steps() -> None:
    prog = build_program({**HYBRID, "microbatches": 2, "model": {"layers": 2, "seq": 512}})
    steps = [Step(0.0, 1410), Step(2.0, 900), Step(8.0, 1410)]
    mapped = FrequencyPolicy(gpu="a100", steps={0: steps}, meta={"ranks": {str(r): 0 for r in range(16)}})
    each = FrequencyPolicy(gpu="a100", steps={r: list(steps) for r in range(16)})
    out = []
    for pol in (mapped, each):
        dev = SimDevice(_a100())
        dev.set_policy(pol)
        out.append(dev.run(prog, 2, warmup=1))
    assert out[0].time_s == out[1].time_s and out[0].energy_per_device_j == out[1].energy_per_device_j
    unmanaged = SimDevice(_a100()).run(prog, 2, warmup=1)
    assert out[0].energy_j < unmanaged.energy_j  # the mapped ranks did lower their clocks


def test_the_virtual_gpu_grows_past_the_node_and_leaves_the_first_gpus_as_they_were() -> None:
    small = build_program({"kind": "tp", "tp": 2, "model": {"layers": 1}})
    a, b = SimDevice(_a100()), SimDevice(_a100())
    b._grow(NODE_GPUS * 2)
    ra, rb = a.run(small, 1, warmup=0), b.run(small, 1, warmup=0)
    assert ra.time_s == rb.time_s and np.allclose(
        list(ra.energy_per_device_j.values()), list(rb.energy_per_device_j.values())
    )
    big = build_program({"kind": "hybrid", "tp": 2, "pp": 4, "dp": 16, "model": {"layers": 4, "seq": 256}})
    r = a.run(big, 10, warmup=0)  # (long enough for the energy counter: one 20 ms iteration is not)
    assert len(r.energy_per_device_j) == 128 and min(r.energy_per_device_j.values()) > 0


def test_the_sampled_chain_plans_every_rank_and_validate_measures_each(tmp_path: Path) -> None:
    from emo.stages import run_chain
    from emo.workflow.plan import compose

    cfg = compose(
        [
            "workload=hybrid",
            "workload.tp=1",
            "workload.pp=2",
            "workload.dp=4",
            "workload.microbatches=2",
            "workload.model.layers=2",
            "gpu.settle_s=0",
            "model.level_fractions=[0.7]",
            "validate.min_seconds=0.5",
            "trace.ranks=replica",
            "trace.untraced_iterations=3",
            f"results={tmp_path}",
        ]
    )
    done = run_chain(cfg, tmp_path, "validate")
    assert sorted(p.name for p in (done["trace"] / "kineto").iterdir()) == [
        "rank0.pt.trace.json.gz",
        "rank4.pt.trace.json.gz",
    ]
    pol = FrequencyPolicy.load(done["optimize"] / "policy.json")
    check_policy(pol, "policy.json", world_size=8)
    assert set(pol.meta["ranks"].values()) <= {0, 4} and len(pol.meta["ranks"]) == 8
    summary = json.loads((done["optimize"] / "summary.json").read_text())
    assert (
        summary["sample"]["planned_from"] == [0, 4]
        and "validate measures every rank" in summary["sample"]["assumption"]
    )
    result = json.loads((done["validate"] / "result.json").read_text())
    assert len(result["optimized"]["energy_per_device_j"]) == 8  # every rank measured
    assert result["sample"]["check"]["unsampled_ranks_measured"] == 6
    assert abs(result["metrics"]["energy_error_pct"]) < 10  # the job's energy predicted, not one replica's
