"""validate: measure what a method saves. Run the workload at the max clock and under the method on
the device, both for `validate.iterations` (>= 5) iterations after warm-up (more when needed to span
`validate.min_seconds`, so the energy counter resolves the run), and compare the energy counter and
the time per iteration:

    ES = (E_ori - E_opt) / E_ori        PL = (T_opt - T_ori) / T_ori

Offline methods (emo, static, perseus) come with a policy (optimize's policy.json), applied as is;
the policy's predicted time and energy give the prediction error. Online baselines (zeus, geepafs)
run their control loop against the device here (emo.baselines); their steady state is measured the
same way and their search cost is reported as overhead. For optimizer=static the stage also measures
a few static clocks: the energy-time curve `emo compare` plots the methods against.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from emo.baselines import ONLINE, run_online
from emo.device import RunResult
from emo.device.backends import open_device
from emo.io import write_json, write_parquet
from emo.policy import FrequencyPolicy
from emo.progress import progress, track

MIN_ITERATIONS = 5


def per_iteration(run: RunResult) -> tuple[float, float]:
    """(time_s, energy_j) of one iteration, energy summed over the job's GPUs."""
    if run.iterations <= 0 or run.time_s <= 0:
        raise ValueError(f"validate: a run measured no time ({run.iterations} iterations, {run.time_s} s)")
    return run.time_s / run.iterations, run.energy_j / run.iterations


def savings(t_ori: float, e_ori: float, t_opt: float, e_opt: float) -> dict[str, float]:
    """ES and PL in percent."""
    return {"es_pct": 100.0 * (e_ori - e_opt) / e_ori, "pl_pct": 100.0 * (t_opt - t_ori) / t_ori}


def prediction_errors(policy: FrequencyPolicy, t_opt: float, e_opt: float, t_ori: float, e_ori: float) -> dict[str, float]:
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


def measure_static_curve(device: Any, workload: Any, devices: list[int], clocks: list[int],
                         iterations: int, warmup: int) -> pd.DataFrame:
    rows = []
    for f in track(clocks, "validate: static clocks"):
        device.set_policy(FrequencyPolicy.static(device.name, devices, f))
        t, e = per_iteration(device.run(workload, iterations, warmup=warmup))
        rows.append({"sm_mhz": f, "time_s": t, "energy_j": e})
    device.set_policy(None)
    return pd.DataFrame(rows).astype({"sm_mhz": "int32", "time_s": "float64", "energy_j": "float64"})


def _run_dict(run: RunResult) -> dict:
    t, e = per_iteration(run)
    return {"iterations": run.iterations, "time_s": run.time_s, "energy_j": run.energy_j,
            "iteration_time_s": t, "iteration_energy_j": e,
            "energy_per_device_j": {str(k): v for k, v in run.energy_per_device_j.items()}}


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    wl, vcfg, ocfg = cfg["workload"], cfg["validate"], cfg["optimizer"]
    if wl["kind"] == "recorded":  # a trace cannot be re-run: the policy stands on its prediction
        import logging

        why = "validate: skipped: a recorded trace cannot be re-run; measuring a policy needs the device running the job"
        logging.getLogger("emo").warning(why)
        pred = {}
        if "policy" in inputs:
            meta = FrequencyPolicy.load(inputs["policy"])
            base_t, base_e = meta.meta.get("baseline_time_s"), meta.meta.get("baseline_energy_j")
            if base_t and base_e and meta.predicted_time_s and meta.predicted_energy_j:
                pred = {"predicted_es_pct": 100 * (1 - meta.predicted_energy_j / base_e),
                        "predicted_pl_pct": 100 * (meta.predicted_time_s / base_t - 1)}
        write_json(out / "result.json", {"skipped": why, "method": ocfg["name"], **pred})
        return {"skipped": 1, **pred}
    n, warmup, method = int(vcfg["iterations"]), int(vcfg["warmup"]), ocfg["name"]
    if n < MIN_ITERATIONS:
        raise ValueError(f"validate.iterations: {n} is too few (need >= {MIN_ITERATIONS})")
    policy = None
    if method not in ONLINE:
        if "policy" not in inputs:
            raise ValueError(f"validate: optimizer {method!r} needs optimize's policy.json")
        policy = FrequencyPolicy.load(inputs["policy"])
    device = open_device(cfg["gpu"])
    try:
        device.set_policy(None)
        # enough iterations for the energy counter (it updates every ~100 ms) to resolve the run
        probe = device.run(wl, 1, warmup=warmup)
        n = max(n, math.ceil(float(vcfg["min_seconds"]) / max(probe.time_s, 1e-9)))
        with progress(2, f"validate: max clock, then {method}") as bar:
            base = device.run(wl, n, warmup=warmup)
            bar.update()
            devices = sorted(base.energy_per_device_j) or [0]
            explore = None
            setting: dict = {}
            if policy is not None:
                device.set_policy(policy)
                opt = device.run(wl, n, warmup=warmup)
                device.set_policy(None)
                setting = {"policy_steps": {str(d): len(s) for d, s in policy.steps.items()}}
            else:
                res = run_online(method, device, wl, devices, float(cfg["budget"]), ocfg, cfg["gpu"],
                                 iterations=n, warmup=warmup)
                opt, explore, setting = res.steady, res.explore, res.setting
            bar.update()
        curve = None
        if method == "static" and vcfg["pareto_points"] > 0:
            clocks = pareto_clocks(device.supported_clocks(), vcfg["pareto_points"], ocfg["min_clock_fraction"])
            curve = measure_static_curve(device, wl, devices, clocks, n, warmup)
    finally:
        device.close()

    t_ori, e_ori = per_iteration(base)
    t_opt, e_opt = per_iteration(opt)
    metrics = {**savings(t_ori, e_ori, t_opt, e_opt), "t_ori_s": t_ori, "e_ori_j": e_ori, "t_opt_s": t_opt, "e_opt_j": e_opt,
               "within_budget": float(100.0 * (t_opt - t_ori) / t_ori <= 100.0 * float(cfg["budget"]) + 0.5)}
    if policy is not None:
        metrics.update(prediction_errors(policy, t_opt, e_opt, t_ori, e_ori))
    if explore is not None:
        metrics.update({"explore_time_s": explore.time_s, "explore_energy_j": explore.energy_j})
    if curve is not None:
        write_parquet(out / "pareto.parquet", curve)
    write_json(out / "result.json", {
        "method": method, "budget": float(cfg["budget"]), "workload": wl, "gpu": cfg["gpu"]["name"],
        "baseline": _run_dict(base), "optimized": _run_dict(opt), "metrics": metrics, "setting": setting,
        "predicted": None if policy is None else {"time_s": policy.predicted_time_s, "energy_j": policy.predicted_energy_j,
                                                  "baseline_time_s": policy.meta.get("baseline_time_s"),
                                                  "baseline_energy_j": policy.meta.get("baseline_energy_j")},
    })
    return metrics
