"""Methods are objects (emo.methods): a new one is written the way docs/design.md §14 says and runs
through the optimize stage's API; the stages read flags, never names."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
from test_optimize_verify import LATS, _tables

import emo.optimize.solvers
from emo import methods
from emo.config import OptimizerConfig, typed
from emo.optimize import solve
from emo.optimize.pipeline.planner import Candidate, Planner, Setting
from emo.workflow.plan import compose

# docs/design.md §14, "an offline method": emo/optimize/solvers/<name>.py, word for word
ONE_CLOCK = '''
import numpy as np

from emo.optimize.pipeline.planner import Planner


class OneClock(Planner):
    """One clock on every window: the single-clock curve is the frontier; the pick is Planner's own
    (least predicted energy within the budget, else the fastest)."""

    method = "one_clock"

    def frontier(self, s):
        for c in range(s.p.n_clocks):
            yield s.candidate(np.full(s.items.k, c), self.method)


run = OneClock()
'''


@pytest.fixture
def conventional_module(tmp_path, monkeypatch):
    """emo/optimize/solvers/one_clock.py, written into a folder the package searches."""
    (tmp_path / "one_clock.py").write_text(textwrap.dedent(ONE_CLOCK))
    monkeypatch.setattr(emo.optimize.solvers, "__path__", [*emo.optimize.solvers.__path__, str(tmp_path)])
    yield "one_clock"
    methods._REGISTRY.pop("one_clock", None)
    sys.modules.pop("emo.optimize.solvers.one_clock", None)


def _opt(name: str) -> dict:
    return {**compose([])["optimizer"], "name": name, "change_points": "grid", "transition_ms": [LATS[0], LATS[-1]]}


def test_a_new_offline_method_written_as_the_docs_say_plans_through_the_stage_api(conventional_module):
    t = _tables()
    assert conventional_module in methods.OFFLINE and conventional_module not in methods.ONLINE
    policy, summary = solve(t, typed(OptimizerConfig, _opt(conventional_module)), 0.05, gpu="a100")
    m = methods.method(conventional_module)
    assert not m.online and m.rival and not m.lead and not m.measures_static_curve
    assert summary["method"] == conventional_module and policy.budget == 0.05
    assert policy.predicted_time_s and policy.predicted_energy_j  # the stage's predictor, as every method
    clocks = {s.sm_mhz for st in policy.steps.values() for s in st}
    assert len(clocks) == 1 and summary[conventional_module]["transition_source"]
    assert summary["plan"]["energy_j"] <= summary["plan"]["baseline_energy_j"]


def test_a_registered_planner_gets_the_stage_setting_and_its_pick():
    seen: dict = {}

    class Fastest(Planner):
        method = "fastest"

        def frontier(self, s: Setting):
            seen["budget"] = s.budget
            yield s.candidate(np.full(s.items.k, s.p.ref), self.method)

        def pick(self, s: Setting, candidates) -> Candidate:
            (c,) = candidates
            seen["on_time"] = c.on_time
            return c

    methods.register_method("fastest", online=False, run=Fastest(), label="max clock")
    try:
        policy, summary = solve(_tables(), typed(OptimizerConfig, _opt("fastest")), 0.05, gpu="a100")
        assert seen == {"budget": 0.05, "on_time": True} and methods.describe("fastest").title == "max clock"
        assert summary["fastest"]["planning_budget"] >= 0.05
    finally:
        methods._REGISTRY.pop("fastest", None)


def test_the_stages_read_flags_not_names():
    assert methods.lead() == "emo" and methods.method("emo").lead
    assert [m for m in methods.METHODS if methods.describe(m).measures_static_curve] == ["static"]
    assert set(methods.ABLATIONS) == {"perseus+emo-search", "emo-dp", "emo-pass", "emo-grid"}
    assert all(methods.describe(m).ablation_of == "emo" for m in methods.ABLATIONS)
    assert methods.describe("nope") is None


def test_an_online_method_is_refused_by_optimize():
    with pytest.raises(ValueError, match="not an offline method"):
        solve(_tables(), typed(OptimizerConfig, _opt("zeus")), 0.05, gpu="a100")
