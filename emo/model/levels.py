"""The workload's model table: per pack signature x calibrated clock, predicted time and energy (emo.model: NNLS mix of the
microbenchmarks, anchored at each signature's measured default-clock time), with its time level
per clock (time_level) and energy levels calibrated against measured whole iterations, then the default-clock prediction of the whole
workload through the pack-graph what-if (emo.model.predict) as a check.

Energy levels. A pack's energy cannot be measured (sensors are far slower than 5 ms), and neither
can a GPU's power in the gaps between kernels: the idle microbenchmark holds a running kernel, so
its power P_b(f) bounds a truly idle GPU's from above. With the model at level 1, an iteration
costs I + Y: I = P_b integrated over every GPU's makespan, Y = the packs' dynamic energy above P_b;
B = the part of I spent while packs run. If the gaps draw a P_b and the packs' dynamic energy is
k Y, an iteration costs  E = a (I - B) + B + k Y.  The measured iterations, at the default clock
and at the static clocks of `model.level_fractions` (stage profile), give a and k by least squares
(one equation per GPU and clock where the device reports each GPU's energy: energy_levels), applied to the model table: idle_power_w
= a P_b (column idle_level = a), dynamic_energy_j = k x dynamic + (1 - a) P_b x time (so a pack's
total is unchanged by a; column energy_level = k). a must lie in (0, 1]: when the points cannot
separate the levels (a GPU busy all the time has I ~ B), a = 1 and k is fitted to them all; if
even that fails, k comes from the default-clock iteration alone (emo.model.calibrate_energy_level).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from emo.graph import Graph
from emo.model.calibration import counter_features
from emo.model.fit import calibrate_energy_level, fit_signatures
from emo.model.predict import pack_tables, predict
from emo.policy import FrequencyPolicy, policy_device_ids

if TYPE_CHECKING:
    from emo.sections import GpuConfig

log = logging.getLogger("emo")


def fit_time(
    bench: pd.DataFrame,
    metrics: pd.DataFrame,
    packs: pd.DataFrame,
    default_mhz: int | None,
    clocks: list[int] | None = None,
) -> pd.DataFrame:
    """The model table at energy levels 1, anchored at each signature's median pack time; at every
    one of `clocks` inside the calibrated range (a calibration at a clock subset is interpolated)."""
    time_default = packs.groupby("signature")["dur_ns"].median() * 1e-9
    features = counter_features(bench.columns)  # EMO's own counters, or the device's DCGM / ncu names
    # a signature profiled without counters (source none) has NaN ones: the fit gives it the mean mix
    counters = metrics.set_index("signature").reindex(columns=list(features)).astype(np.float64)
    return fit_signatures(bench, counters, time_default, default_mhz=default_mhz, clocks=clocks or None)


def with_time_level(model: pd.DataFrame, level) -> pd.DataFrame:
    """The model with every signature's slowdown from the default clock (time_s over its time at the
    default clock, minus 1) times λ(f): `level` is one λ, or (sm_mhz, λ) points, linear between them
    and constant beyond; each pack's energy stays as fitted."""
    out = model.copy()
    at_default = out[out["sm_mhz"] == out["default_mhz"]].set_index("signature")["time_s"]
    t_def = out["signature"].map(at_default)
    if np.ndim(level) == 0:
        lam = np.full(len(out), float(level))
    else:
        pts = sorted((float(f), float(v)) for f, v in level)
        lam = np.interp(out["sm_mhz"].to_numpy(np.float64), [f for f, _ in pts], [v for _, v in pts])
    out["time_s"] = t_def + lam * (out["time_s"] - t_def)
    # the energies were fitted to measurements: the level moves time, not energy (a slower pack
    # spends more of it at the idle power, less above it)
    out["idle_energy_j"] = out["idle_power_w"] * out["time_s"]
    out["dynamic_energy_j"] = np.maximum(out["energy_j"] - out["idle_energy_j"], 0.0)
    out["energy_j"] = out["idle_energy_j"] + out["dynamic_energy_j"]
    out["time_level"] = lam
    return out


LEVEL_RANGE = (0.5, 3.0)  # a λ outside it means the measurement, not the model, is off
LEVEL_MIN_SE = 3.0  # a measured slowdown within this many standard errors of 0 says nothing about λ


