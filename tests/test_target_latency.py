"""Clock-request latency that depends on the target clock: learned from the calibration's (from, to)
pairs, planned with per-step leads, issued by every applier from the same plan, predicted per target.
"""

from __future__ import annotations

import numpy as np
import pytest

from emo.config import OptimizerConfig, typed
from emo.optimize.pipeline.check import Latencies, planning_latencies, target_scale
from emo.optimize.pipeline.schedule import _issued_in_order
from emo.policy import FrequencyPolicy, Issue, Step, issue_plan

PLAN = {"transition_ms": None, "transition_percentiles": [10.0, 90.0]}  # the optimizer section's defaults


def _measured(rng, factor, n=400, clocks=(210, 600, 900, 1100, 1250, 1410)):
    """Steps between random clocks whose latency is a lognormal body times factor(target)."""
    pairs, samples = [], []
    for _ in range(n):
        a, b = rng.choice(clocks, size=2, replace=False)
        pairs.append([int(a), int(b)])
        samples.append(float(4.0 * np.exp(0.4 * rng.standard_normal()) * factor(b)))
    return {"samples": samples, "pairs": pairs}


def test_target_scale_recovers_a_known_dependence():
    """Latency 4 ms x (1 below 1000 MHz, rising to 4 at 1410): the factors read back within 15 %,
    and divided out the samples no longer depend on the target."""
    truth = lambda f: 1.0 + 3.0 * max(0.0, f - 1000.0) / 410.0  # noqa: E731
    m = _measured(np.random.default_rng(0), truth, n=1200)
    x, pairs = np.asarray(m["samples"]), np.asarray(m["pairs"])
    scale, z = target_scale(x, pairs[:, 1], pairs[:, 1] > pairs[:, 0])
    f, k = np.asarray(scale).T
    ratio = k / np.array([truth(v) for v in f])
    assert ratio.max() / ratio.min() == pytest.approx(1.0, abs=0.15)
    top, low = z[pairs[:, 1] == 1410], z[pairs[:, 1] == 210]
    assert np.median(top) == pytest.approx(np.median(low), rel=0.15)


def test_no_dependence_no_scale_and_pairs_missing_no_scale():
    m = _measured(np.random.default_rng(1), lambda f: 1.0)
    lats, _ = planning_latencies(typed(OptimizerConfig, PLAN), m)
    assert np.ptp(lats.factor(np.array([210.0, 1410.0]))) < 0.2
    flat, source = planning_latencies(typed(OptimizerConfig, PLAN), {"samples": m["samples"]})
    assert flat.scale == () and "target" not in source


def test_planned_leads_follow_the_target():
    """A raise to the top clock is issued about four times as early as one to a low clock."""
    m = _measured(np.random.default_rng(2), lambda f: 1.0 + 3.0 * max(0.0, f - 1000.0) / 410.0)
    lats, source = planning_latencies(typed(OptimizerConfig, PLAN), m)
    assert "target clock" in source
    assert lats.lead(1410, up=True) / lats.lead(600, up=True) == pytest.approx(4.0, rel=0.25)
    up, down = lats.at(lats.nodes[0], np.array([600.0, 1410.0]))
    assert up[1] / up[0] == pytest.approx(4.0, rel=0.25) and down[1] > down[0]


def test_a_step_carries_its_own_lead_through_the_file_and_the_plan():
    steps = [Step(0.0, 900), Step(40.0, 1410, lead_ms=25.0), Step(80.0, 700, lead_ms=3.0)]
    pol = FrequencyPolicy("a100", {0: steps}, period_ms=100.0, lead_ms=10.0)
    back = FrequencyPolicy.from_dict(pol.to_dict())
    assert back.steps == pol.steps and "lead_ms" not in pol.to_dict()["steps"]["0"][0]
    assert issue_plan(steps, lead_ms=10.0, period_ms=100.0) == [
        Issue(0.015, 1410),
        Issue(0.077, 700),
        Issue(0.090, 900),  # t = 0 wraps: issued 10 ms before the next iteration
    ]
    with pytest.raises(ValueError, match="steps.0.lead_ms"):
        FrequencyPolicy.from_dict({**pol.to_dict(), "steps": {"0": [{"t_ms": 0, "sm_mhz": 900, "lead_ms": -1}]}})


def test_a_raise_issued_before_the_window_ahead_of_it_has_its_clock_merges():
    """A lowering at 30 ms, then a raise at 42 ms with a 20 ms lead: the raise would be requested
    before the lowering can land, and the last request wins, so the short slow window is dropped
    (it keeps the faster clock); with a short lead both steps stay, each with its own lead."""
    slow = Latencies(2.0, 10.0, 20.0, (10.0,), (1.0,), 4.0, None, None, 2.0, 6.0, ((700.0, 1.0), (1410.0, 1.0)))
    steps = _issued_in_order([Step(0.0, 1410), Step(30.0, 700), Step(42.0, 1410)], slow, 100.0)
    assert [s.sm_mhz for s in steps] == [1410]
    fast = Latencies(2.0, 3.0, 5.0, (3.0,), (1.0,), 4.0, None, None, 2.0, 6.0, ((700.0, 1.0), (1410.0, 1.0)))
    steps = _issued_in_order([Step(0.0, 1410), Step(30.0, 700), Step(60.0, 1410)], fast, 100.0)
    assert [(s.sm_mhz, s.lead_ms) for s in steps] == [(1410, None), (700, 6.0), (1410, None)]
