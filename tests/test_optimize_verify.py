"""The optimiser's final check with the stage's predictor: a pick that meets the deadline in the DP's
model (nodes timed at the clock of their baseline window) but not on the wall clock (a slowed pack
pushes its successor into a slower window) is repaired until the predictor agrees."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from emo.config import OptimizerConfig
from emo.config import typed as typed_config
from emo.graph.graph import EDGE_COLUMNS, NODE_COLUMNS, Graph, typed
from emo.model.predict import pack_tables, predict
from emo.optimize import solve
from emo.optimize.pipeline import planner as run
from emo.optimize.pipeline.check import expected, fit_to_prediction
from emo.optimize.pipeline.schedule import build_policy
from emo.optimize.pipeline.search import polish_on_predictor
from emo.optimize.pipeline.tables import (
    baseline_timing,
    iteration_items,
    planned_window_clear,
    planned_window_starts,
    problem_from_tables,
)
from emo.optimize.solution import Solution
from emo.policy import policy_device_ids
from emo.workflow.plan import compose

MS = 1_000_000
CLOCKS = [705, 1005, 1410]


def one_signature_model() -> pd.DataFrame:
    """One kernel signature's time and energy at CLOCKS: 2x slower at half the clock, more energy fast."""
    return pd.DataFrame(
        {
            "signature": "s",
            "sm_mhz": CLOCKS,
            "time_s": [2.0, 1.41, 1.0],
            "dynamic_energy_j": [0.5, 0.8, 1.5],
            "idle_power_w": [40.0, 50.0, 60.0],
            "default_mhz": 1410,
        }
    )


def _tables():
    """One GPU: pack A (15 ms) then pack X (20 ms) on one stream, beside a 55 ms collective; the host
    syncs on both. At 1005 MHz A ends at 21 ms, so X starts in the second 20 ms window."""
    nodes = pd.DataFrame(
        [
            ("kernel", 0, 0, 7, -1, 0, 15 * MS, "A", 0),
            ("kernel", 0, 0, 7, -1, 15 * MS, 20 * MS, "X", 1),
            ("collective", 0, 0, 8, -1, 0, 55 * MS, "L", 2),
            ("sync", 0, -1, -1, 1, 55 * MS, 10_000, "sync", 3),
        ],
        columns=list(NODE_COLUMNS),
    )
    edges = pd.DataFrame(
        [(0, 1, "stream", False), (1, 3, "sync", False), (2, 3, "sync", False)], columns=list(EDGE_COLUMNS)
    )
    graph = Graph(typed(nodes, NODE_COLUMNS), typed(edges, EDGE_COLUMNS))
    packs = pd.DataFrame({"node": [0, 1], "signature": ["s", "s"], "dur_ns": [15 * MS, 20 * MS]})
    model = one_signature_model()
    return pack_tables(graph, packs, model)


LATS = (5.0, 10.0, 15.0)  # the configured 5-15 ms range: min, mean, max


def _build(tables, p, timing):
    def build(s):
        return build_policy(
            s,
            "a100",
            window_ms=20.0,
            transition_ms=(LATS[0], LATS[-1]),
            device_ids=policy_device_ids(tables.device_keys),
            period_ms=timing.period_ns * 1e-6 * s.makespan_ns / p.makespan0_ns,
        )

    return build


def _setup():
    """The toy tables, their problem, timing, 20 ms grid items, policy builder and max-clock prediction."""
    t = _tables()
    p = problem_from_tables(t, 0.5)
    timing = baseline_timing(p, t)
    return t, p, timing, iteration_items(p, timing, 20.0, align="grid"), _build(t, p, timing), predict(t, None)


