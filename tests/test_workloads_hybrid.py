"""The hybrid TP x PP x DP workload: ranks in Megatron's order, TP all-reduces within a stage, P2P
between stages rank to rank, DDP-bucketed gradient all-reduces over the replicas in the last
micro-batch's backward (overlapping it) before the optimizer step; bad sizes fail in one line; the
whole pipeline runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emo.cli.compare import workload_label
from emo.device.sim.program import Op
from emo.workloads import build_program
from emo.workloads.emitter import COMPUTE
from emo.workloads.pp import DP, Grid, one_f_one_b

ROOT = Path(__file__).resolve().parents[1]


def where(g: Grid, r: int) -> tuple[int, int, int]:
    """(stage, replica, TP rank) of global rank r."""
    return r // (g.tp * g.dp), (r // g.tp) % g.dp, r % g.tp


@pytest.mark.parametrize("tp,pp,dp", [(2, 2, 2), (4, 2, 1), (1, 4, 2), (2, 1, 4), (8, 2, 2)])
def test_collectives_run_over_the_right_groups(tp: int, pp: int, dp: int) -> None:
    layers = max(pp, 2)
    p = build_program(
        {
            "kind": "hybrid",
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "microbatches": max(pp, 2),
            "model": {"layers": layers, "seq": 512},
        }
    )
    g = Grid(tp, pp, dp)
    assert p.ranks == tp * pp * dp == g.ranks
    kinds = set()
    for c in p.collectives:
        at = [where(g, r) for r in c.ranks]
        if c.group.startswith("tp"):  # within one stage of one replica, all its TP ranks
            kinds.add("tp")
            assert c.kind == "allreduce" and len(c.ranks) == tp
            assert len({(s, d) for s, d, _ in at}) == 1 and sorted(t for *_, t in at) == list(range(tp))
        elif c.group.startswith("dp"):  # the same stage and TP rank of every replica
            kinds.add("dp")
            assert c.kind == "allreduce" and len(c.ranks) == dp
            assert len({(s, t) for s, _, t in at}) == 1 and sorted(d for _, d, _ in at) == list(range(dp))
        elif c.kind == "sendrecv":  # neighbouring stages, same replica and TP rank
            kinds.add("p2p")
            (s0, d0, t0), (s1, d1, t1) = at
            assert abs(s0 - s1) == 1 and (d0, t0) == (d1, t1)
        else:  # clip-grad-norm over the model-parallel group of one replica
            kinds.add("norm")
            assert c.kind == "allreduce" and c.nbytes == 4 and len(c.ranks) == tp * pp
            assert len({d for _, d, _ in at}) == 1
    want = {k for k, on in (("tp", tp > 1), ("dp", dp > 1), ("p2p", pp > 1), ("norm", tp * pp > 1)) if on}
    assert kinds == want


def test_program_structure_of_the_default() -> None:
    p = build_program({"kind": "hybrid"})
    assert p.ranks == 8 and p.name == "tp2pp2dp2" and p.meta["kind"] == "hybrid"
    assert p.meta["layers_per_stage"] == [4, 4]
    # a modest program: a few hundred launches per rank
    assert 300 <= p.kernel_launches() / p.ranks <= 1500
    for r, ops in enumerate(p.ops):
        s = r // 4
        steps = [op[1][0].upper() for op in ops if op[0] == Op.BEGIN and op[1] in ("forward_step", "backward_step")]
        assert steps == [k for k, _ in one_f_one_b(s, 2, 4)]


def _dp_positions(p, r: int):
    ops = p.ops[r]
    begins = [i for i, op in enumerate(ops) if op[0] == Op.BEGIN and op[1] == "backward_step"]
    dp = [i for i, op in enumerate(ops) if op[0] == Op.COLLECTIVE and op[1] == DP]
    adam = next(i for i, op in enumerate(ops) if op[0] == Op.LAUNCH and "FusedAdam" in p.kernels[op[2]].name)
    return ops, begins, dp, adam


def test_gradient_all_reduce_is_bucketed_in_the_last_backward_and_done_before_the_step() -> None:
    p = build_program({"kind": "hybrid", "tp": 2, "pp": 2, "dp": 2, "bucket_mb": 25})
    for r in range(p.ranks):
        ops, begins, dp, adam = _dp_positions(p, r)
        assert len(dp) >= 3  # several DDP buckets, not one all-reduce at the end
        assert begins[-1] < dp[0] and dp[-1] < adam  # during the last micro-batch's backward
        # the gradients of every parameter, reduced once: bucket bytes = this rank's parameters
        stage = r // 4
        total = sum(p.collectives[ops[i][2]].nbytes for i in dp)
        assert abs(total / 2 - p.meta["params_per_stage"][stage]) / p.meta["params_per_stage"][stage] < 0.01
        assert all(p.collectives[ops[i][2]].nbytes <= 130 * 2**20 for i in dp)
        # the first buckets overlap the rest of the backward on the compute stream ...
        assert any(
            op[0] == Op.LAUNCH and op[1] == COMPUTE and "gemm" in p.kernels[op[2]].name for op in ops[dp[0] : dp[-1]]
        )
        # ... and the compute stream waits for the DP stream before the optimizer touches the gradients
        rec = [op[1] for op in ops[dp[-1] : adam] if op[0] == Op.RECORD and op[2] == DP]
        assert any(op[0] == Op.WAIT and op[1] == COMPUTE and op[2] in rec for op in ops[dp[-1] : adam])


def test_bigger_buckets_mean_fewer_all_reduces() -> None:
    small = build_program({"kind": "hybrid", "bucket_mb": 10})
    big = build_program({"kind": "hybrid", "bucket_mb": 200})
    count = lambda p: sum(c.group.startswith("dp") for c in p.collectives)  # noqa: E731
    assert count(big) < count(small)
    assert sum(c.nbytes for c in big.collectives if c.group.startswith("dp")) == sum(
        c.nbytes for c in small.collectives if c.group.startswith("dp")
    )


def test_without_data_parallelism_there_is_no_gradient_all_reduce() -> None:
    p = build_program({"kind": "hybrid", "dp": 1})
    assert p.ranks == 4 and not any(c.group.startswith("dp") for c in p.collectives) and DP not in p.streams


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"kind": "hybrid", "tp": 3}, "workload.tp must be one of 1, 2, 4, 8 (got 3)"),
        ({"kind": "hybrid", "dp": 0}, "workload.dp must be one of 1, 2, 4, 8, 16 (got 0)"),
        # TP8 x PP8 x DP16 = 1,024 GPUs is the largest job; a wider data-parallel dimension is refused
        ({"kind": "hybrid", "tp": 8, "pp": 8, "dp": 32}, "workload.dp must be one of 1, 2, 4, 8, 16 (got 32)"),
        ({"kind": "hybrid", "pp": 4, "microbatches": 2}, "workload.microbatches must be >= workload.pp (4) (got 2)"),
        (
            {"kind": "hybrid", "pp": 8, "microbatches": 8, "model": {"layers": 4}},
            "workload.model.layers must be >= workload.pp (8) (got 4)",
        ),
        (
            {"kind": "hybrid", "tp": 8, "model": {"heads": 12, "hidden": 768}},
            "workload.model.heads must be divisible by workload.tp (8)",
        ),
        ({"kind": "hybrid", "bucket_mb": 0}, "workload.bucket_mb must be > 0"),
    ],
)
def test_bad_sizes_fail_with_one_line_naming_the_key(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        build_program(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_compare_labels_the_hybrid_cells() -> None:
    params = {"workload.kind": "hybrid", "workload.tp": "2", "workload.pp": "4", "workload.dp": "2"}
    assert workload_label(params) == "TP2xPP4xDP2"
    assert workload_label({"workload.kind": "tp", "workload.tp": "8", "workload.overlap": "megatron"}) == "TP8 megatron"


def test_hydra_sweeps_over_the_grid() -> None:
    from emo.workflow.sweep import build

    sw = build(
        [["workload=hybrid", f"workload.tp={t}", f"workload.pp={p}", "workload.dp=2"] for t in (1, 2) for p in (2, 4)]
    )
    assert len(sw.jobs) == 4 and len({j.plans["trace"].hash for j in sw.jobs}) == 4


SMALL = [
    "workload=hybrid",
    "workload.tp=2",
    "workload.pp=2",
    "workload.dp=2",
    "workload.microbatches=2",
    "workload.model.layers=2",
    "workload.model.seq=1024",
    "model.clocks_stride=8",
    "model.repeats=1",
    "model.min_seconds=0.2",
    "trace.iterations=2",
    "validate.min_seconds=0.5",
    "tracking.enabled=false",
]


@pytest.mark.slow
def test_emo_run_takes_a_hybrid_cell_through_every_stage(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "emo.cli", "run", "-c", "2", f"results={tmp_path}", *SMALL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results = list(tmp_path.glob("validate/*/result.json"))
    assert len(results) == 1
    res = json.loads(results[0].read_text())
    # validate measured the baseline and the policy on all 8 GPUs
    assert len(res["baseline"]["energy_per_device_j"]) == len(res["optimized"]["energy_per_device_j"]) == 8
    assert res["metrics"]["pl_pct"] <= 100 * res["budget"] + 0.5 and res["metrics"]["es_pct"] > 0
    trace = list(tmp_path.glob("trace/*/config.json"))
    assert trace and '"hybrid"' in trace[0].read_text()