def resolved(meas: dict, baseline: dict) -> bool:
    """Whether the slowdown from the default clock to `meas`'s stands out of the two measurements'
    noise (their standard errors; True where the device reports none)."""
    sd = [m.get("iteration_time_sd_s") for m in (meas, baseline)]
    sd_known = [x for x in sd if x is not None]
    if len(sd_known) < len(sd):
        return True
    se = [float(x) / np.sqrt(max(int(m.get("iterations", 1)), 1)) for x, m in zip(sd_known, (meas, baseline))]
    return abs(float(meas["iteration_time_s"]) - float(baseline["iteration_time_s"])) > LEVEL_MIN_SE * float(
        np.hypot(*se)
    )


def time_levels(
    model: pd.DataFrame, graph: Graph, packs: pd.DataFrame, anchors: pd.DataFrame, baseline: dict, gpu: str
) -> tuple[list[tuple[int, float]], list[dict]]:
    """(sm_mhz, λ) for with_time_level: at each clock the profile measured a whole iteration at, the
    λ that makes the predicted iteration equal the measured one (a static clock reads the model at
    that clock only, so each point is matched alone). The microbenchmark mix times each pack in
    isolation; the whole workload (memory and launch latencies, overlap between streams, the
    collectives' contention) slows with the clock somewhat differently, and the optimizer, which
    spends every microsecond of slack and budget, turns that difference into a measured overrun.
    A point whose slowdown is within the measurements' noise (resolved), or where no λ in
    LEVEL_RANGE fits, is left out; [] (λ = 1 everywhere) without any: a workload that barely slows
    (memory- or host-bound) keeps the model's own curve rather than one scaled by noise. Second:
    the points left out, each {sm_mhz, why}, so that nothing is dropped without a word."""
    from scipy.optimize import brentq

    keys = pack_tables(graph, packs, model, anchors).device_keys
    out, dropped = [], []
    for meas in baseline.get("levels", []):
        if not resolved(meas, baseline):
            dropped.append({"sm_mhz": int(meas["sm_mhz"]), "why": "slowdown within the measurements' noise"})
            continue
        pol = FrequencyPolicy.static(gpu, policy_device_ids(keys), int(meas["sm_mhz"]))

        def error(lam: float) -> float:
            t = pack_tables(graph, packs, with_time_level(model, lam), anchors)
            return predict(t, pol).time_s - float(meas["iteration_time_s"])

        lo, hi = error(LEVEL_RANGE[0]), error(LEVEL_RANGE[1])
        if lo * hi <= 0:
            out.append((int(meas["sm_mhz"]), float(brentq(error, *LEVEL_RANGE, xtol=1e-3))))
        else:
            dropped.append(
                {
                    "sm_mhz": int(meas["sm_mhz"]),
                    "why": f"no time level in {list(LEVEL_RANGE)} reproduces it "
                    f"(predicted {1e3 * (lo + float(meas['iteration_time_s'])):.3f}-"
                    f"{1e3 * (hi + float(meas['iteration_time_s'])):.3f} ms, measured "
                    f"{1e3 * float(meas['iteration_time_s']):.3f} ms)",
                }
            )
    return out, dropped


def with_levels(model: pd.DataFrame, idle_level: float, energy_level: float) -> pd.DataFrame:
    """The level-1 model with the GPU's power between kernels at idle_level x the idle benchmark's,
    and each signature's energy above it: energy_level x its dynamic energy + what the idle
    benchmark draws above that level while the pack runs."""
    out = model.copy()
    unit = out["dynamic_energy_j"] / out["energy_level"]
    p_bench = out["idle_power_w"] / out.get("idle_level", 1.0)
    out["idle_power_w"] = p_bench * idle_level
    out["idle_energy_j"] = out["idle_power_w"] * out["time_s"]
    out["dynamic_energy_j"] = unit * energy_level + (1.0 - idle_level) * p_bench * out["time_s"]
    out["energy_level"] = energy_level
    out["idle_level"] = idle_level
    out["energy_j"] = out["idle_energy_j"] + out["dynamic_energy_j"]
    return out


