"""optimize: the frequency policy of the configured method within the budget, from the pack graph
and the fitted model; its predicted time and energy (and the max-clock baseline's) come from the
model's prediction API, with clock transitions as the hardware applies them.

Offline methods only: emo (the DP), static (one clock) and the ablations (emo.methods.ABLATIONS).
zeus, geepafs and perseus tune online inside validate; for them optimize writes nothing to apply.

The clock-request latency it plans with is the calibration's measurement (calibrate's
calibration.json, `clock_latency_ms`; check.planning_latencies), unless optimizer.transition_ms
overrides it; the stage logs which.

A plan from a sampled trace (`trace.ranks`, emo.sampling) is planned once per class of ranks (the
graph holds one rank per pipeline stage and TP position) and covers every rank of the job: the policy
maps each rank to its class's schedule (meta.ranks), its predicted energy is the job's, and the
summary's `sample` states what is assumed of the ranks not traced."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from emo.stages import Stage

log = logging.getLogger("emo")

INPUTS = {
    "packs": ("pack", "packs.parquet"),
    "nodes": ("pack", "nodes.parquet"),
    "edges": ("pack", "edges.parquet"),
    "iterations": ("pack", "iterations.parquet"),
    "model": ("fit", "model.parquet"),
    "check": ("fit", "check.json"),  # one iteration's measured spread: the budget's tolerance
    "calibration": ("calibrate", "calibration.json"),  # the measured clock-request latency
}


def _inputs(cfg: dict) -> dict:
    """A sampled trace's plan also reads which ranks it stands for (the trace's measured.json)."""
    if cfg["trace"]["ranks"] == "all":
        return INPUTS
    return {**INPUTS, "measured": ("trace", "measured.json")}


STAGE = Stage(
    reads=("gpu", "optimizer", "budget", "trace"),
    inputs=_inputs,
    outputs=("policy.json", "summary.json"),
    discovers=("emo.optimize.solvers",),  # the method's module, found by its name
)


def _read(path: Path | None) -> dict:
    """A JSON file an earlier stage wrote ({} when there is none); one line naming it if it is broken."""
    if path is None or not Path(path).is_file():
        return {}
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def clock_latency(path: Path | None) -> dict | None:
    """The measured clock-request latency in a calibrate folder's calibration.json (None when the
    file or the measurement is missing: a calibration from before EMO measured it)."""
    return _read(path).get("clock_latency_ms")


def iteration_sd(path: Path | None) -> float | None:
    """One iteration's measured spread (s) in a fit folder's check.json (None without one)."""
    sd = _read(path).get("iteration_time_sd_s")
    return None if sd is None else float(sd)


def baseline_ratio(path: Path | None) -> float | None:
    """The untraced run's measured iteration time over the model's prediction at the default clock,
    from a fit folder's check.json (None without an untraced measurement: a recorded trace's
    baseline is the traced run itself)."""
    check = _read(path)
    d = check.get("default") or {}
    pred, meas = d.get("predicted_iteration_s"), d.get("measured_iteration_s")
    if pred is None or meas is None or check.get("baseline_source", "untraced") != "untraced":
        return None
    return float(meas) / float(pred)


GATE_PCT = 1.0  # the prediction may miss the measured untraced iteration by max(this, 2 sd)


def check_describes_run(check: dict, where: str) -> None:
    """The gate (docs/optimize.md, "The trace is not the run"): the model of the traced graph must
    reproduce the iteration measured without the profiler at the default clock within
    max(GATE_PCT, 2 iteration sd), else the policy would spend slack the run does not have: one line
    naming the trace's figures and what to do (errors.InputError: exit 2)."""
    from emo.errors import InputError

    d = check.get("default") or {}
    pred, meas = d.get("predicted_iteration_s"), d.get("measured_iteration_s")
    if pred is None or meas is None:
        return
    sd = check.get("iteration_time_sd_s")
    allowed = max(GATE_PCT, 200.0 * float(sd) / float(meas) if sd else 0.0)
    err = 100.0 * (float(pred) / float(meas) - 1.0)
    if abs(err) > allowed and check.get("baseline_source", "untraced") != "untraced":
        # a recorded trace: its baseline is the traced run itself, so this is the model's error, not the trace's
        log.warning(
            "optimize: the model predicts %.3f ms an iteration, the recorded trace shows %.3f ms (%+.1f %%); "
            "a recorded trace comes with no untraced run to check it against",
            1e3 * float(pred),
            1e3 * float(meas),
            err,
        )
    elif abs(err) > allowed:
        raise InputError(
            f"{where}: the traced graph predicts {1e3 * float(pred):.3f} ms an iteration at the default clock, "
            f"the run measures {1e3 * float(meas):.3f} ms untraced ({err:+.1f} %, more than {allowed:.1f} %): "
            "the trace does not describe the run, so no policy is planned on it; trace with less overhead "
            "(trace.capture=light) and measure the run untraced (trace.untraced_iterations > 0); the graph stage's summary.json `untraced` says what was corrected"
        )


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    from emo.io import write_json
    from emo.model.predict import load_pack_tables, predict
    from emo.optimize import solve
    from emo.optimize.pipeline.check import planning_latencies
    from emo.sections import OptimizerConfig, typed

    opt = typed(OptimizerConfig, cfg["optimizer"])
    where = inputs.get("calibration", "calibration")
    measured = clock_latency(inputs.get("calibration"))
    planning_latencies(opt, measured, where=str(where))  # before any work: one line if it is missing
    from emo.methods import method

    if not method(opt.name).online:  # an online method measures the run itself
        check_describes_run(_read(inputs.get("check")), "trace")
    tables = load_pack_tables(Path(inputs["packs"]).parent, Path(inputs["model"]).parent)
    policy, summary = solve(
        tables,
        opt,
        float(cfg["budget"]),
        gpu=cfg["gpu"]["name"],
        clock_latency=measured,
        iteration_sd_s=iteration_sd(inputs.get("check")),
        baseline_ratio=baseline_ratio(inputs.get("check")),
    )
    lo, mean, hi = summary[opt.name]["transition_ms"]  # what solve planned with, its clock groups' included
    log.info(
        "optimize: planned with clock requests landing in [%.2f, %.2f] ms, mean %.2f (%s)",
        lo,
        hi,
        mean,
        summary[opt.name]["transition_source"],
    )
    base = predict(tables, None)
    policy.meta.update({"baseline_time_s": base.time_s, "baseline_energy_j": base.energy_j})
    sample = _read(inputs.get("measured")).get("sample")
    if sample:  # one schedule per class, every rank of the job mapped to its class's (emo.sampling)
        from emo.sampling import Sample, expand_policy

        summary["sample"] = expand_policy(policy, Sample.from_dict(sample))
        base_e = float(policy.meta["baseline_energy_j"])
        log.info(
            "optimize: %s; %d distinct schedule(s)", summary["sample"]["assumption"], summary["sample"]["schedules"]
        )
    else:
        base_e = base.energy_j
    policy.save(out / "policy.json")
    # per iteration, by the stage's predictor at the mean configured latency
    t, e = policy.predicted_time_s, policy.predicted_energy_j
    assert t is not None and e is not None  # an offline method's policy carries its prediction (emo.methods)
    summary["predicted"] = {
        "time_s": t,
        "energy_j": e,
        "baseline_time_s": base.time_s,
        "baseline_energy_j": base_e,
        "es_pct": 100 * (1 - e / base_e),
        "pl_pct": 100 * (t / base.time_s - 1),
    }
    write_json(out / "summary.json", summary)
    metrics = {f"predicted_{k}": v for k, v in summary["predicted"].items()}
    if sample:
        metrics.update({"schedules": summary["sample"]["schedules"], "planned_ranks": summary["sample"]["classes"]})
    return metrics
