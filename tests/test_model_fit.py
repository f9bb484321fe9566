"""emo.model on synthetic calibrations whose truth is a known mix of microbenchmarks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from emo.device import COUNTERS
from emo.model import bench_tables, calibrate_energy_level, fit_signatures, idle_power, model_arrays, running_power_w
from emo.model.overlap import calibrate_p, pnorm

CLOCKS = np.arange(600, 1401, 100)
F0 = 1400
K = {c: i for i, c in enumerate(COUNTERS)}
# name -> (resource, work counter, count per launch, compute seconds at f0, flat memory seconds)
PURE = {
    "fp32": ("sm", "fma_inst", 4e8, 1.0e-3, 0.0),
    "int32": ("sm", "alu_inst", 2e8, 1.2e-3, 0.0),
    "hmma": ("sm", "tensor_inst", 5e6, 0.9e-3, 0.0),
    "l2": ("l2", "l2_bytes", 4e9, 0.8e-3, 0.0),
    "dram": ("dram", "dram_read_bytes", 1e9, 0.05e-3, 0.6e-3),
    "dram_w": ("dram", "dram_write_bytes", 1e9, 0.05e-3, 0.65e-3),
}
RES = {n: v[0] for n, v in PURE.items()} | {n + "_low": v[0] for n, v in PURE.items()} | {"idle": "idle"}
P_IDLE = 50 + 30 * (CLOCKS / F0) ** 2  # W
P_RUN = P_IDLE + 20 * (CLOCKS / F0) ** 2.5  # W, a kernel running
UNIT_W = {"fp32": 150.0, "int32": 90.0, "hmma": 250.0, "l2": 80.0, "dram": 60.0, "dram_w": 65.0}


def _v2(f):  # energy per op ~ V^2: flat below 1000 MHz, rising above
    v = np.where(f < 1000, 0.7, 0.7 + 0.3 * (f - 1000) / (F0 - 1000))
    return v**2


def bench_curve(name: str, occupancy: float = 1.0):
    _, counter, count, comp0, mem = PURE[name]
    t = (comp0 * F0 / CLOCKS + mem) / occupancy
    work_e = UNIT_W[name] * (comp0 + mem) * _v2(CLOCKS) / _v2(np.array([F0]))  # fixed per launch
    e = P_RUN * t + work_e
    c = np.zeros(len(COUNTERS))
    c[K[counter]] = count
    c[K["sm_active_cycles"]] = t[-1] * F0 * 1e6
    c[K["active_warps"]] = occupancy
    return t, e, c


def make_bench(pairs: bool = False) -> tuple[pd.DataFrame, dict]:
    rows, truth = [], {}
    variants = [(n, n, 1.0) for n in PURE] + ([(n + "_low", n, 0.25) for n in PURE] if pairs else [])
    for bname, base, occ in variants:
        t, e, c = bench_curve(base, occ)
        truth[bname] = (t, e, c)
    truth["idle"] = (np.full(len(CLOCKS), 1e-3), P_IDLE * 1e-3, np.zeros(len(COUNTERS)))
    for bname, (t, e, c) in truth.items():
        for i, f in enumerate(CLOCKS):
            rows.append({"bench": bname, "sm_mhz": int(f), "time_s": t[i], "energy_j": e[i], **dict(zip(COUNTERS, c))})
    return pd.DataFrame(rows), truth


def sequence_pack(truth: dict, mix: dict[str, float]):
    """A pack that runs x_j launches of each benchmark back to back: the exact truth of the model."""
    t = sum(x * truth[n][0] for n, x in mix.items())
    e = sum(x * truth[n][1] for n, x in mix.items())
    c = sum(x * truth[n][2] for n, x in mix.items())
    c = c.copy()
    c[K["active_warps"]] = sum(x * truth[n][2][K["active_warps"]] * truth[n][0][-1] for n, x in mix.items()) / t[-1]
    return t, e, c


MIXES = {
    "a": {"fp32": 2.0, "dram": 1.0},
    "b": {"hmma": 3.0, "l2": 0.5, "dram_w": 0.25},
    "c": {"int32": 1.0},
    "d": {"fp32": 0.3, "int32": 0.7, "l2": 1.2, "dram": 0.4, "dram_w": 0.1, "hmma": 0.05},
}


def _packs(truth, mixes=MIXES):
    out = {s: sequence_pack(truth, m) for s, m in mixes.items()}
    counters = pd.DataFrame([dict(zip(COUNTERS, v[2]), signature=s) for s, v in out.items()])
    t0 = pd.Series({s: v[0][-1] for s, v in out.items()})
    return out, counters, t0


@pytest.mark.parametrize("overlap", ["sum", "roofline"])
def test_sequence_of_launches_is_recovered_exactly(overlap):
    bench, truth = make_bench()
    packs, counters, t0 = _packs(truth)
    model = fit_signatures(bench, counters, t0, resources=RES, overlap=overlap)
    assert len(model) == len(MIXES) * len(CLOCKS)
    for s, mix in MIXES.items():
        m = model[model["signature"] == s].sort_values("sm_mhz")
        for n in PURE:
            assert m["w_" + n].iloc[0] == pytest.approx(mix.get(n, 0.0), abs=1e-6)
        np.testing.assert_allclose(m["time_s"], packs[s][0], rtol=1e-6)
        np.testing.assert_allclose(m["energy_j"], packs[s][1], rtol=1e-6)
        np.testing.assert_allclose(m["idle_energy_j"] + m["dynamic_energy_j"], m["energy_j"], rtol=1e-12)
        assert m["fit_residual"].iloc[0] < 1e-6
        assert (m["overlap_p"] == 1.0).all()  # measured time = sum of busy times: no overlap


def test_overlapping_resources_fit_the_measured_overlap():
    """One kernel whose compute and DRAM parts overlap (a p=4 smooth max): p is recovered from the
    time at the default clock alone, and then the whole curve follows."""
    bench, truth = make_bench()
    comp, mem = 1.5 * truth["fp32"][0], 2.0 * truth["dram"][0]
    t_true = (comp**4 + mem**4) ** 0.25
    c = 1.5 * truth["fp32"][2] + 2.0 * truth["dram"][2]
    c[K["sm_active_cycles"]], c[K["active_warps"]] = t_true[-1] * F0 * 1e6, 1.0  # what a profiler would see
    counters = pd.DataFrame([dict(zip(COUNTERS, c))], index=["k"])
    model = fit_signatures(bench, counters, {"k": t_true[-1]}, resources=RES)
    assert model["overlap_p"].iloc[0] == pytest.approx(4.0, rel=0.02)
    np.testing.assert_allclose(model["time_s"], t_true, rtol=2e-3)
    plain = fit_signatures(bench, counters, {"k": t_true[-1]}, resources=RES, overlap="sum")
    assert np.abs(plain["time_s"].to_numpy() / t_true - 1).max() > 0.05  # the sum shape is wrong here


def test_running_power_from_same_work_pairs():
    bench, _ = make_bench(pairs=True)
    t = bench_tables(bench)
    np.testing.assert_allclose(running_power_w(t, P_IDLE), P_RUN, rtol=1e-9)
    np.testing.assert_allclose(idle_power(bench).to_numpy(), P_IDLE, rtol=1e-12)
    # with pairs in the basis, energies of sequence packs of the fast variants stay exact
    packs, counters, t0 = _packs(make_bench()[1], {"a": MIXES["a"]})
    m = fit_signatures(bench, counters, t0, resources=RES)
    np.testing.assert_allclose(m["energy_j"], packs["a"][1], rtol=1e-6)


def test_energy_level_calibration_recovers_the_factor_and_is_idempotent():
    bench, truth = make_bench()
    packs, counters, t0 = _packs(truth)
    model = fit_signatures(bench, counters, t0, resources=RES)
    at0 = model[model["sm_mhz"] == F0].set_index("signature")
    n = {"a": 10, "b": 4, "c": 0, "d": 7}
    makespan, devices, other, k_true = 0.2, 2, 3.0, 1.3
    measured = devices * P_IDLE[-1] * makespan + other + k_true * sum(n[s] * at0.loc[s, "dynamic_energy_j"] for s in n)
    cal, k = calibrate_energy_level(model, n, measured, makespan, devices=devices, other_energy_j=other)
    assert k == pytest.approx(k_true)
    np.testing.assert_allclose(cal["dynamic_energy_j"], k_true * model["dynamic_energy_j"])
    again, k2 = calibrate_energy_level(cal, n, measured, makespan, devices=devices, other_energy_j=other)
    assert k2 == pytest.approx(k_true) and np.allclose(again["energy_j"], cal["energy_j"])
    with pytest.raises(ValueError, match="above idle"):
        calibrate_energy_level(model, n, 1.0, makespan, devices=devices)
    with pytest.raises(ValueError, match="not in the model"):
        calibrate_energy_level(model, {"zz": 1}, measured, makespan)


def test_model_arrays_pivot():
    bench, truth = make_bench()
    _, counters, t0 = _packs(truth)
    model = fit_signatures(bench, counters, t0, resources=RES)
    arr = model_arrays(model)
    assert arr.signatures == list(MIXES) and arr.default_mhz == F0
    assert arr.time_s.shape == (len(MIXES), len(CLOCKS))
    np.testing.assert_allclose(arr.time_s[:, -1], t0.to_numpy())
    np.testing.assert_allclose(arr.idle_power_w, P_IDLE)
    assert list(arr.clock_index([600, 650, 1400, 100])) == [0, 0, len(CLOCKS) - 1, 0]


def test_empty_counters_give_a_flat_curve():
    bench, _ = make_bench()
    counters = pd.DataFrame([dict.fromkeys(COUNTERS, 0.0)], index=["nothing"])
    m = fit_signatures(bench, counters, {"nothing": 1e-3}, resources=RES)
    np.testing.assert_allclose(m["time_s"], 1e-3)
    np.testing.assert_allclose(m["dynamic_energy_j"], (P_IDLE - P_IDLE) * 1e-3)  # no run power without pairs


def test_pnorm_and_p_calibration():
    v = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(pnorm(v, 2.0), [5.0, 1.0, 0.0])
    p = calibrate_p(v, np.array([5.0, 1.0, 1.0]), p_max=6.0)
    assert p[0] == pytest.approx(2.0, rel=1e-6) and p[1] == 1.0 and p[2] == 1.0
    assert calibrate_p(v[:1], np.array([4.0]))[0] == 6.0  # faster than any smooth max allows: capped
    assert calibrate_p(v[:1], np.array([8.0]))[0] == 1.0  # slower than the sum: no overlap


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b.drop(columns=["energy_j"]), "missing columns energy_j"),
        (lambda b: b[~((b["bench"] == "fp32") & (b["sm_mhz"] == 800))], "no measurement of fp32 at 800"),
        (lambda b: b.assign(time_s=np.where(b["bench"] == "l2", 0.0, b["time_s"])), "time_s=0"),
        (lambda b: b[b["bench"] != "idle"], "no 'idle'"),
    ],
)
def test_bad_bench_tables(mutate, message):
    bench, truth = make_bench()
    _, counters, t0 = _packs(truth)
    with pytest.raises(ValueError, match=message) as err:
        fit_signatures(mutate(bench), counters, t0, resources=RES)
    assert "\n" not in str(err.value)


def test_bad_signature_inputs():
    bench, truth = make_bench()
    _, counters, t0 = _packs(truth)
    with pytest.raises(ValueError, match="no time for signature 'd'"):
        fit_signatures(bench, counters, t0.drop("d"), resources=RES)
    with pytest.raises(ValueError, match="non-positive"):
        fit_signatures(bench, counters, t0.mul(0), resources=RES)
    with pytest.raises(ValueError, match="missing columns l2_bytes"):
        fit_signatures(bench, counters.drop(columns=["l2_bytes"]), t0, resources=RES)
    with pytest.raises(ValueError, match="overlap"):
        fit_signatures(bench, counters, t0, resources=RES, overlap="magic")
    with pytest.raises(ValueError, match="not in microbench/registry.yaml"):
        fit_signatures(bench, counters, t0)  # synthetic names are not registry benchmarks


def test_smoothing_keeps_a_smooth_curve_and_removes_noise():
    from emo.model.calibration import smooth_curves

    clocks = np.arange(210, 1411, 15)
    f = clocks / clocks.max()
    time = np.stack([0.2 + 0.8 / f, np.maximum(1.0, 0.9 / f)])  # compute-bound; memory-bound with a knee
    np.testing.assert_allclose(smooth_curves(clocks, time[:1], True), time[:1], rtol=1e-6)
    rng = np.random.default_rng(0)
    noisy = time * (1 + 0.004 * rng.standard_normal(time.shape))
    raw_err = np.abs(noisy / time - 1).mean(axis=1)
    err = np.abs(smooth_curves(clocks, noisy, True) / time - 1).mean(axis=1)
    assert err[0] < raw_err[0] / 2 and err[1] < raw_err[1]  # a knee is blurred a little, still closer
    few = noisy[:, :4]  # too few clocks for a smoothing spline: left as measured
    np.testing.assert_array_equal(smooth_curves(clocks[:4], few, True), few)


def test_noisy_repeats_are_smoothed_and_equal_ones_are_not():
    bench, truth = make_bench()
    exact = bench_tables(bench)
    np.testing.assert_array_equal(exact.time_s[0], truth["fp32"][0])  # one row per clock: as measured
    rng = np.random.default_rng(1)
    two = pd.concat([bench.assign(repeat=0), bench.assign(repeat=1)], ignore_index=True)
    np.testing.assert_array_equal(bench_tables(two).time_s, exact.time_s)  # equal repeats: no noise shown
    two["time_s"] *= 1 + 0.004 * rng.standard_normal(len(two))
    noisy = bench_tables(two)
    raw = bench_tables(two, smooth=False)
    i = list(noisy.names).index("fp32")
    assert np.abs(noisy.time_s[i] / truth["fp32"][0] - 1).mean() < np.abs(raw.time_s[i] / truth["fp32"][0] - 1).mean()