def test_a_pick_late_on_the_wall_clock_is_repaired():
    t = _tables()
    p = problem_from_tables(t, 0.5)
    timing = baseline_timing(p, t)
    items = iteration_items(p, timing, 20.0)
    assert items.k == 3  # windows 0-20, 20-40, 40-55 ms
    sol = Solution(p, items, np.array([1, 0, 0]), "emo", 0.0)  # A and X at 1005, the empty windows at 705
    assert sol.feasible  # the DP's model: X runs at 1005, the 55 ms collective still ends last
    build = _build(t, p, timing)
    base = predict(t, None)
    assert (
        predict(t, build(sol), transition_ms=10.0).makespan_ns > base.makespan_ns * 1.01
    )  # X lands in window 1 at 705
    fixed, policy, info = fit_to_prediction(
        t, sol, build, budget=0.0, interval_ms=20.0, period_ns=timing.period_ns, transitions_ms=LATS
    )
    assert info["predictor_slowdown_before"] > 0.01 and info["predictor_drift_raises"] >= 1
    for x in (5.0, 10.0, 15.0):  # wherever in 5-15 ms the clock requests land
        assert predict(t, policy, transition_ms=x).makespan_ns <= base.makespan_ns + 1_000
    assert fixed.choice[1] >= 1  # X's wall-clock window raised to the clock the DP timed X at
    assert predict(t, policy, transition_ms=10.0).energy_j < base.energy_j  # still saves


def test_solve_at_budget_zero_keeps_the_predicted_time():
    t = _tables()
    opt = {
        **compose([])["optimizer"],
        "change_points": "grid",
        "transition_ms": [LATS[0], LATS[-1]],
    }  # as the test assumes
    policy, summary = solve(t, typed_config(OptimizerConfig, opt), 0.0, gpu="a100")
    base = predict(t, None)
    assert predict(t, policy, transition_ms=10.0).makespan_ns <= base.makespan_ns * (1 + 1e-5) + 1_000
    assert predict(t, policy, transition_ms=10.0).energy_j < base.energy_j
    assert summary["emo"]["predictor_slowdown"] <= 1e-5 and policy.budget == 0.0


def test_windows_follow_the_plan_on_the_wall_clock():
    """A at 1005 MHz ends 6.3 ms late, so everything after it (and the second window's step) moves
    by that much on the planned timeline; at max clocks the windows stay on the 20 ms grid."""
    t = _tables()
    p = problem_from_tables(t, 0.5)
    timing = baseline_timing(p, t)
    items = iteration_items(p, timing, 20.0)
    fast = planned_window_starts(Solution(p, items, np.full(items.k, p.ref), "emo", 0.0), t, timing, items.edges_ns)
    np.testing.assert_allclose(fast, [[0.0, 20 * MS, 40 * MS]])
    slow = Solution(p, items, np.array([1, 2, 2]), "emo", 0.2)
    shift = slow.start_ns[p.perm.tolist().index(1)] - 15 * MS  # X's start, planned - baseline
    assert shift > 6 * MS
    np.testing.assert_allclose(
        planned_window_starts(slow, t, timing, items.edges_ns)[0, 1:], [20 * MS + shift, 40 * MS + shift]
    )


class _Pred:
    def __init__(self, makespan_ns: float, energy_j: float = 0.0):
        self.makespan_ns, self.energy_j = makespan_ns, energy_j


class _Pick:
    """A DP pick made at budget b (the stub's policy is b itself)."""

    def __init__(self, b: float):
        self.b, self.choice, self.info = b, np.array([round(b * 1e9)]), {}


def _stub_predictor(monkeypatch, late: float):
    """A 1 s iteration; a pick at budget b takes late × b longer in expectation over the clock-request
    latencies (which the DP does not charge), and saves b of the energy."""
    monkeypatch.setattr(run, "predict", lambda t, pol=None, **k: _Pred(1e9, 100.0))
    monkeypatch.setattr(run, "expected", lambda t, pol, lats: _Pred(1e9 * (1 + late * pol), 100.0 * (1 - pol)))


def test_fit_budget_asks_the_dp_again_at_the_largest_budget_that_fits(monkeypatch):
    _stub_predictor(monkeypatch, late=1.2)  # every pick ends 20 % later than the DP planned
    sol, policy, info = run.fit_budget(
        None,
        _Pick,
        lambda s: s.b,
        lambda s: pytest.fail("no repair when a smaller budget fits"),
        0.05,
        transitions_ms=LATS,
    )
    assert len(info["budget_tries"]) >= 2 and info["budget_tries"][0] == [0.05, 0.06]
    assert 0.9 * 0.05 / 1.2 <= info["dp_budget"] <= 0.05 / 1.2  # within 10 % of the largest that fits
    assert info["predictor_slowdown"] <= 0.05 and policy == pytest.approx(info["dp_budget"])


