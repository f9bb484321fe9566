"""The validation protocol: measure what a method saves. Run the workload at the max clock and under the method on
the device, both for `validate.iterations` (>= 5) iterations after warm-up (more when needed to span
`validate.min_seconds`, so the energy counter resolves the run), and compare the energy counter and
the time per iteration:

    ES = (E_ori - E_opt) / E_ori        PL = (T_opt - T_ori) / T_ori

The max-clock baseline is measured on both sides of what it is compared with, in the same launch
(A-B-A: max clock, the method, max clock), and is the two together: a GPU warms over a run and its
leakage with it, so a baseline measured only first would be the coldest run and every saving would
read low; a drift over the launch cancels to first order. The static curve is measured the same way,
each clock between two max-clock runs. Before the first, the max clock runs `gpu.settle_s` seconds
unmeasured: a job runs on a warm die, and the model was fitted on one (profile settles the same way).

Offline methods (emo, static, perseus) come with a policy (optimize's policy.json), applied as is;
the policy's predicted time and energy give the prediction error. Online baselines (zeus, geepafs)
run their control loop against the device here (emo.baselines); their steady state is measured the
same way and their search cost is reported as overhead. For optimizer=static the stage also measures
a few static clocks: the energy-time curve `emo compare` plots the methods against; every supported
clock between the lowest point that keeps the budget (PL <= budget + PL_TOLERANCE_PCT, the table's
rule) and the next one down is measured too, and static's result is a fresh run at the clock of the
least measured energy that keeps it (the model's pick is one candidate): the best measured single
clock, not the model's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from emo.baselines import run_online
from emo.baselines.online import PhaseTotals
from emo.device import Device, RunResult, pooled, run_segments, settle_iterations
from emo.errors import ConfigError, InputError
from emo.methods import PL_TOLERANCE_PCT, Method, OnlineContext, describe
from emo.policy import FrequencyPolicy
from emo.progress import progress
from emo.sampling import class_spread
from emo.workloads import kind_of

if TYPE_CHECKING:
    from emo.sections import Config

MIN_ITERATIONS = 5
log = logging.getLogger("emo")


def per_iteration(run: RunResult) -> tuple[float, float]:
    """(time_s, energy_j) of one iteration, energy summed over the job's GPUs."""
    if run.iterations <= 0 or run.time_s <= 0:
        raise ValueError(f"validate: a run measured no time ({run.iterations} iterations, {run.time_s} s)")
    return run.time_s / run.iterations, run.energy_j / run.iterations


def savings(t_ori: float, e_ori: float, t_opt: float, e_opt: float) -> dict[str, float]:
    """ES and PL in percent."""
    return {"es_pct": 100.0 * (e_ori - e_opt) / e_ori, "pl_pct": 100.0 * (t_opt - t_ori) / t_ori}


def prediction_errors(
    policy: FrequencyPolicy, t_opt: float, e_opt: float, t_ori: float, e_ori: float
) -> dict[str, float]:
    """Absolute percentage error of the policy's predicted iteration time and energy, and the ES/PL
    it predicted, when the policy carries its predicted max-clock baseline (meta)."""
    out: dict[str, float] = {}
    if policy.predicted_time_s:
        out["time_error_pct"] = 100.0 * abs(policy.predicted_time_s - t_opt) / t_opt
    if policy.predicted_energy_j:
        out["energy_error_pct"] = 100.0 * abs(policy.predicted_energy_j - e_opt) / e_opt
    bt, be = policy.meta.get("baseline_time_s"), policy.meta.get("baseline_energy_j")
    if bt and be and policy.predicted_time_s and policy.predicted_energy_j:
        pred = savings(bt, be, policy.predicted_time_s, policy.predicted_energy_j)
        out["es_pred_pct"], out["pl_pred_pct"] = pred["es_pct"], pred["pl_pct"]
        out["baseline_time_error_pct"] = 100.0 * abs(bt - t_ori) / t_ori
        out["baseline_energy_error_pct"] = 100.0 * abs(be - e_ori) / e_ori
    return out


def pareto_clocks(supported: list[int], points: int, min_fraction: float) -> list[int]:
    """`points` supported clocks spread evenly from min_fraction * max to the max."""
    clocks = np.asarray(sorted(supported))
    lo = clocks[clocks >= min_fraction * clocks[-1]]
    idx = np.unique(np.round(np.linspace(0, len(lo) - 1, max(points, 2))).astype(int))
    return [int(c) for c in lo[idx]]