def per_device_shares(meas: dict, ids: list[int]) -> np.ndarray | None:
    """Each GPU's share of a measured iteration's energy (policy device ids `ids`), None when the
    measurement does not name every one of them."""
    per = meas.get("energy_per_device_j") or {}
    if not all(str(i) in per for i in ids):
        return None
    e = np.array([float(per[str(i)]) for i in ids])
    return e / e.sum() if e.sum() > 0 else None


def energy_levels(
    model: pd.DataFrame, graph: Graph, packs: pd.DataFrame, anchors: pd.DataFrame, baseline: dict, gpu: str
) -> tuple[float, float, str]:
    """(idle level a, dynamic level k, how) from the measured iterations (module docstring), one
    equation per GPU and measured clock where every measurement names each GPU's energy, else one per
    measured clock. The GPUs of one workload differ in how much of the iteration they wait (pipeline
    stages, a host-bound GPU), so their energies tell the power between kernels from the kernels'
    own, which at static clocks move together in the whole iteration's sum: on PP4 the sums left a
    and k unresolved (condition number ~58, a > 1, so a = 1 by the fallback), and the optimizer,
    which lowers clocks where GPUs wait, was predicted 2-3 points more saving than it measured."""
    t = pack_tables(graph, packs, model, anchors)
    busy = t.energy_j.copy()
    busy[t.is_pack] = t.idle_power_w[0][None, :] * t.dur_ns[t.is_pack] * 1e-9  # idle-benchmark power while packs run
    tb = dataclasses.replace(t, energy_j=busy)
    points = [(None, baseline)] + [(m["sm_mhz"], m) for m in baseline.get("levels", [])]
    ids = policy_device_ids(t.device_keys)
    shares = [per_device_shares(meas, ids) for _, meas in points]
    per_gpu = all(s is not None for s in shares)
    rows, rhs = [], []
    for (mhz, meas), share in zip(points, shares):
        pol = None if mhz is None else FrequencyPolicy.static(gpu, ids, mhz)
        p, b = predict(t, pol), predict(tb, pol)
        # predict fills the per-device energies
        assert p.idle_per_device_j is not None and p.dynamic_per_device_j is not None
        assert b.dynamic_per_device_j is not None
        i, y, bb = (
            p.idle_per_device_j / p.iterations,
            p.dynamic_per_device_j / p.iterations,
            b.dynamic_per_device_j / b.iterations,
        )
        e = float(meas["iteration_energy_j"])
        if per_gpu:
            assert share is not None  # per_gpu: every share is known
            rows += np.c_[i - bb, y].tolist()
            rhs += (e * share - bb).tolist()
        else:
            rows.append([i.sum() - bb.sum(), y.sum()])
            rhs.append(e - bb.sum())
    rows_a, rhs_a = np.array(rows), np.array(rhs)
    if len(rows_a) >= 2 and np.linalg.matrix_rank(rows_a / np.abs(rows_a).max(), tol=1e-9) == 2:
        (a, k), *_ = np.linalg.lstsq(rows_a, rhs_a, rcond=None)  # least squares over every measured point
        if 0 < a <= 1 and k > 0:
            return float(a), float(k), f"{len(rows_a)}-point" + (" (per GPU)" if per_gpu else "")
    # a GPU between kernels draws at most the idle benchmark's power (it holds a kernel): when the
    # points cannot separate the levels (a GPU busy all the time), keep a = 1 and fit k to them all
    y, r = rows_a[:, 1], rhs_a - rows_a[:, 0]
    k = float(y @ r / (y @ y)) if (y @ y) > 0 else float("nan")
    return (1.0, k, "dynamic-only") if k > 0 else (1.0, float("nan"), "default-clock")


def _energy_fit(model, graph, packs, anchors, baseline: dict, gpu_name: str, iterations: int, devices: int):
    """(model, idle level a, energy level k, how): the energy levels fitted to the measured
    iterations; when they cannot be separated (default-clock), k calibrated on the default clock's
    energy alone; none for a recorded trace without energy."""
    if baseline.get("iteration_energy_j") is None:  # a recorded trace without energy: the model's own level
        return model, 1.0, 1.0, "none (no measured energy)"
    a, k, how = energy_levels(model, graph, packs, anchors, baseline, gpu_name)
    if how.startswith("none"):
        return model, a, k, how
    if how != "default-clock":
        return with_levels(model, a, k), a, k, how
    occurrences = (
        packs.groupby("signature")["dur_ns"].sum() / (packs.groupby("signature")["dur_ns"].median()) / iterations
    )
    model, k = calibrate_energy_level(
        model,
        occurrences,
        float(baseline["iteration_energy_j"]),
        float(baseline["iteration_time_s"]),
        devices=devices,
    )
    return with_levels(model, 1.0, k), a, k, how


