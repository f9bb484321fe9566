"""The microbenchmark power model on real GTX Titan X data (../shared/data/dvfs/gpupowermodel_titanx)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emo.model.gpupowermodel import read_power_curves
from emo.model.power import anchor_to_default, evaluate_power_model, fit_power_mixture, mape

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dvfs" / "gpupowermodel_titanx"
MICRO = DATA / "TitanX__titanx_micro_names_peak_idle_HPCAandCF.csv"
APPS = DATA / "TitanX__titanx_real_allFsPower_HPCAandCF.csv"
needs_data = pytest.mark.skipif(not MICRO.is_file(), reason=f"{DATA} not present")


@needs_data
def test_reader_finds_every_configuration():
    micro, apps = read_power_curves(MICRO), read_power_curves(APPS)
    assert len(micro.names) == 102 and len(apps.names) == 35  # names repeat across families
    assert micro.clocks.shape == (64, 2) and micro.default_mhz == (975, 3505)
    assert micro.components == ["SP", "INT", "DP", "SFU", "CF", "L2", "Shared", "DRAM"]
    assert micro.names[-1] == "Idle" and not micro.util[-1].any()


@needs_data
def test_emo_beats_the_mean_curve_baseline():
    table = evaluate_power_model(read_power_curves(MICRO), read_power_curves(APPS))
    mean = table.mean()
    assert mean["emo"] < mean["baseline"]  # absolute: ~9 % vs ~21 %
    assert mean["emo_anchored"] < mean["baseline_anchored"]  # anchored at the default clock: ~3.2 % vs ~4.8 %
    assert mean["emo_anchored"] < 4.0


def test_mixture_is_exact_for_a_mix_of_benchmarks():
    rng = np.random.default_rng(1)
    util = np.eye(4) * rng.uniform(0.5, 1.0, 4)
    idle = np.linspace(40, 60, 5)
    power = idle + rng.uniform(20, 90, (4, 1)) * np.linspace(0.6, 1.0, 5)
    x_true = np.array([[0.2, 0.0, 0.5, 0.1]])
    x, pred = fit_power_mixture(util, power, idle, x_true @ util)
    np.testing.assert_allclose(x, x_true, atol=1e-12)
    np.testing.assert_allclose(pred[0], idle + x_true[0] @ (power - idle))
    np.testing.assert_allclose(anchor_to_default(pred, [100.0], 4)[0, 4], 100.0)
    assert mape(np.array([110.0]), np.array([100.0])) == pytest.approx(10.0)


def test_reader_rejects_bad_files(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("2\n975,3505\n1,1\nSP,DRAM\na,100,975,3505,0.1\n")
    with pytest.raises(ValueError, match="fields"):
        read_power_curves(p)
    p.write_text("oops\n")
    with pytest.raises(ValueError, match="4-line header"):
        read_power_curves(p)
    p.write_text("2\n975,3505\n1,1\nSP,DRAM\na,100,975,3505,0.1,0.2\na,90,900,3505,0.1,0.2\nb,100,975,3505,0.1,0.2\n")
    with pytest.raises(ValueError, match="has 1 rows"):
        read_power_curves(p)
