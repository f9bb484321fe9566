"""emo.model against the virtual A100: calibrate the microbenchmarks, profile realistic packs with
the range profiler, fit, and compare predicted with measured time and energy at other clocks.

The model sees only what a real GPU would show: microbenchmark measurements, counter vectors and
each pack's time at the default clock. The virtual GPU's measurements of the packs at every clock
are the truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from emo.microbench import load_registry
from emo.model import calibrate_energy_level, fit_signatures

pytestmark = pytest.mark.slow
CONF = Path(__file__).resolve().parents[1] / "conf" / "gpu"


@pytest.fixture(scope="module")
def a100():
    from emo.device.sim import SimDevice
    from emo.workloads import kernels as K
    from emo.workloads.arch import ARCHS

    dev = SimDevice(yaml.safe_load((CONF / "a100.yaml").read_text()))
    f0 = dev.default_clock()
    clocks = [705, 945, 1185, f0]  # a subset of the clocks >= half the max keeps it quick
    rows = []
    for b in load_registry():
        counters = dev.profile_range([b]).counters
        for f in clocks:
            m = dev.run_microbenchmark(b, f, min_seconds=0.05)
            rows.append({"bench": b, "sm_mhz": f, "time_s": m.time_s, "energy_j": m.energy_j, **counters})
    a = ARCHS["a100"]
    packs = {
        "gemm": [K.gemm(a, "bf16", 4096, 4096, 4096)],
        "gemm+ln": [K.gemm(a, "bf16", 4096, 4096, 1024), K.layer_norm_fwd(a, "bf16", 4096, 4096)],
        "attn": [K.attention_fwd(a, "bf16", 8, 16, 2048, 128)],
        "ln+gelu": [K.layer_norm_fwd(a, "bf16", 8192, 4096), K.elementwise(a, "bf16", "gelu", 8192 * 4096)],
        "adam": [K.adam(a, 50_000_000)],
        "decode": [
            K.gemm(a, "bf16", 8, 4096, 4096),
            K.gemm(a, "bf16", 8, 4096, 3 * 4096),
            K.rms_norm(a, "bf16", 8, 4096),
        ],
    }
    profiled, truth = {}, {}
    for name, kernels in packs.items():
        profiled[name] = dev.profile_range(list(kernels)).counters
        # the pack's kernels run back to back: measure each at each clock and add up
        ms = [[dev.measure_work(k.work, f, min_seconds=0.05) for f in clocks] for k in kernels]
        truth[name] = (
            np.sum([[m.time_s for m in row] for row in ms], axis=0),
            np.sum([[m.energy_j for m in row] for row in ms], axis=0),
        )
    return pd.DataFrame(rows), pd.DataFrame(profiled).T, truth, clocks


def _errors(model, truth):
    out = {}
    for s, (t, e) in truth.items():
        m = model[model["signature"] == s].sort_values("sm_mhz")
        out[s] = (np.abs(m["time_s"].to_numpy() / t - 1) * 100, np.abs(m["energy_j"].to_numpy() / e - 1) * 100)
    return out


def test_predictions_match_the_virtual_gpu(a100):
    bench, counters, truth, clocks = a100
    t0 = {s: t[-1] for s, (t, _) in truth.items()}
    model = fit_signatures(bench, counters, t0)
    assert sorted(model["sm_mhz"].unique()) == clocks
    err = _errors(model, truth)
    time_mape = np.mean([e[0].mean() for e in err.values()])
    energy_mape = np.mean([e[1].mean() for e in err.values()])
    # energy: the virtual GPU's power is not the model's law (non-additive activity power, regulator
    # loss, warm-die leakage: docs/virtual-gpu.md); measured 3.8 %
    assert time_mape < 3.0 and energy_mape < 4.5, (time_mape, energy_mape)
    # the virtual GPU's kernel phases and the SM-clock part of its DRAM latency are not in the model:
    # its worst pack x clock errs ~13.8 % (microbenchmark-mix models err 5-10 % per kernel across
    # clocks on hardware)
    assert max(e[0].max() for e in err.values()) < 15.0
    assert max(e[1].max() for e in err.values()) < 10.0
    # the overlap model beats the plain sum of benchmark times on memory-bound packs
    plain = _errors(fit_signatures(bench, counters, t0, overlap="sum"), truth)
    assert np.mean([e[0].mean() for e in plain.values()]) > time_mape
    assert plain["adam"][0].max() > 1.5 * err["adam"][0].max()  # 27.6 % vs 13.8 %: the latency bound at low clocks


def test_energy_level_from_an_iteration_is_close_to_one(a100):
    """One iteration runs every pack once back to back at the default clock; calibrating the level on
    its measured energy must barely move a model that is already right."""
    bench, counters, truth, _ = a100
    t0 = {s: t[-1] for s, (t, _) in truth.items()}
    model = fit_signatures(bench, counters, t0)
    makespan = sum(t[-1] for t, _ in truth.values())
    measured = sum(e[-1] for _, e in truth.values())
    cal, k = calibrate_energy_level(model, dict.fromkeys(truth, 1), measured, makespan)
    # within the model's own energy error (the test above): the die's temperature between these
    # short measurements follows how long each clock change takes to land (docs/virtual-gpu.md)
    assert abs(k - 1) < 0.06, k