def test_fit_budget_repairs_the_smallest_try_when_none_fits(monkeypatch):
    _stub_predictor(monkeypatch, late=1.0)
    monkeypatch.setattr(run, "expected", lambda t, pol, lats: _Pred(1e9 * 1.1, 100.0))  # always late
    repaired = []
    sol, policy, info = run.fit_budget(
        None,
        _Pick,
        lambda s: s.b,
        lambda s: (repaired.append(s.b), (s, "repaired", {"predictor_rounds": 1}))[1],
        0.05,
        transitions_ms=LATS,
    )
    tried = [b for b, _ in info["budget_tries"]]
    assert tried == sorted(tried, reverse=True) and tried[-1] == 0.0 and len(tried) <= 6
    assert repaired == [0.0] and policy == "repaired" and info["predictor_rounds"] == 1


def test_predictor_polish_only_keeps_moves_that_save_within_the_budget():
    t, p, timing, items, build, base = _setup()
    start = Solution(p, items, np.full(items.k, p.ref), "emo", 0.0)  # max clocks everywhere
    sol, policy, moves = polish_on_predictor(t, start, build, budget=0.0, evaluations=400, transitions_ms=LATS)
    assert moves >= 1  # the empty windows and the collective's slack can run slower
    assert predict(t, policy, transition_ms=10.0).energy_j < predict(t, build(start), transition_ms=10.0).energy_j
    assert expected(t, policy, LATS).makespan_ns <= base.makespan_ns + 1_000
    again, _, more = polish_on_predictor(t, sol, build, budget=0.0, evaluations=400, transitions_ms=LATS)
    assert more == 0 and np.array_equal(again.choice, sol.choice)  # a local optimum stays put


def test_a_down_step_waits_for_the_previous_windows_packs():
    """Window 0 holds A (0-15 ms) and X (15-35 ms, it starts before the 20 ms edge); a slower window 1
    must not land on X's tail: its step goes after X's planned finish (plus the latency spread)."""
    t, p, timing, items, _, _ = _setup()
    sol = Solution(p, items, np.array([2, 0, 0]), "emo", 0.0)  # window 0 at max, the rest at 705
    clear = planned_window_clear(sol, t, timing)
    assert clear[0, 1] == pytest.approx(35 * MS)  # X's finish
    policy = build_policy(
        sol,
        "a100",
        window_ms=20.0,
        transition_ms=(5.0, 15.0),
        period_ms=55.0,
        window_start_ms=planned_window_starts(sol, t, timing, items.edges_ns) * 1e-6,
        window_clear_ms=clear * 1e-6,
    )
    down = [s for s in policy.steps[0] if s.sm_mhz == 705]
    assert down and down[0].t_ms >= 35.0 + 10.0 - 1e-9
    for x in (5.0, 10.0, 15.0):  # X runs at max clock wherever the request lands
        assert predict(t, policy, transition_ms=x).makespan_ns <= predict(t, None).makespan_ns + 1_000


def test_perseus_emo_search_ablation_gets_the_budget_search_and_polish_of_emo_with_the_same_counts(monkeypatch):
    """Equal search effort: both methods go through the one budget search (fit_budget, at most
    optimizer.budget_solves solves) and the one predictor polish (optimizer.predictor_evaluations)."""
    pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    t = _tables()
    seen: dict[str, dict] = {}
    fit, pol = run.fit_budget, run.polish_on_predictor

    def spy_fit(*a, solves, **k):
        seen.setdefault(method, {})["solves"] = solves
        return fit(*a, solves=solves, **k)

    def spy_polish(*a, evaluations, **k):
        seen.setdefault(method, {})["evaluations"] = evaluations
        return pol(*a, evaluations=evaluations, **k)

    monkeypatch.setattr(run, "fit_budget", spy_fit)
    monkeypatch.setattr(run, "polish_on_predictor", spy_polish)
    opt = {
        **compose([])["optimizer"],
        "change_points": "grid",
        "budget_solves": 3,
        "predictor_evaluations": 50,
        "transition_ms": [LATS[0], LATS[-1]],
    }  # a latency as calibrate would have measured it
    out = {}
    for method in ("emo", "perseus+emo-search"):
        out[method] = solve(t, typed_config(OptimizerConfig, {**opt, "name": method}), 0.05, gpu="a100")
    assert seen["emo"] == seen["perseus+emo-search"] == {"solves": 3, "evaluations": 50}
    rec = out["perseus+emo-search"][1]["perseus+emo-search"]
    assert 1 <= len(rec["budget_tries"]) <= 3 and "predictor_moves" in rec
    assert rec["polished_energy_j"] <= rec["search_energy_j"] + 1e-9  # the polish keeps only savings
    base = predict(t, None)
    assert (
        expected(t, out["perseus+emo-search"][0], LATS).makespan_ns
        <= base.makespan_ns * (1 + rec["planning_budget"]) + 1_000
    )


