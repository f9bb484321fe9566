"""GEEPAFS: the two-segment fold line, f_bound / f_eff / f_cap, the probing schedule, NVML-style
sampled utilisation, and its loop on the virtual GPU with the probing counted in the steady state."""

from __future__ import annotations

import numpy as np
import pytest

from emo.baselines.geepafs import FoldLine, choose_clock, fit_fold_line, probe_clocks, probe_schedule, run_geepafs
from emo.config import GeepafsOptions, typed
from emo.device.backends import open_device
from emo.workflow.plan import compose

A100 = list(range(210, 1411, 15))
PROBES = [780, 990, 1200, 1410]


def _fold(a1, b1, a2, f_c):
    return FoldLine(a1, b1, a2, b1 + f_c * (a1 - a2), f_c, 780.0, 0.0, 8)


def test_fold_line_recovers_two_sloped_segments_from_noisy_probes():
    truth = _fold(5e-4, -0.1, 1e-4, 1100.0)  # steep below 1100 MHz, still rising above it
    f = np.array(probe_schedule([780, 900, 990, 1100, 1200, 1305, 1410], 2), float)
    u = truth(f) + np.random.default_rng(0).normal(0, 0.002, f.size)
    line = fit_fold_line(f, u)
    assert line.f_c == pytest.approx(1100, abs=40)
    assert line.a1 == pytest.approx(5e-4, rel=0.15) and line.a2 == pytest.approx(1e-4, abs=4e-5)
    assert line.a2 > 0  # two sloped segments, not a plateau
    assert line.rms < 0.005


def test_fold_line_is_one_line_when_no_fold_fits_better():
    f = np.array(probe_schedule(PROBES, 2), float)
    line = fit_fold_line(f, 2e-4 * f + 0.01)
    assert line.f_c == np.inf and line.a1 == pytest.approx(2e-4) and line.sse < 1e-20
    with pytest.raises(ValueError):
        fit_fold_line([1410, 1410], [0.1, 0.2])


def test_a_crossing_outside_its_gap_is_pinned_to_the_gap():
    # the split 2 | 2 of these four probes gives lines crossing far left of 990..1200: pinned at 990
    f = np.array([780, 990, 1200, 1410] * 2, float)
    u = np.array([0.10, 0.30, 0.50, 0.52] * 2)
    line = fit_fold_line(f, u)
    assert line.a1 > line.a2 and 990 <= line.f_c <= 1200
    assert float(line(line.f_c - 1e-6)) == pytest.approx(float(line(line.f_c)), abs=1e-6)  # continuous


def test_f_bound_is_the_lowest_clock_keeping_the_throughput():
    line = _fold(5e-4, -0.1, 1e-4, 1100.0)
    # power rising steeply with the clock: the lowest probe is the most efficient, below f_bound
    pick, parts = choose_clock(line, 0.05, A100, 705, PROBES, power_w=[100, 200, 300, 400], gpu_util=[1.0] * 4)
    u_max, fb = float(line(1410)), parts["f_bound"]
    assert float(line(fb)) >= u_max / 1.05 - 1e-12 and float(line(fb - 15)) < u_max / 1.05
    assert fb < 1200 and parts["f_eff"] == 780 and pick == fb  # on the second (shallow) segment


def test_f_eff_raises_the_clock_to_the_most_efficient_probe():
    line = _fold(5e-4, -0.1, 1e-4, 1100.0)
    # power nearly flat below 1200: throughput per watt is best at 1200, above f_bound
    pick, parts = choose_clock(line, 0.10, A100, 705, PROBES, power_w=[300, 310, 320, 420], gpu_util=[1.0] * 4)
    assert parts["f_bound"] < 1200 and parts["f_eff"] == 1200 and pick == 1200


def test_f_cap_bounds_the_clock_by_gpu_utilisation():
    line = _fold(5e-4, -0.1, 1e-4, 1100.0)
    pick, parts = choose_clock(
        line, 0.0, A100, 705, PROBES, power_w=[300, 330, 370, 420], gpu_util=[0.6, 0.6, 0.65, 0.7]
    )
    assert parts["f_bound"] == 1410 and parts["f_cap"] == pytest.approx(1410 * 0.7)
    assert pick == min(c for c in A100 if c >= 1410 * 0.7)  # min(max(f_bound, f_eff), f_cap), rounded up
    low, _ = choose_clock(line, 0.0, A100, 1200, PROBES, power_w=[1] * 4, gpu_util=[0.1] * 4)
    assert low == 1200  # never below the floor


