"""GEEPAFS: the fold-line fit and clock choice, and its loop on the virtual GPU."""
from __future__ import annotations

import numpy as np
import pytest

from emo.baselines.geepafs import FoldLine, choose_clock, fit_fold_line, probe_clocks, run_geepafs
from emo.device.backends import open_device
from emo.plan import compose

A100 = list(range(210, 1411, 15))


def test_fold_line_recovers_knee_and_plateau():
    truth = FoldLine(slope=4e-4, intercept=0.02, plateau=0.5, sse=0.0)  # knee at 1200 MHz
    f = np.array([1410, 1200, 990, 780])
    line = fit_fold_line(f, truth(f))
    assert line.plateau == pytest.approx(0.5, rel=1e-6)
    assert line.knee_mhz == pytest.approx(1200, rel=1e-3)


def test_fold_line_all_rising_and_all_flat():
    f = np.array([1410, 1200, 990, 780])
    rising = fit_fold_line(f, 1e-4 * f + 0.01)
    assert rising.knee_mhz >= 1410 - 1e-6  # compute-bound: no plateau in range
    flat = fit_fold_line(f, np.full(4, 0.3))
    assert flat.knee_mhz <= 780 + 1e-6  # memory-bound down to the lowest probe


def test_choose_clock_meets_the_target():
    line = FoldLine(slope=4e-4, intercept=0.0, plateau=0.48, sse=0.0)  # knee 1200
    assert choose_clock(line, 0.0, A100, 705) == 1200
    f = choose_clock(line, 0.05, A100, 705)
    assert line(f) >= 0.48 / 1.05 - 1e-12 and line(f - 15) < 0.48 / 1.05
    assert choose_clock(line, 10.0, A100, 705) == 705  # never below the floor
    with pytest.raises(ValueError):
        fit_fold_line([1410], [0.1])


def test_probe_clocks_are_supported_and_distinct():
    p = probe_clocks(A100, [1.0, 0.85, 0.7, 0.55])
    assert p == sorted(set(p), reverse=True) and p[0] == 1410 and all(c in A100 for c in p)


@pytest.fixture(scope="module")
def small_tp():
    cfg = compose(["workload=tp", "workload.tp=2", "workload.model.layers=1", "optimizer.name=geepafs"])
    return cfg


def test_geepafs_loop_on_the_virtual_gpu(small_tp):
    cfg = small_tp
    device = open_device(cfg["gpu"])
    try:
        base = device.run(cfg["workload"], 5, warmup=1)
        opts = {**cfg["optimizer"]["geepafs"], "min_clock_fraction": 0.5, "iterations": 5, "warmup": 1, "periods": 1}
        res = run_geepafs(device, cfg["workload"], [0, 1], 0.05, opts)
    finally:
        device.close()
    clocks = set(res.setting["clocks"].values())
    assert clocks and max(clocks) < 1410  # a 5 % budget on a compute-bound TP step buys a lower clock
    pl = res.steady.time_s / base.time_s - 1
    es = 1 - res.steady.energy_j / base.energy_j
    assert 0 < pl < 0.10 and es > 0.03
    assert 0 < res.setting["probe_time_fraction"] < 1 and res.explore.energy_j > 0


class _NoUtilization:
    """The virtual GPU behind an interface without utilization() (a device that cannot report it)."""

    def __init__(self, device):
        self._device, self.name = device, device.name

    def __getattr__(self, k):
        if k == "utilization":
            raise AttributeError(k)
        return getattr(self._device, k)


def test_geepafs_needs_a_utilisation_signal(small_tp):
    device = open_device(small_tp["gpu"])
    opts = {"probe_fractions": [1.0, 0.7], "min_clock_fraction": 0.5, "periods": 1, "hold_iterations": 1,
            "iterations": 5, "warmup": 0}
    with pytest.raises(ValueError, match="utilization"):
        run_geepafs(_NoUtilization(device), small_tp["workload"], [0], 0.02, opts)
    device.close()