def against_max_clock(
    device: Device, workload: Any, policy: FrequencyPolicy, iterations: int, warmup: int, settle: int = 0
) -> tuple[RunResult, RunResult]:
    """(baseline, run) of `policy` between two max-clock runs in one launch (A-B-A), the baseline
    both of them: a drift over the launch (the die warming) cancels to first order. `settle`:
    unmeasured max-clock iterations first (emo.device.run_segments)."""
    before, run, after = run_segments(
        device, workload, [(None, iterations), (policy, iterations), (None, iterations)], warmup=warmup, settle=settle
    )
    return pooled(before, after), run


def measure_static_curve(
    device: Device, workload: Any, devices: list[int], clocks: list[int], iterations: int, warmup: int, base: RunResult
) -> pd.DataFrame:
    """Time and energy per iteration at each static clock, in one launch with a max-clock run before,
    between and after them. Each clock is stated on `base` by its ratio to the max-clock runs on
    either side of it, so that the die's warming over the launch cancels clock by clock."""
    runs: list[tuple[FrequencyPolicy | None, int]] = [(None, iterations)]
    for f in clocks:
        runs += [(FrequencyPolicy.static(device.name, devices, f), iterations), (None, iterations)]
    with progress(1, f"validate: {len(clocks)} static clocks, each between two max-clock runs") as bar:
        results = run_segments(device, workload, runs, warmup=warmup)
        bar.update()
    t_base, e_base = per_iteration(base)
    rows = []
    for i, f in enumerate(clocks):
        t, e = per_iteration(results[2 * i + 1])
        t_ref, e_ref = per_iteration(pooled(results[2 * i], results[2 * i + 2]))  # the max clock on either side
        rows.append({"sm_mhz": f, "time_s": t / t_ref * t_base, "energy_j": e / e_ref * e_base})
    return pd.DataFrame(rows).astype({"sm_mhz": "int32", "time_s": "float64", "energy_j": "float64"})


def bracket_clocks(supported: list[int], curve: pd.DataFrame, limit_s: float, floor_mhz: float) -> list[int]:
    """The supported clocks (>= floor) not yet on the curve between its lowest clock that keeps
    `limit_s` and the next measured clock below it (or the floor): where the budget's edge lies."""
    fit = curve.loc[curve["time_s"] <= limit_s, "sm_mhz"]
    if fit.empty:
        return []
    top = int(fit.min())
    below = curve.loc[curve["sm_mhz"] < top, "sm_mhz"]
    bottom = int(below.max()) if len(below) else floor_mhz - 1
    return [int(c) for c in sorted(supported) if bottom < c < top and c >= floor_mhz and c not in set(curve["sm_mhz"])]


def restated(curve: pd.DataFrame, old: RunResult, new: RunResult) -> pd.DataFrame:
    """A static curve stated on baseline `old`, stated on `new` instead (the same ratios)."""
    (t_old, e_old), (t_new, e_new) = per_iteration(old), per_iteration(new)
    return curve.assign(time_s=curve["time_s"] * (t_new / t_old), energy_j=curve["energy_j"] * (e_new / e_old))


def best_measured_clock(curve: pd.DataFrame, limit_s: float) -> int | None:
    """The clock of the least measured energy among those whose measured time keeps `limit_s`."""
    fit = curve[curve["time_s"] <= limit_s]
    return None if fit.empty else int(fit.sort_values(["energy_j", "sm_mhz"]).iloc[0]["sm_mhz"])


def iteration_estimate_s(policy: FrequencyPolicy | None) -> float | None:
    """The max-clock iteration time a policy was planned on (its predicted baseline, else its period)."""
    if policy is None:
        return None
    t = policy.meta.get("baseline_time_s") or (policy.period_ms / 1000.0 if policy.period_ms else None)
    return float(t) if t else None


def _run_dict(run: RunResult) -> dict:
    t, e = per_iteration(run)
    return {
        "iterations": run.iterations,
        "time_s": run.time_s,
        "energy_j": run.energy_j,
        "iteration_time_s": t,
        "iteration_energy_j": e,
        "energy_per_device_j": {str(k): v for k, v in run.energy_per_device_j.items()},
    }