def test_a_late_raise_lengthens_the_slow_stretch_and_a_superseded_request_is_dropped():
    """(up, down) latencies: a request to a faster clock lands `up` after it is issued, one to a slower
    clock `down` after; the last one issued wins, so a raise still pending when a later lowering
    lands never takes effect."""
    from emo.model.predict import clock_timelines
    from emo.policy import FrequencyPolicy, Step

    t = _tables()
    policy = FrequencyPolicy(gpu="a100", steps={0: [Step(0.0, 705), Step(20.0, 1410), Step(40.0, 705)]}, period_ms=60.0)
    marks = np.array([[0.0]])

    def landed(lats):
        ptr, ts, ci = clock_timelines(t, policy, marks, lats)
        return [(round(x / MS, 3), int(t.clocks_mhz[c])) for x, c in zip(ts[1:], ci[1:]) if x >= 0]

    assert landed(5.0) == [(5.0, 705), (25.0, 1410), (45.0, 705)]  # one latency: every request in order
    assert landed((12.0, 5.0)) == [
        (5.0, 705),
        (32.0, 1410),
        (45.0, 705),
    ]  # the raise 7 ms later, the slow stretch longer
    assert landed((30.0, 5.0)) == [
        (5.0, 705),
        (45.0, 705),
    ]  # the raise would land at 50: the lowering at 45 supersedes it


def test_the_plan_pays_for_the_measured_stalls():
    """A few requests in the calibration stall for tens of ms: the quadrature keeps them (its top
    node is their mean), lowerings take the body's mean, and a policy that raises the clock before
    critical work is predicted slower in that expectation than at the body's latency alone."""
    from emo.optimize.pipeline.check import planning_latencies

    body = list(np.linspace(5.0, 15.0, 95))
    stalls = [60.0, 70.0, 80.0, 90.0, 100.0]
    opt = {"transition_ms": None, "transition_percentiles": [10.0, 90.0], "change_interval_ms": 20.0}
    lats, source = planning_latencies(typed_config(OptimizerConfig, opt), {"samples": body + stalls})
    assert lats.weights[-1] == pytest.approx(0.02) and lats.nodes[-1] == pytest.approx(95.0)  # the two longest
    assert sum(lats.weights) == pytest.approx(1.0) and lats.down == pytest.approx(np.mean(body[:-5]), abs=0.6)
    assert "expectation over 6 strata" in source
    t, p, timing, items, build, base = _setup()
    sol = Solution(p, items, np.array([0, 2, 2]), "emo", 0.05)  # A slow in window 0, X at max after the raise
    policy = build(sol)
    body_only = expected(t, policy, planning_latencies(typed_config(OptimizerConfig, opt), {"samples": body})[0])
    with_stalls = expected(t, policy, lats)
    assert with_stalls.makespan_ns > body_only.makespan_ns + 0.5 * MS


def test_a_late_raise_into_a_fast_window_is_merged_into_the_window_before(monkeypatch):
    """The critical path (X, in window 1 at max clock) is late though nothing it runs under is slow:
    the raise into window 1 stalled. The repair gives window 0 window 1's clock (no raise to wait
    for); it used to give up there (nothing slow to raise) and fall back to max clocks everywhere."""
    import dataclasses

    from emo.optimize.pipeline import check

    t, p, timing, items, build, base = _setup()
    sol = Solution(p, items, np.array([0, 2, 2]), "emo", 0.0)  # A's window slow, X's and the last at max

    def stalled(tables, policy, lats):  # late while any window is slower than X's clock
        real = predict(tables, policy, transition_ms=10.0)
        late = any(s.sm_mhz < 1410 for s in policy.steps[0])
        return dataclasses.replace(real, makespan_ns=base.makespan_ns * (1.05 if late else 1.0))

    monkeypatch.setattr(check, "expected", stalled)
    monkeypatch.setattr(check, "critical_path", lambda *a: np.array([int(np.flatnonzero(t.compiled.order == 1)[0])]))
    fixed, policy, info = fit_to_prediction(
        t, sol, build, budget=0.0, interval_ms=20.0, period_ns=timing.period_ns, transitions_ms=LATS
    )
    assert info.get("predictor_merge_raises") == 1 and "predictor_fallback" not in info
    assert list(fixed.choice) == [2, 2, 2] and info["predictor_step_raises"] == 0  # by the merge, not a step raise


