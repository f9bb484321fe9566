"""Perseus's problem in EMO (emo.perseus): the stage profile, the 1F1B DAG and its accounting, EMO's
plan on it, and `emo perseus-plan`'s files read back as Perseus reads them."""

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from emo.cli import main
from emo.perseus.dag import candidates, pipeline, plan
from emo.perseus.merak import instruction_order, pipe_schedule
from emo.perseus.profile import parse_profile, read_profile

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-sosp24" / "emulation"
CLOCKS = (900, 1200, 1410)


def _table(stages=2) -> pd.DataFrame:
    """A stage profile: forward 10/8/7 ms, backward twice that; power rises with the clock."""
    rows = []
    for s in range(stages):
        for kind, scale in (("forward", 1.0), ("backward", 2.0)):
            for mhz, t in zip(CLOCKS, (0.010, 0.008, 0.007)):
                t = t * scale * (1 + 0.1 * s)
                rows.append((s, kind, mhz, t, t * (100 + 0.15 * mhz)))
    return pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])


def _profile(tmp_path: Path, df: pd.DataFrame | None = None) -> Path:
    path = tmp_path / "profile.csv"
    (_table() if df is None else df).to_csv(path, index=False)
    return path


def test_profile_arrays(tmp_path):
    prof = read_profile(_profile(tmp_path))
    assert prof.stages == 2 and prof.clocks_mhz.tolist() == list(CLOCKS)
    assert prof.time_s[1, 1, 2] == pytest.approx(0.007 * 2 * 1.1)  # stage 1, backward, 1410 MHz


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.drop(columns="energy"), "no column energy"),
        (lambda d: d.drop(index=3), "stage 0 backward at 900 MHz is missing"),
        (lambda d: pd.concat([d, d.iloc[[0]]]), "stage 0 forward at 900 MHz is twice"),
        (
            lambda d: d.assign(time=d["time"].astype(object).where(d.index != 4, "fast")),
            "row 6: time is not a finite number",
        ),
        (lambda d: d.assign(instruction=d["instruction"].where(d.index != 0, "recompute")), "forward or backward"),
        (lambda d: d.assign(stage=d["stage"] * 2), "stages must be 0..2"),
        (lambda d: d.assign(time=-d["time"]), "time must be > 0"),
    ],
)
def test_bad_profile_is_one_line_naming_the_file(edit, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_profile(edit(_table()), "p.csv")
    assert str(e.value).startswith("p.csv: ") and "\n" not in str(e.value)


def test_dag_timing_and_accounting(tmp_path):
    """2 stages, 2 microbatches at the max clock: F0 F1 on stage 0, then stage 1's F/B pairs, then
    stage 0's backwards; the iteration and the blocking-power accounting by hand."""
    prof = read_profile(_profile(tmp_path))
    w = 50.0
    dag = pipeline(prof, 2, 2, w, 0.0)
    assert dag.problem.n == 8
    f0, b0, f1, b1 = 0.007, 0.014, 0.0077, 0.0154
    # stage 0: F0 F1 ... B0 B1; stage 1: F0 B0 F1 B1
    t = f0 + f1 + b1 + f1 + b1 + b0  # F0 on stage 0, stage 1's F0 B0 F1 B1, then B1 on stage 0
    top = np.full(8, dag.problem.ref)
    got_t, got_e = dag.accounting(top)
    assert got_t == pytest.approx(t)
    busy = 2 * (prof.time_s[:, :, 2].sum())  # each instruction twice
    energy = 2 * prof.energy_j[:, :, 2].sum() + w * (2 * t - busy)
    assert got_e == pytest.approx(energy)
    # EMO's own bookkeeping (the solver's objective) agrees with the direct accounting
    from emo.optimize.problem import evaluate

    choice = np.full(dag.items.k, 1)
    ev = evaluate(dag.problem, dag.items, choice)
    assert dag.accounting(dag.node_columns(choice)) == pytest.approx((ev.makespan_ns * 1e-9, ev.energy_j))


def test_plan_meets_the_target_and_saves(tmp_path):
    dag = pipeline(read_profile(_profile(tmp_path)), 2, 4, 60.0, 0.0)
    t0, e0 = dag.accounting(np.full(dag.problem.n, dag.problem.ref))
    cols = plan(dag, 1.1 * t0)
    t, e = dag.accounting(cols)
    assert t <= 1.1 * t0 + 1e-9 and e < e0
    with pytest.raises(ValueError, match="below the iteration at the maximum clocks"):
        plan(dag, 0.5 * t0)


def test_candidates_are_lowtimes():
    pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption

    rng = np.random.default_rng(0)
    for unit in (1e-3, 1e-4, 0.0):
        for _ in range(20):
            t = np.sort(rng.uniform(0.05, 0.08, 12))[::-1] + rng.normal(0, 0.001, 12)
            e = rng.uniform(20, 30, 12)
            mine = candidates(t, e, unit)
            if unit == 0:  # lowtime needs a quantum; without one only the Pareto filter remains
                dominated = [any(t[o] < t[c] and e[o] < e[c] for o in range(12)) for c in range(12)]
                assert mine.tolist() == [not d for d in dominated]
                continue
            opts = [
                ExecutionOption(real_time=float(a), unit_time=unit, cost=float(b), knob=c)
                for c, (a, b) in enumerate(zip(t, e))
            ]
            theirs = {o.knob for o in CandidateExecutionOptions(options=opts).options}
            assert set(np.flatnonzero(mine)) == theirs


def _config_to_schedule(config, pipe_schedules):
    """Perseus's own expansion of a plan into power states (perseus/server/scheduler/interface.py
    `PowerStateScheduler._config_to_schedule`, kronos branch), with its PipeInstruction values."""
    schedules = []
    for stage_id, pipe in enumerate(pipe_schedules):
        schedule = []
        config_iter = iter(config[stage_id])
        power_state = config[stage_id][0]
        num_compute_insts = 0
        for inst in pipe:
            if inst in ["forward", "backward"]:
                power_state = next(config_iter)
                num_compute_insts += 1
            schedule.append(power_state)
        if num_compute_insts != len(config[stage_id]):
            raise RuntimeError("Number of compute instructions does not match")
        schedules.append({"rank": stage_id, "power_states": schedule})
    return schedules


def test_cli_writes_perseus_schedules(tmp_path, capsys):
    out = tmp_path / "plan"
    S, M = 2, 4
    rc = main(
        [
            "perseus-plan",
            str(_profile(tmp_path)),
            "--stages",
            str(S),
            "--microbatches",
            str(M),
            "--budget",
            "0.1",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("emo perseus-plan: 2 stages x 4 microbatches")
    # PointSolution._read_solution: eval of the file (a literal: read it as one)
    config = ast.literal_eval((out / "freqs_pipeline.py").read_text())
    assert len(config) == S and all(len(c) == 2 * M for c in config)
    assert {x for c in config for x in c} <= set(CLOCKS)
    sched = json.loads((out / "sched.json").read_text())
    assert sched == _config_to_schedule(config, [pipe_schedule(s, S, M) for s in range(S)])
    # the clocks are the plan's, instruction by instruction in Merak's order
    summary = json.loads((out / "plan.json").read_text())
    dag = pipeline(read_profile(_profile(tmp_path)), S, M, summary["blocking_power_w"], 0.0)
    cols = [int(np.searchsorted(dag.problem.clocks_mhz, x)) for c in config for x in c]
    t, e = dag.accounting(np.array(cols))
    assert (t, e) == pytest.approx((summary["iteration_time_s"], summary["energy_j"]))
    assert t <= summary["target_time_s"] + 1e-9 and e < summary["max_clock_energy_j"]
    assert [len(instruction_order(s, S, M)) for s in range(S)] == [len(c) for c in config]


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    prof = _profile(tmp_path)
    assert (
        main(
            [
                "perseus-plan",
                str(prof),
                "--stages",
                "3",
                "--microbatches",
                "2",
                "--budget",
                "0.05",
                "-o",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"emo: error: {prof}: --stages 3") and "\n" not in err
    assert (
        main(
            [
                "perseus-plan",
                str(prof),
                "--stages",
                "2",
                "--microbatches",
                "2",
                "--target-time",
                "0.001",
                "-o",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "--target-time: target time 0.001 s is below" in capsys.readouterr().err
    assert (
        main(
            [
                "perseus-plan",
                str(tmp_path / "nope.csv"),
                "--stages",
                "2",
                "--microbatches",
                "2",
                "--budget",
                "0.05",
                "-o",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "nope.csv: no such file" in capsys.readouterr().err


@pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} missing (the perseus-sosp24 shared data)")
@pytest.mark.parametrize("model", ["gpt3-175b", "bloom"])
def test_published_frontier_on_the_same_dag(model):
    """The DAG's max-clock iteration is Perseus's fastest frontier time, and EMO's plan at three of
    Perseus's times is on time and uses no more energy than Perseus's frontier says."""
    front = pd.read_csv(DATA / "iteration_time_energy" / "a100_sxm" / f"{model}_bf16_mb12.csv")
    dag = pipeline(read_profile(DATA / "stage_profile" / f"{model}+a100_sxm_bf16.csv"), 8, 12, 83.64, 1e-3)
    assert dag.problem.makespan0_ns * 1e-9 == pytest.approx(front["time"].min(), abs=1e-9)
    for i in (0, len(front) // 2, len(front) - 1):
        target, perseus = float(front["time"].iloc[i]), float(front["energy"].iloc[i])
        t, e = dag.accounting(plan(dag, target))
        assert t <= target + 1e-9
        assert e <= perseus
