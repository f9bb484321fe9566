"""The labelled ablations: each is a config that benchmarks/paper_tables.py can run, and each does
what its name says (the DP alone; a window per pass; the grid; Perseus's walk inside EMO's search)."""

from __future__ import annotations

import numpy as np
from test_optimize_verify import LATS, _tables

from emo.config import OptimizerConfig, typed
from emo.methods import ABLATIONS, METHODS, OFFLINE, ONLINE
from emo.optimize import solve
from emo.optimize.pipeline import planner as run
from emo.workflow.plan import compose


def test_every_ablation_has_its_config_and_is_no_method():
    for name in ABLATIONS:
        assert compose([f"optimizer={name}"])["optimizer"]["name"] == name
        assert name in OFFLINE and name in METHODS and name not in ONLINE
    assert "perseus" in ONLINE and compose(["optimizer=perseus"])["optimizer"]["perseus"]["profile_iters"] == 30
    assert compose(["optimizer=emo-grid"])["optimizer"]["change_points"] == "grid"
    pas = compose(["optimizer=emo-pass"])["optimizer"]
    assert pas["change_points"] == "pass" and pas["min_interval_ms"] == 0


def test_emo_dp_is_the_dp_alone(monkeypatch):
    t = _tables()
    calls = {"fit": 0, "polish": 0}
    fit, pol = run.fit_budget, run.polish_on_predictor
    monkeypatch.setattr(run, "fit_budget", lambda *a, **k: calls.__setitem__("fit", calls["fit"] + 1) or fit(*a, **k))
    monkeypatch.setattr(
        run, "polish_on_predictor", lambda *a, **k: calls.__setitem__("polish", calls["polish"] + 1) or pol(*a, **k)
    )
    opt = {**compose(["optimizer=emo-dp"])["optimizer"], "change_points": "grid", "transition_ms": [LATS[0], LATS[-1]]}
    _, summary = solve(t, typed(OptimizerConfig, opt), 0.05, gpu="a100")
    assert calls == {"fit": 0, "polish": 0}
    rec = summary["emo-dp"]
    assert rec["dp_only"] and "predictor_moves" not in rec and "lead_tries" not in rec
    shipped = solve(t, typed(OptimizerConfig, {**opt, "name": "emo"}), 0.05, gpu="a100")[1]["emo"]
    assert calls["fit"] >= 1 and calls["polish"] >= 1 and "predictor_moves" in shipped


def test_pass_change_points_open_a_window_at_every_pass_start():
    from emo.optimize.pipeline.tables import (
        baseline_timing,
        problem_from_tables,
        window_edges,
    )

    t = _tables()
    p = problem_from_tables(t)
    timing = baseline_timing(p, t)
    groups = [[0]]
    every = window_edges(p, timing, 1.0, groups, align="pass")
    spaced = window_edges(p, timing, 50.0, groups, align="passes")
    assert np.all(np.diff(every[0]) >= 0) and every[0][0] == 0 and every[0][-1] == timing.period_ns
    assert len(np.unique(every[0])) >= len(np.unique(spaced[0]))