def static_pick(
    cfg: Config,
    device: Device,
    devices: list[int],
    policy: FrequencyPolicy,
    base: RunResult,
    opt: RunResult,
    setting: dict,
    n: int,
    warmup: int,
) -> tuple[RunResult, RunResult, pd.DataFrame]:
    """(baseline, run, curve) of a method that measures the static curve (Method.measures_static_curve):
    the curve, every clock at the budget's edge, and a fresh run at the clock of the least measured
    energy that keeps the budget (the model's pick, `policy`, measured as `opt`, is a candidate);
    `setting` says which clock and why."""
    vcfg, ocfg, wl = cfg.validate, cfg.optimizer, cfg.workload
    supported = device.supported_clocks()
    clocks = pareto_clocks(supported, vcfg.pareto_points, ocfg.min_clock_fraction)
    curve = measure_static_curve(device, wl, devices, clocks, n, warmup, base)
    limit_s = per_iteration(base)[0] * (1 + float(cfg.budget) + PL_TOLERANCE_PCT / 100)
    edge = bracket_clocks(supported, curve, limit_s, ocfg.min_clock_fraction * max(supported))
    if edge:
        curve = pd.concat([curve, measure_static_curve(device, wl, devices, edge, n, warmup, base)])
    model_mhz = sorted({s.sm_mhz for st in policy.steps.values() for s in st})
    candidates = curve
    if len(model_mhz) == 1:  # the model's pick, measured above, is a candidate too
        t_m, e_m = per_iteration(opt)
        candidates = pd.concat([curve, pd.DataFrame([{"sm_mhz": model_mhz[0], "time_s": t_m, "energy_j": e_m}])])
    pick = best_measured_clock(candidates, limit_s)
    curve = curve.sort_values("sm_mhz").drop_duplicates("sm_mhz").reset_index(drop=True)
    if pick is not None:
        # a fresh run at the pick: its own measurement, not the least of several noisy ones,
        # against its own baseline runs; the curve is restated on that baseline
        first = base
        base, opt = against_max_clock(device, wl, FrequencyPolicy.static(device.name, devices, pick), n, warmup)
        curve = restated(curve, first, base)
        setting.update(
            {"static_pick": "measured", "sm_mhz": pick, "model_mhz": model_mhz, "measured_clocks": int(len(curve))}
        )
    return base, opt, curve


def validate(
    cfg: Config, policy_path: Path | None, open_dev: Callable[[], Device]
) -> tuple[dict, dict, pd.DataFrame | None]:
    """(result.json, the stage's metrics, the static clocks' curve or None) of `cfg`'s method,
    measured on the device `open_dev()` opens; `policy_path`: an offline method's policy.json."""
    vcfg, method = cfg.validate, cfg.optimizer.name
    if kind_of(cfg.workload).recorded:  # a trace cannot be re-run: the policy stands on its prediction
        return _skipped(method, policy_path)
    n, warmup = int(vcfg.iterations), int(vcfg.warmup)
    if n < MIN_ITERATIONS:
        raise ConfigError(f"validate.iterations: {n} is too few (need >= {MIN_ITERATIONS})")
    m = describe(method) or Method(method, online=False)  # unknown: an offline method's policy or nothing
    policy = None
    if not m.online:
        if policy_path is None:
            raise InputError(f"validate: optimizer {method!r} needs optimize's policy.json")
        policy = FrequencyPolicy.load(policy_path)
    device = open_dev()
    try:
        runs = _measure(cfg, device, policy, n, warmup)
        if m.measures_static_curve and vcfg.pareto_points > 0:
            assert policy is not None  # a method measuring the static curve is offline: its policy was loaded above
            runs.base, runs.opt, runs.curve = static_pick(
                cfg, device, runs.devices, policy, runs.base, runs.opt, runs.setting, runs.n, warmup
            )
    finally:
        device.close()
    # a sampled plan: its ranks not traced, measured against their class's traced one
    checked = None if policy is None else class_spread(policy.meta, runs.opt.energy_per_device_j)
    metrics = _metrics(cfg, policy, runs, checked)
    return _result(cfg, policy, runs, metrics, checked), metrics, runs.curve


def _skipped(method: str, policy_path: Path | None) -> tuple[dict, dict, None]:
    """A recorded trace's validate: skipped, with the savings its policy predicted."""
    why = "validate: skipped: a recorded trace cannot be re-run; measuring a policy needs the device running the job"
    logging.getLogger("emo").warning(why)
    pred = {}
    if policy_path is not None:
        meta = FrequencyPolicy.load(policy_path)
        base_t, base_e = meta.meta.get("baseline_time_s"), meta.meta.get("baseline_energy_j")
        if base_t and base_e and meta.predicted_time_s and meta.predicted_energy_j:
            pred = {
                "predicted_es_pct": 100 * (1 - meta.predicted_energy_j / base_e),
                "predicted_pl_pct": 100 * (meta.predicted_time_s / base_t - 1),
            }
    return {"skipped": why, "method": method, **pred}, {"skipped": 1, **pred}, None