def test_when_the_raises_run_out_the_plan_is_shrunk_toward_the_max_clock(monkeypatch):
    """A pick the repair cannot fix window by window is not thrown away for the max clock: every
    window moves the same share of the way to the max clock, the largest share on time (bisection),
    so a window the plan slowed stays slowed as far as the budget allows."""
    import dataclasses

    from emo.optimize.pipeline import check

    t, p, timing, items, build, base = _setup()
    sol = Solution(p, items, np.array([0, 0, 2]), "emo", 0.0)  # windows 0 and 1 at 705 MHz

    def late_below(tables, policy, lats):  # on time only while every clock is at least 1005 MHz
        real = predict(tables, policy, transition_ms=10.0)
        late = any(s.sm_mhz < 1005 for st in policy.steps.values() for s in st)
        return dataclasses.replace(real, makespan_ns=base.makespan_ns * (1.05 if late else 1.0))

    monkeypatch.setattr(check, "expected", late_below)
    fixed, policy, info = fit_to_prediction(
        t, sol, build, budget=0.0, interval_ms=20.0, period_ns=timing.period_ns, transitions_ms=LATS, max_rounds=0
    )
    # clocks round up to a candidate, so every share short of the whole way gives 1005 MHz
    assert list(fixed.choice) == [1, 1, 2] and info["predictor_shrink"] > 0.99
    assert info["predictor_slowdown"] == pytest.approx(0.0)


STALLED = {"samples": list(np.linspace(5.0, 15.0, 90)) + [40.0, 45.0, 50.0, 55.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0]}


def test_lead_options_change_only_how_early_raises_are_issued():
    """The leads a plan may take: the planned range's max (p90), then p95 and p98 of the measured
    raises; the quadrature the plan is judged by, lo and the lowerings' latency stay as they are.
    An override measures nothing, and a latency without a tail has no longer lead to try."""
    from emo.optimize.pipeline.check import lead_options, planning_latencies

    opt = {"transition_ms": None, "transition_percentiles": [10.0, 90.0]}
    lats, _ = planning_latencies(typed_config(OptimizerConfig, opt), STALLED)
    leads = lead_options(typed_config(OptimizerConfig, opt), STALLED, lats)
    assert [x.hi for x in leads] == pytest.approx([np.percentile(STALLED["samples"], q) for q in (90, 95, 98)])
    assert leads[0] is lats and leads[1].hi < leads[2].hi
    assert all((x.lo, x.nodes, x.weights, x.down) == (lats.lo, lats.nodes, lats.weights, lats.down) for x in leads)
    assert lead_options(typed_config(OptimizerConfig, {**opt, "transition_ms": [5.0, 15.0]}), STALLED, lats) == [lats]
    flat = {"samples": [10.0] * 50}
    one, _ = planning_latencies(typed_config(OptimizerConfig, opt), flat)
    assert lead_options(typed_config(OptimizerConfig, opt), flat, one) == [one]