def _versus(t, meas: dict, pol) -> dict:
    """The model's prediction of a measured run (`meas`) under `pol` (None: the default clock)."""
    p = predict(t, pol)
    e_meas = meas["iteration_energy_j"]
    return {
        "sm_mhz": meas["sm_mhz"],
        "predicted_iteration_s": p.time_s,
        "predicted_energy_j": p.energy_j,
        "measured_iteration_s": meas["iteration_time_s"],
        "measured_energy_j": e_meas,
        "time_error_pct": 100 * (p.time_s / meas["iteration_time_s"] - 1),
        "energy_error_pct": None if e_meas is None else 100 * (p.energy_j / e_meas - 1),
    }


def fit_workload(
    gpu: GpuConfig,
    bench: pd.DataFrame,
    metrics: pd.DataFrame,
    graph: Graph,
    packs: pd.DataFrame,
    anchors: pd.DataFrame,
    baseline: dict,
) -> tuple[pd.DataFrame, dict, dict]:
    """(model table, check.json, the fit stage's metrics) of one workload on GPU configuration
    `gpu`: the calibration `bench`, its packs' counters `metrics`, its pack graph, packs and
    iteration anchors, and the profile's measured iterations `baseline` (the module docstring)."""
    iterations = int(anchors.groupby("rank").size().max()) if len(anchors) else 1
    devices = int(graph.nodes.loc[graph.nodes["device"] >= 0, ["rank", "device"]].drop_duplicates().shape[0])
    # default_mhz 0 (gpu=nvml): the highest calibrated clock; clocks_mhz empty: the calibrated ones
    model = fit_time(bench, metrics, packs, int(gpu.default_mhz) or None, list(gpu.clocks_mhz))
    levels, dropped = time_levels(model, graph, packs, anchors, baseline, gpu.name)
    for d in dropped:
        log.warning("fit: the time level at %d MHz is left out: %s", d["sm_mhz"], d["why"])
    model = with_time_level(model, levels or 1.0)
    model, a, k, how = _energy_fit(model, graph, packs, anchors, baseline, gpu.name, iterations, devices)
    t = pack_tables(graph, packs, model, anchors)
    check: dict[str, Any] = {
        "energy_levels": how,
        "idle_level": a,
        "energy_level": k,
        "time_levels": {str(f): lam for f, lam in levels},
        "time_levels_dropped": dropped,
        # one iteration's spread at the default clock, measured over many (optimize's tolerance)
        "iteration_time_sd_s": baseline.get("iteration_time_sd_s"),
        # what measured the baseline: the run untraced (profile), or a recorded trace's own window
        "baseline_source": baseline.get("source", "untraced"),
    }

    check["default"] = _versus(t, baseline, None)
    check["levels"] = [
        _versus(t, m, FrequencyPolicy.static(gpu.name, policy_device_ids(t.device_keys), m["sm_mhz"]))
        for m in baseline.get("levels", [])
    ]
    lams = [lam for _, lam in levels] or [1.0]

    def worst(key: str) -> float | None:
        return max((abs(c[key]) for c in check["levels"] if c[key] is not None), default=None)

    return (
        model,
        check,
        {
            "signatures": int(model["signature"].nunique()),
            "clocks": int(model["sm_mhz"].nunique()),
            "time_level_min": min(lams),
            "time_level_max": max(lams),
            "idle_level": a,
            "energy_level": k,
            "fit_residual_max": float(model["fit_residual"].max()),
            "default_time_error_pct": check["default"]["time_error_pct"],
            "default_energy_error_pct": check["default"]["energy_error_pct"],
            **(
                {"levels_time_error_pct": worst("time_error_pct"), "levels_energy_error_pct": worst("energy_error_pct")}
                if check["levels"]
                else {}
            ),
        },
    )
