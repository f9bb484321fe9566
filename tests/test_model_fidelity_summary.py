"""benchmarks/model_fidelity.py's score of the optimizer's own plans: the mean |predicted - measured
ES| and the signed bias over the clock-changing plans only, and its last line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("model_fidelity", REPO / "benchmarks" / "model_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plans(rows):
    cols = ["budget", "changing", "es_pred", "es_meas", "pl_pred", "pl_meas", "pred_t", "meas_t", "pred_e", "meas_e"]
    return pd.DataFrame(rows, columns=cols)


def test_bias_is_over_clock_changing_plans_and_is_the_last_line(fidelity, capsys):
    results = [
        {
            "gpu": "a100",
            "workload": "pp4",
            "optimized": _plans(
                [
                    (0.0, True, 20.0, 18.0, 0.1, 0.2, 1.0, 1.0, 80.0, 82.0),  # +2 points
                    (0.02, True, 22.0, 23.0, 2.0, 2.1, 1.02, 1.02, 78.0, 77.0),
                ]
            ),
        },  # -1 point
        {
            "gpu": "a100",
            "workload": "tp2",
            "optimized": _plans([(0.0, False, 0.0, 0.3, 0.0, 0.0, 1.0, 1.0, 100.0, 99.7)]),
        },  # max clock: not counted
    ]
    out = fidelity.optimized_summary(results)
    assert out["plans"] == 2 and out["mean_abs_des"] == pytest.approx(1.5) and out["bias_des"] == pytest.approx(0.5)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == (
        "optimized plans: mean |dES| 1.50 points, bias +0.50 points over 2 clock-changing plans (1 predicted too large)"
    )
    assert "worst plan: a100 pp4 at 0: dES +2.00 points" in lines


def test_no_plan_scored_prints_nothing(fidelity, capsys):
    assert fidelity.optimized_summary([{"gpu": "a100", "workload": "pp4", "optimized": _plans([])}]) is None
    assert capsys.readouterr().out == ""
