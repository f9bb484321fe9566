"""validate: measured ES/PL against the max clock, prediction errors, online baselines, bad input."""

from __future__ import annotations

import json

import pytest

from emo.policy import FrequencyPolicy
from emo.stages import validate
from emo.validate import pareto_clocks, prediction_errors, savings
from emo.workflow.plan import compose

SMALL = ["workload=tp", "workload.tp=2", "workload.model.layers=1", "tracking.enabled=false"]


def test_savings_and_prediction_errors():
    s = savings(t_ori=1.0, e_ori=100.0, t_opt=1.02, e_opt=80.0)
    assert s["es_pct"] == pytest.approx(20.0) and s["pl_pct"] == pytest.approx(2.0)
    pol = FrequencyPolicy.static(
        "a100",
        1,
        1200,
        predicted_time_s=1.1,
        predicted_energy_j=76.0,
        meta={"baseline_time_s": 1.0, "baseline_energy_j": 100.0},
    )
    err = prediction_errors(pol, t_opt=1.0, e_opt=80.0, t_ori=1.0, e_ori=100.0)
    assert err["time_error_pct"] == pytest.approx(10.0) and err["energy_error_pct"] == pytest.approx(5.0)
    assert err["es_pred_pct"] == pytest.approx(24.0) and err["pl_pred_pct"] == pytest.approx(10.0)
    assert "time_error_pct" not in prediction_errors(FrequencyPolicy.static("a100", 1, 1200), 1, 1, 1, 1)


def test_pareto_clocks_span_the_allowed_range():
    c = pareto_clocks(list(range(210, 1411, 15)), 5, 0.5)
    assert c[0] >= 705 and c[-1] == 1410 and len(c) == 5 and c == sorted(c)


def test_validate_measures_a_policy(tmp_path):
    cfg = compose(SMALL + ["optimizer.name=static", "validate.pareto_points=0"])  # no curve: the policy as given
    policy = FrequencyPolicy.static("a100", 2, 1200, predicted_time_s=0.1, predicted_energy_j=50.0)
    policy.save(tmp_path / "policy.json")
    out = tmp_path / "out"
    out.mkdir()
    m = validate.run(cfg, {"policy": tmp_path / "policy.json"}, out)
    assert m["es_pct"] > 5 and m["pl_pct"] > 5  # 1200 MHz: slower, cheaper
    assert m["t_opt_s"] > m["t_ori_s"] and m["e_opt_j"] < m["e_ori_j"]
    assert "time_error_pct" in m and "energy_error_pct" in m
    result = json.loads((out / "result.json").read_text())
    assert result["baseline"]["iterations"] >= 5 and result["method"] == "static"
    assert not (out / "pareto.parquet").exists()


def test_the_max_clock_saves_nothing_on_a_gpu_that_warms_while_it_is_measured(tmp_path):
    """The virtual GPU's leakage rises with its die temperature over a launch: measured only before
    the policy, the baseline is the coldest run and the max clock itself reads as a loss of ~1 %."""
    cfg = compose(SMALL + ["optimizer.name=static", "validate.pareto_points=0"])
    FrequencyPolicy.static("a100", 2, 1410).save(tmp_path / "policy.json")
    out = tmp_path / "out"
    out.mkdir()
    m = validate.run(cfg, {"policy": tmp_path / "policy.json"}, out)
    assert abs(m["es_pct"]) < 0.5 and abs(m["pl_pct"]) < 0.5
    result = json.loads((out / "result.json").read_text())
    assert result["baseline"]["iterations"] == 2 * result["optimized"]["iterations"]  # before and after


def test_settling_runs_the_max_clock_first_unmeasured_in_the_same_launch():
    """gpu.settle_s: the first launch starts with the default clock for that long, and its result is
    not among the measured runs (one launch on a device that runs segments, as NVML does)."""
    from emo.device import RunResult, run_segments, settle_iterations

    class Launches:
        def __init__(self):
            self.calls = []

        def run_segments(self, workload, runs, *, warmup):
            self.calls.append([(None if p is None else p.steps[0][0].sm_mhz, n) for p, n in runs])
            return [RunResult(n, 0.01 * n, float(i)) for i, (_, n) in enumerate(runs)]

    dev, pol = Launches(), FrequencyPolicy.static("a100", 1, 1200)
    out = run_segments(dev, {}, [(None, 5), (pol, 5)], warmup=1, settle=settle_iterations(20.0, 0.25))
    assert dev.calls == [[(None, 80), (None, 5), (1200, 5)]] and [r.energy_j for r in out] == [1.0, 2.0]
    assert run_segments(dev, {}, [(pol, 5)], settle=settle_iterations(0.0, 0.25))[0].iterations == 5
    assert dev.calls[-1] == [(1200, 5)]