@dataclass
class _Runs:
    """What validate measured: the baseline and the method's run, their devices, the online method's
    exploration, the method's setting, the iterations per run and the static clocks' curve."""

    base: RunResult
    opt: RunResult
    devices: list[int]
    explore: PhaseTotals | None
    setting: dict
    n: int
    curve: pd.DataFrame | None = None


def _measure(cfg: Config, device: Device, policy: FrequencyPolicy | None, n: int, warmup: int) -> _Runs:
    """Max clock, the method, max clock: an offline policy in one launch of the program
    (emo.device.run_segments), an online method's own loop between two max-clock runs."""
    wl, vcfg, ocfg, method = cfg.workload, cfg.validate, cfg.optimizer, cfg.optimizer.name
    device.set_policy(None)
    # enough iterations for the energy counter (it updates every ~100 ms) to resolve the run: from
    # the policy's own max-clock iteration time, else (online methods) a one-iteration probe
    est = iteration_estimate_s(policy)
    if est is None:
        est = device.run(wl, 1, warmup=warmup).time_s
    n = max(n, math.ceil(float(vcfg.min_seconds) / max(est, 1e-9)))
    settle = settle_iterations(float(cfg.gpu.settle_s), est)  # before the first launch only
    log.info(
        "validate: %d iterations to settle, then max clock, %s, max clock: 3 x (%d + %d warm-up) iterations: "
        "about %.1f minutes plus start-up",
        settle,
        method,
        n,
        warmup,
        (settle + 3 * (n + warmup)) * est / 60,
    )
    with progress(2, f"validate: max clock, {method}, max clock") as bar:
        if policy is not None:  # in one launch of the program (emo.device.run_segments)
            base, opt = against_max_clock(device, wl, policy, n, warmup, settle)
            bar.update()
            devices = sorted(base.energy_per_device_j) or [0]
            steps = {"policy_steps": {str(d): len(s) for d, s in policy.steps.items()}}
            runs = _Runs(base, opt, devices, None, steps, n)
        else:  # the method's own loop runs between the two max-clock runs
            (before,) = run_segments(device, wl, [(None, n)], warmup=warmup, settle=settle)
            bar.update()
            devices = sorted(before.energy_per_device_j) or [0]
            res = run_online(OnlineContext(device, wl, devices, float(cfg.budget), ocfg, cfg.gpu, n, warmup))
            base = pooled(before, device.run(wl, n, warmup=warmup))
            runs = _Runs(base, res.steady, devices, res.explore, res.setting, n)
        bar.update()
    return runs


def _metrics(cfg: Config, policy: FrequencyPolicy | None, runs: _Runs, checked: dict | None) -> dict:
    """Savings against the baseline, whether they keep the budget, and (an offline policy) how far the
    model's prediction and a sampled plan's classes were from what was measured."""
    t_ori, e_ori = per_iteration(runs.base)
    t_opt, e_opt = per_iteration(runs.opt)
    metrics = {
        **savings(t_ori, e_ori, t_opt, e_opt),
        "t_ori_s": t_ori,
        "e_ori_j": e_ori,
        "t_opt_s": t_opt,
        "e_opt_j": e_opt,
        "within_budget": float(100.0 * (t_opt - t_ori) / t_ori <= 100.0 * float(cfg.budget) + PL_TOLERANCE_PCT),
    }
    if policy is not None and runs.setting.get("static_pick") != "measured":  # the model predicted its own pick only
        metrics.update(prediction_errors(policy, t_opt, e_opt, t_ori, e_ori))
    if runs.explore is not None:
        metrics.update({"explore_time_s": runs.explore.time_s, "explore_energy_j": runs.explore.energy_j})
    if checked is not None:
        metrics.update(checked)
    return metrics


def _result(cfg: Config, policy: FrequencyPolicy | None, runs: _Runs, metrics: dict, checked: dict | None) -> dict:
    return {
        "method": cfg.optimizer.name,
        "budget": float(cfg.budget),
        "workload": cfg.workload,
        "gpu": cfg.gpu.name,
        "baseline": _run_dict(runs.base),
        "optimized": _run_dict(runs.opt),
        "metrics": metrics,
        "setting": runs.setting,
        "predicted": None
        if policy is None
        else {
            "time_s": policy.predicted_time_s,
            "energy_j": policy.predicted_energy_j,
            "baseline_time_s": policy.meta.get("baseline_time_s"),
            "baseline_energy_j": policy.meta.get("baseline_energy_j"),
        },
        **({} if checked is None or policy is None else {"sample": {**policy.meta["sample"], "check": checked}}),
    }