def test_no_model_means_max_clock_unless_capped():
    pick, parts = choose_clock(None, 0.0, A100, 705, PROBES, power_w=[1] * 4, gpu_util=[1.0] * 4)
    assert parts["f_bound"] == 1410 and parts["f_eff"] == 780 and pick == 1410
    capped, _ = choose_clock(None, 0.05, A100, 705, PROBES, power_w=[1] * 4, gpu_util=[1.0] * 4)
    assert capped == 1350  # f_cap = f_max / 1.05 even at full utilisation


def test_probing_schedule_zigzags_over_supported_clocks():
    p = probe_clocks(A100, [1.0, 0.85, 0.7, 0.55])
    assert p == sorted(set(p)) and p[-1] == 1410 and all(c in A100 for c in p)
    assert probe_schedule([1, 2, 3], 2) == [1, 2, 3, 3, 2, 1]


def test_sim_utilisation_samples_are_whole_percent_per_nvml_period():
    cfg = compose(["workload=tp", "workload.tp=2", "workload.model.layers=1"])
    device = open_device(cfg["gpu"])
    try:
        run = device.run(cfg["workload"], 4, warmup=1)
        got = device.utilization_samples(0)
        mean = device.utilization(0)
    finally:
        device.close()
    period = 1 / 6
    assert len(got["memory"]) == int(run.time_s // period) >= 1 and len(got["gpu"]) == len(got["memory"])
    t = [x for x, _ in got["memory"]]
    assert np.allclose(np.diff(t), period)
    for kind in ("gpu", "memory"):
        vals = np.array([v for _, v in got[kind]])
        assert np.allclose(vals * 100, np.round(vals * 100)) and (vals <= 1).all()  # NVML's integer percent
        assert vals.mean() == pytest.approx(mean[kind], abs=0.05)  # the samples of the same run


@pytest.fixture(scope="module")
def small_tp():
    return compose(["workload=tp", "workload.tp=2", "workload.model.layers=1", "optimizer.name=geepafs"])


def _opts(cfg, **kw):
    return typed(GeepafsOptions, {**cfg["optimizer"]["geepafs"], "periods": 1, "period_ms": 4000.0, **kw})


RUN = {"min_clock_fraction": 0.5, "iterations": 5, "warmup": 1}


def test_geepafs_loop_counts_its_probing_in_the_steady_state(small_tp):
    cfg = small_tp
    device = open_device(cfg["gpu"])
    try:
        base = device.run(cfg["workload"], 10, warmup=1)
        res = run_geepafs(device, cfg["workload"], [0, 1], 0.05, _opts(cfg), **RUN)
    finally:
        device.close()
    s = res.setting
    assert s["measured_periods"] == 1 and len(s["history"]) == 2
    per_period = 8 * s["sample_iterations"] + s["hold_iterations"]
    assert res.steady.iterations == per_period  # the whole period: 8 probe samples, then the hold
    assert 0.05 < s["probe_time_fraction"] < 0.9 and 0 < s["probe_energy_fraction"] < 1
    assert res.explore.time_s > 0 and res.explore.energy_j > 0
    rec = s["history"][-1]["0"]
    assert {"f_bound", "f_eff", "f_cap"} <= rec.keys() and len(rec["memory"]) == 4
    t_base = base.time_s / base.iterations
    pl = res.steady.time_s / res.steady.iterations / t_base - 1
    es = 1 - (res.steady.energy_j / res.steady.iterations) / (base.energy_j / base.iterations)
    assert pl > 0 and es > 0  # the probes at low clocks cost time the hold alone would not


class _NoSamples:
    """The virtual GPU behind an interface without utilization_samples()."""

    def __init__(self, device):
        self._device, self.name = device, device.name

    def __getattr__(self, k):
        if k == "utilization_samples":
            raise AttributeError(k)
        return getattr(self._device, k)


def test_geepafs_needs_sampled_utilisation_and_a_period_longer_than_its_probing(small_tp):
    device = open_device(small_tp["gpu"])
    try:
        with pytest.raises(ValueError, match="utilization_samples"):
            run_geepafs(_NoSamples(device), small_tp["workload"], [0], 0.02, _opts(small_tp), **RUN)
        with pytest.raises(ValueError, match="period_ms"):
            run_geepafs(device, small_tp["workload"], [0], 0.02, _opts(small_tp, period_ms=1000.0), **RUN)
    finally:
        device.close()
