"""Merak's 1F1B order and command list (emo.perseus.merak) against lowtime's own schedule and the
power_states Perseus's server sent in the SOSP'24 runs."""

import gzip
import json
from pathlib import Path

import pytest

from emo.perseus.merak import BACKWARD, FORWARD, instruction_order, pipe_schedule
from emo.perseus.schedule import power_states

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-sosp24"
RUNS = DATA / "perseus" / "A100" / "dp1+pp4+tp1"


def test_order_is_a_1f1b_pipeline():
    S, M = 4, 6
    for s in range(S):
        order = instruction_order(s, S, M)
        assert sorted(order) == sorted([(k, m) for k in (FORWARD, BACKWARD) for m in range(M)])
        for m in range(M):
            assert order.index((FORWARD, m)) < order.index((BACKWARD, m))
        # warm-up: S - s forwards on stage s before its first backward (the last stage alternates)
        assert [k for k, _ in order[: S - s]] == [FORWARD] * (S - s)
        assert order[S - s] == (BACKWARD, 0)
    assert instruction_order(0, 1, 3) == [
        (FORWARD, 0),
        (BACKWARD, 0),
        (FORWARD, 1),
        (BACKWARD, 1),
        (FORWARD, 2),
        (BACKWARD, 2),
    ]


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="stage 4 is outside 0..3"):
        instruction_order(4, 4, 2)
    with pytest.raises(ValueError, match="at least one"):
        pipe_schedule(0, 2, 0)


def test_order_is_lowtimes_synchronous_1f1b():
    pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.perseus.schedule import Synchronous1F1B

    opts = CandidateExecutionOptions(options=[ExecutionOption(real_time=1.0, unit_time=1.0, cost=1.0, knob=1)])
    spec = OperationSpec(options=opts, cost_model=lambda t: 1.0)
    for S in (1, 2, 3, 8):
        for M in (1, 2, 5, 12):
            for s in range(S):
                lt = Synchronous1F1B(
                    num_stages=S, num_micro_batches=M, stage_id=s, operation_spec_map={Forward: spec, Backward: spec}
                )
                got = [(FORWARD if isinstance(i, Forward) else BACKWARD, i.micro_batch_id) for i in lt]
                assert got == instruction_order(s, S, M), (S, M, s)


def test_pipe_schedule_commands():
    cmds = pipe_schedule(0, 2, 2)
    assert cmds.count(FORWARD) == cmds.count(BACKWARD) == 2
    assert cmds[-3:] == ["cc", "cc", "step"]
    assert cmds.count("load") == 2  # the first stage loads every microbatch
    assert pipe_schedule(1, 3, 4).count("load") == 0  # a middle stage loads none


@pytest.mark.skipif(not RUNS.is_dir(), reason=f"{RUNS} missing (the perseus-sosp24 shared data)")
def test_measured_power_states_are_merak_commands_filled_from_compute():
    """Every measured plan (3 models, 4 stages): one power state per command of our pipe schedule,
    and the states are Perseus's expansion of the clocks at the compute commands."""
    runs = sorted(RUNS.iterdir())
    assert len(runs) == 3
    for run in runs:
        nmb = int(run.name.split("+nmb")[1].split("+")[0])
        for f in sorted(run.glob("*.sched.json.gz"))[:6]:
            ranks = json.loads(gzip.decompress(f.read_bytes()))
            for r in ranks:
                pipe = pipe_schedule(r["rank"], len(ranks), nmb)
                ps = r["power_states"]
                assert len(ps) == len(pipe), (f, r["rank"])
                clocks = [p for p, c in zip(ps, pipe) if c in (FORWARD, BACKWARD)]
                assert len(clocks) == 2 * nmb
                assert power_states(pipe, clocks) == ps, (f, r["rank"])