def test_static_is_the_best_measured_clock_within_budget_plus_tolerance(tmp_path):
    """The model's pick (1200 MHz, 10 % late) breaks a 2 % budget: validate measures the curve, the
    clocks at the budget's edge, and reports a fresh run at the least-energy clock that keeps it."""
    import pandas as pd

    from emo.methods import PL_TOLERANCE_PCT

    cfg = compose(SMALL + ["optimizer.name=static", "validate.pareto_points=3", "budget=0.02"])
    FrequencyPolicy.static("a100", 2, 1200).save(tmp_path / "policy.json")
    out = tmp_path / "out"
    out.mkdir()
    m = validate.run(cfg, {"policy": tmp_path / "policy.json"}, out)
    result = json.loads((out / "result.json").read_text())
    curve = pd.read_parquet(out / "pareto.parquet")
    assert len(curve) > 3 and curve["time_s"].is_monotonic_decreasing  # higher clock, shorter iteration
    limit = m["t_ori_s"] * (1 + 0.02 + PL_TOLERANCE_PCT / 100)
    fit = curve[curve["time_s"] <= limit]
    pick = result["setting"]["sm_mhz"]
    assert result["setting"]["static_pick"] == "measured" and pick != 1200
    assert pick == int(fit.loc[fit["energy_j"].idxmin(), "sm_mhz"])
    below = curve[curve["sm_mhz"] < fit["sm_mhz"].min()]  # the edge was measured at every supported clock
    assert below.empty or fit["sm_mhz"].min() - below["sm_mhz"].max() == 15
    assert m["pl_pct"] <= 2 + PL_TOLERANCE_PCT and m["es_pct"] > 0 and m["within_budget"] == 1.0
    assert "time_error_pct" not in m  # the model did not predict the measured pick


def test_best_measured_clock_and_the_budget_edge():
    import pandas as pd

    from emo.validate import best_measured_clock, bracket_clocks

    curve = pd.DataFrame({"sm_mhz": [900, 1200, 1410], "time_s": [1.5, 1.1, 1.0], "energy_j": [60.0, 70.0, 90.0]})
    assert bracket_clocks(list(range(705, 1411, 15)), curve, 1.12, 705) == list(range(915, 1200, 15))
    assert best_measured_clock(curve, 1.12) == 1200 and best_measured_clock(curve, 2.0) == 900
    assert best_measured_clock(curve, 0.9) is None and bracket_clocks([900, 1200, 1410], curve, 0.9, 705) == []


@pytest.mark.parametrize("method", ["geepafs", "zeus"])
def test_validate_runs_online_baselines(tmp_path, method):
    if method == "zeus":
        pytest.importorskip("zeus", reason="the `zeus` package (extra `baselines`) is not installed")
    cfg = compose(
        SMALL
        + [f"optimizer.name={method}", "budget=0.05", "optimizer.zeus.pl_step_w=100", "optimizer.geepafs.periods=1"]
    )
    m = validate.run(cfg, {}, tmp_path)
    # GEEPAFS's utilisation cap (f_cap = f_max x GPU utilisation / 1.05) and its probing at lower
    # clocks may cost more than the budget on TP, where kernels fill ~93 % of the time
    assert m["es_pct"] > 0 and (m["pl_pct"] < 5 + 1.5 if method == "zeus" else 0 < m["pl_pct"] < 15)
    assert m["explore_time_s"] > 0
    assert json.loads((tmp_path / "result.json").read_text())["setting"]


def test_validate_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="validate.iterations"):
        validate.run(compose(SMALL + ["validate.iterations=3"]), {"policy": tmp_path / "p.json"}, tmp_path)
    (tmp_path / "p.json").write_text("{not json")
    with pytest.raises(ValueError, match="p.json"):
        validate.run(compose(SMALL + ["optimizer.name=emo"]), {"policy": tmp_path / "p.json"}, tmp_path)
    with pytest.raises(ValueError, match="policy"):
        validate.run(compose(SMALL + ["optimizer.name=emo"]), {}, tmp_path)