@pytest.mark.parametrize("method", ["emo", "perseus+emo-search"])
def test_each_method_keeps_its_least_energy_lead_from_the_same_solves(monkeypatch, method):
    """Every offline method plans at each lead with the solves of its first (no solver call more than
    at p90 alone), judges each after a screen share of the polish, keeps the lead check.kept_lead
    picks and polishes only that one on with the rest of predictor_evaluations."""
    if method == "perseus+emo-search":
        pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")
    from emo.optimize.pipeline import check

    t = _tables()
    opt = {**compose([])["optimizer"], "change_points": "grid", "name": method}
    solver = "optimize" if method == "emo" else "optimize_perseus"
    real, calls = getattr(run, solver), []
    monkeypatch.setattr(run, solver, lambda p, b, **k: calls.append(b) or real(p, b, **k))
    real_polish, evaluations = run.polish_on_predictor, []
    monkeypatch.setattr(
        run, "polish_on_predictor", lambda *a, **k: evaluations.append(k["evaluations"]) or real_polish(*a, **k)
    )
    results = {}
    for leads in ((), check.LEAD_PERCENTILES):
        monkeypatch.setattr(check, "LEAD_PERCENTILES", leads)
        calls.clear(), evaluations.clear()
        policy, summary = solve(t, typed_config(OptimizerConfig, opt), 0.05, gpu="a100", clock_latency=STALLED)
        results[leads] = (policy, summary[method], list(calls), list(evaluations))
    (_, alone, calls90, evals90), (policy, rec, calls_all, evals_all) = results.values()
    total = opt["predictor_evaluations"]
    screen = int(total * check.LEAD_SCREEN_SHARE)
    assert calls_all == calls90 and len(alone["lead_tries"]) == 1 and len(rec["lead_tries"]) == 3
    assert evals90 == [total] and evals_all == [screen] * 3 + [total - screen]  # 1.5 polishes, not three
    kept = rec["lead_tries"][check.kept_lead([(e, ok) for _, e, ok in rec["lead_tries"]])]
    assert kept[2] and rec["polished_energy_j"] <= kept[1] + 1e-6  # the rest of the polish goes on from it
    assert policy.lead_ms == pytest.approx(rec["transition_ms"][2]) == pytest.approx(kept[0], abs=1e-4)


def test_the_kept_lead_is_the_one_the_policy_issues_and_the_one_polished_on(monkeypatch):
    """Whichever lead check.kept_lead picks (here forced to the longest) is the one the policy is built
    with, the summary reports, and the rest of the polish goes on from."""
    from emo.optimize.pipeline import check

    t = _tables()
    opt = {**compose([])["optimizer"], "change_points": "grid", "name": "emo"}
    monkeypatch.setattr(run, "kept_lead", lambda tries: len(tries) - 1)
    real_polish, starts = run.polish_on_predictor, []
    monkeypatch.setattr(
        run,
        "polish_on_predictor",
        lambda tables, sol, build, **k: (
            starts.append((build(sol).lead_ms, k["evaluations"])) or real_polish(tables, sol, build, **k)
        ),
    )
    policy, summary = solve(t, typed_config(OptimizerConfig, opt), 0.05, gpu="a100", clock_latency=STALLED)
    rec = summary["emo"]
    longest = rec["lead_tries"][-1]
    assert len(rec["lead_tries"]) == 3 and policy.lead_ms == pytest.approx(longest[0], abs=1e-4)
    assert (
        rec["transition_ms"][2] == pytest.approx(longest[0], abs=1e-4) and "a longer lead" in rec["transition_source"]
    )
    total = opt["predictor_evaluations"]
    screen = int(total * check.LEAD_SCREEN_SHARE)
    assert starts[-1] == (pytest.approx(longest[0], abs=1e-4), total - screen)  # polished on at the kept lead
    assert rec["polished_energy_j"] <= longest[1] + 1e-6


def test_a_longer_lead_is_kept_only_for_a_clear_gain():
    """The p90 plan stays unless a longer lead saves LEAD_MIN_GAIN of its predicted energy on time;
    a late p90 plan gives way to any plan on time, and with none on time the least energy wins."""
    from emo.optimize.pipeline.check import LEAD_MIN_GAIN, kept_lead

    e0 = 100.0
    assert kept_lead([(e0, True), (e0 * (1 - LEAD_MIN_GAIN / 2), True)]) == 0  # within the predictor's error
    assert kept_lead([(e0, True), (99.5, True), (e0 * (1 - 2 * LEAD_MIN_GAIN), True)]) == 2
    assert kept_lead([(e0, True), (50.0, False)]) == 0  # late: never kept over a plan on time
    assert kept_lead([(e0, False), (e0 + 5, True), (e0 + 1, True)]) == 2
    assert kept_lead([(e0, False), (e0 - 5, False)]) == 1
    assert kept_lead([(e0, True)]) == 0
    assert kept_lead([(e0, True), (99.0, True)], min_gain=0.0) == 1


