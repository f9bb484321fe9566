"""One entry point for the optimize stage and the benchmarks: PackTables + optimizer config + budget
-> (FrequencyPolicy, summary). The method (emo.methods) plans: every offline method's `run` takes one
PlanContext; the built-ins are planners (emo.optimize.pipeline.planner: EMO and its ablations;
emo.optimize.pipeline.static)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from emo.methods import OFFLINE, ONLINE, PlanContext, method
from emo.optimize.pipeline.planner import fit_budget, project
from emo.policy import FrequencyPolicy

if TYPE_CHECKING:
    from emo.sections import OptimizerConfig

__all__ = ["fit_budget", "project", "solve"]


def solve(
    tables,
    opt: OptimizerConfig,
    budget: float,
    *,
    gpu: str,
    clock_latency: dict | None = None,
    iteration_sd_s: float | None = None,
    baseline_ratio: float | None = None,
) -> tuple[FrequencyPolicy, dict]:
    """The policy of method opt.name within `budget`, and its summary: the method's own record
    under "<method>." keys, the predictions under "predicted." (the stage's predictor, mean latency).
    `clock_latency`: the calibration's measured clock-request latency (check.planning_latencies:
    what the plan assumes unless optimizer.transition_ms overrides it); `iteration_sd_s`: one
    iteration's measured spread (tables.time_tolerance_ns); `baseline_ratio`: the untraced run's
    measured iteration over the predicted one at the default clock (the deadline's reference,
    planner.Setting). The policy carries its prediction, in expectation over the latencies it was
    planned with (check.expected)."""
    name = opt.name
    m = method(name)
    if m.online or m.run is None:
        raise ValueError(
            f"optimizer.name: {name!r} is not an offline method ({', '.join(OFFLINE)}); "
            f"{', '.join(ONLINE)} run online in validate"
        )
    return m.run(PlanContext(tables, opt, budget, gpu, clock_latency, iteration_sd_s, baseline_ratio))
