"""The comparison's one scoring rule (emo.report.scoring): spread, within budget, ahead, the static curve."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from emo.report import scoring


def curve(points):
    return pd.DataFrame(points, columns=["sm_mhz", "pl_pct", "es_pct"])


STATIC = curve([(1380, 2.0, 6.0), (1350, 4.0, 10.0), (1320, 6.0, 11.0), (1365, 3.5, 7.0)])


def test_score_is_mean_and_sample_standard_deviation():
    s = scoring.score([10.0, 12.0, 14.0], [1.0, 1.0, 1.0])
    assert (s.es, s.es_sd, s.pl, s.pl_sd, s.n) == (12.0, 2.0, 1.0, 0.0, 3)
    assert scoring.score([5.0], [0.5]).es_sd == 0.0
    with pytest.raises(ValueError, match="as many ES as PL"):
        scoring.score([1.0], [])


def test_frontier_is_the_monotone_fit_through_the_max_clock():
    pl, es = scoring.frontier(STATIC)
    assert list(pl) == [0.0, 2.0, 3.5, 4.0, 6.0]  # points already rising with PL are the curve
    assert list(es) == [0.0, 6.0, 7.0, 10.0, 11.0]
    # slower than 1350 MHz and saving less: both are noisy measurements of one rising curve, so the fit
    # pools them (their mean at both) where an upper envelope would keep the point noise lifted
    worse = pd.concat([STATIC, curve([(1395, 5.0, 9.0)])])
    pl, es = scoring.frontier(worse)
    assert list(pl) == [0.0, 2.0, 3.5, 4.0, 5.0, 6.0]
    assert list(es) == pytest.approx([0.0, 6.0, 7.0, 9.5, 9.5, 11.0])
    # equal PLs are one knot, weighted by how many points it pools
    twice = pd.concat([STATIC, curve([(1380, 2.0, 5.0), (1395, 1.0, 7.0)])])
    pl, es = scoring.frontier(twice)
    assert list(pl) == [0.0, 1.0, 2.0, 3.5, 4.0, 6.0]
    assert list(es) == pytest.approx([0.0, (7.0 + 2 * 5.5) / 3, (7.0 + 2 * 5.5) / 3, 7.0, 10.0, 11.0])


def test_a_static_clock_re_measured_scores_about_zero_against_the_fit():
    """The bar's point: a fresh measurement of one of a noisy sweep's own clocks scores 0 in
    expectation against the fit. Against the sweep's upper envelope it scores well below 0 (this
    test fails with one): the running maximum keeps the points noise lifted."""
    rng = np.random.default_rng(0)
    true_pl = np.linspace(0.0, 6.0, 81)  # clocks as dense as 15 MHz steps, noise as large as a step
    true_es = 12.0 * (1.0 - np.exp(-true_pl / 3.0))
    d = []
    for _ in range(300):
        sweep = curve([(0, x + rng.normal(0, 0.05), y + rng.normal(0, 0.3)) for x, y in zip(true_pl, true_es)])
        k = rng.integers(len(true_pl))
        pl, es = true_pl[k] + rng.normal(0, 0.05), true_es[k] + rng.normal(0, 0.3)
        d.append(es - scoring.static_es_at(sweep, pl))
    assert abs(np.mean(d)) < 0.1


def test_static_es_at_interpolates_and_is_flat_past_the_ends():
    assert scoring.static_es_at(STATIC, 1.0) == pytest.approx(3.0)
    assert scoring.static_es_at(STATIC, 3.0) == pytest.approx(6.0 + 1.0 / 1.5)
    assert scoring.static_es_at(STATIC, 9.0) == pytest.approx(11.0)
    assert scoring.static_es_at(STATIC, -0.3) == 0.0


def test_best_static_uses_the_budget_plus_tolerance_rule():
    assert scoring.best_static(STATIC, 2.0) == (6.0, 2.0, 1380)
    assert scoring.best_static(STATIC, 3.5) == (10.0, 4.0, 1350)  # 4.0 <= 3.5 + 0.5
    assert scoring.best_static(STATIC, 0.0) == (0.0, 0.0, -1)  # nothing within: the max clock


def test_margin_over_the_curve_is_per_seed_at_the_methods_own_pl():
    m = scoring.margins([(9.0, 2.0), (8.0, 3.0)], [STATIC, STATIC])
    assert m.es == pytest.approx(((9 - 6) + (8 - scoring.static_es_at(STATIC, 3.0))) / 2)
    assert m.pl == pytest.approx(2.5)
    assert scoring.above(m) is (m.es > m.es_sd)
    on = scoring.margins([(6.0, 2.0), (6.1, 2.0), (5.9, 2.0)], [STATIC] * 3)
    assert not scoring.above(on) and not scoring.below(on)
    under = scoring.margins([(3.0, 2.0), (3.2, 2.0), (2.8, 2.0)], [STATIC] * 3)
    assert scoring.below(under)


def test_ahead_needs_more_than_the_combined_spread_and_ignores_methods_over_budget():
    emo = scoring.score([10.0, 11.0, 12.0], [1.0, 1.2, 1.1])  # sd 1
    close = scoring.score([8.5, 8.5, 8.5], [1.0, 1.0, 1.0])  # 1.5 behind, sd 0: within 1 + 0 ? no, 1.5 > 1
    near = scoring.score([9.0, 10.0, 11.0], [1.0, 1.0, 1.0])  # 1 behind with sd 1: not beyond 2
    over = scoring.score([30.0, 30.0, 30.0], [9.0, 9.0, 9.0])  # far ahead but over budget: does not count
    assert scoring.ahead({"emo": emo, "a": close, "x": over}, 2.0) == (True, "")
    ok, why = scoring.ahead({"emo": emo, "a": close, "b": near}, 2.0)
    assert not ok and why == "not beyond the spread of b"
    slow = scoring.score([20.0], [3.0])
    assert scoring.ahead({"emo": slow, "a": close}, 2.0) == (False, "emo PL 3.00 % over budget")
    assert scoring.ahead({"a": close}, 2.0)[0] is False


def test_relative_curve_is_against_the_baseline_it_was_measured_with():
    raw = pd.DataFrame({"sm_mhz": [1410, 1200], "time_s": [0.2, 0.22], "energy_j": [100.0, 80.0]})
    rel = scoring.relative_curve(raw, 0.2, 100.0)
    assert list(rel["pl_pct"]) == pytest.approx([0.0, 10.0])
    assert list(rel["es_pct"]) == pytest.approx([0.0, 20.0])