def test_below_curve_is_the_saving_against_one_clock_at_equal_time():
    """A plan's share of energy under the single-clock curve's front, interpolated at its own
    predicted time (in any order of clocks), held at the front's ends beyond them. Clocks that slack
    hides tie in time; the front keeps the one that spends least."""
    from emo.optimize.pipeline.check import below_curve

    curve = [(110.0, 8.0), (100.0, 10.0), (130.0, 7.0)]
    assert below_curve(105.0, 8.5, curve) == pytest.approx(1 - 8.5 / 9.0)
    assert below_curve(120.0, 7.5, curve) == pytest.approx(0.0)  # on the chord: a slower clock's saving
    assert below_curve(90.0, 11.0, curve) == pytest.approx(1 - 11.0 / 10.0)  # above it: negative
    assert below_curve(140.0, 6.3, curve) == pytest.approx(0.1)
    hidden = [(100.0, 10.0), (100.0, 9.0), (100.0, 8.0), (104.0, 8.5), (120.0, 7.0)]
    assert below_curve(100.0, 8.0, hidden) == pytest.approx(0.0)  # the least of the tied clocks
    assert below_curve(110.0, 7.5, hidden) == pytest.approx(1 - 7.5 / 7.5)  # (104, 8.5) is off the front


def test_emo_keeps_one_clock_unless_its_plan_clears_the_single_clock_curve(monkeypatch):
    """Asked for no gain, EMO keeps its plan; asked for one it cannot clear, it gives the single
    clock the predictor puts least energy on time. The fixture's slack is all at the lowest clock, so
    that plan is itself one clock: the rule gives the same policy."""
    t = _tables()
    opt = {**compose([])["optimizer"], "change_points": "grid", "name": "emo"}
    monkeypatch.setattr(run, "CURVE_MIN_GAIN", -np.inf)
    plan, summary = solve(t, typed_config(OptimizerConfig, opt), 0.05, gpu="a100", clock_latency=STALLED)
    gain = summary["emo"]["curve_gain"]
    assert "single_clock_mhz" not in summary["emo"] and gain == pytest.approx(0.0, abs=1e-6)

    monkeypatch.setattr(run, "CURVE_MIN_GAIN", 0.01)
    one, summary = solve(t, typed_config(OptimizerConfig, opt), 0.05, gpu="a100", clock_latency=STALLED)
    rec = summary["emo"]
    assert rec["curve_gain"] == pytest.approx(gain) and rec["single_clock_mhz"] == plan.steps[0][0].sm_mhz
    assert all(len(s) == 1 for s in one.steps.values()) and one.steps == plan.steps
    assert one.predicted_energy_j == pytest.approx(plan.predicted_energy_j)


def test_peers_time_waits_for_the_latest_raise_and_each_gpus_energy_follows_its_own():
    """With own_nodes (peers sharing a schedule), the expected time is the latest-of-peers quadrature's
    and the energy the GPUs' own latencies' plus the wait for the latest at default-clock idle power:
    giving every GPU the latest peer's latency kept each one slow as long as the slowest (optimistic)."""
    import dataclasses

    from emo.optimize.pipeline.check import Latencies

    t, p, timing, items, build, base = _setup()
    policy = build(Solution(p, items, np.array([0, 2, 2]), "emo", 0.05))
    latest = Latencies(10.0, 95.0, 95.0, (95.0,), (1.0,))  # the stalled raise lands after the slow window's lowering
    own = dataclasses.replace(latest, own_nodes=(10.0,), own_weights=(1.0,))
    at_latest, at_own, both = (
        expected(t, policy, latest),
        expected(t, policy, Latencies.of([10.0, 10.0])),
        expected(t, policy, own),
    )
    assert both.makespan_ns == at_latest.makespan_ns and both.time_s == at_latest.time_s
    wait_s = (at_latest.makespan_ns - at_own.makespan_ns) * 1e-9  # 0 here: the collective bounds the time
    assert at_latest.energy_j < at_own.energy_j - 0.1  # the stalled raise: the GPU predicted slow far longer
    assert both.energy_j == pytest.approx(at_own.energy_j + wait_s * float(t.idle_power_w[:, t.default_index].sum()))
