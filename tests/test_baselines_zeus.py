"""Zeus's own GlobalPowerLimitOptimizer driving the virtual GPU's power limit."""

from __future__ import annotations

import pytest

zeus = pytest.importorskip("zeus", reason="the `zeus` package (extra `baselines`) is not installed")

from emo.baselines.zeus import run_zeus, zeus_on_device  # noqa: E402
from emo.config import GpuConfig, ZeusOptions, typed  # noqa: E402
from emo.device.backends import open_device  # noqa: E402
from emo.workflow.plan import compose  # noqa: E402


@pytest.fixture(scope="module")
def cfg():
    return compose(
        [
            "workload=tp",
            "workload.tp=2",
            "workload.model.layers=1",
            "optimizer.name=zeus",
            "optimizer.zeus.pl_step_w=50",
        ]
    )


def test_zeus_profiles_limits_and_keeps_the_budget(cfg):
    import zeus.device.gpu as zeus_gpu

    device = open_device(cfg["gpu"])
    try:
        opts = typed(ZeusOptions, cfg["optimizer"]["zeus"])
        res = run_zeus(
            device, cfg["workload"], [0, 1], 0.05, opts, typed(GpuConfig, cfg["gpu"]), iterations=10, warmup=1
        )
        # the baseline after zeus, at the default limit: the die is as warm as in zeus's steady state
        # (the virtual GPU's leakage follows its temperature, so a cold first run would cost less)
        base = device.run(cfg["workload"], 10, warmup=1)
    finally:
        device.close()
    prof = res.setting["profile"]
    assert [p["power_limit_w"] for p in prof] == list(range(500, 99, -50))  # zeus's sweep, highest first
    assert prof[-1]["time_s"] > prof[0]["time_s"]  # the virtual GPU throttles under a low limit
    chosen = res.setting["power_limit_w"]
    assert 100 <= chosen < 500
    fastest = prof[0]["time_s"]
    assert next(p for p in prof if p["power_limit_w"] == chosen)["time_s"] <= 1.05 * fastest
    pl = res.steady.time_s / base.time_s - 1
    assert pl <= 0.05 + 0.01 and res.steady.energy_j < base.energy_j
    assert res.explore.time_s > 0 and zeus_gpu._gpus is None  # zeus's singleton restored


def test_zeus_steady_state_is_measured_on_a_die_rewarmed_at_the_max_limit(cfg, monkeypatch):
    """Its sweep ends at its lowest limits on a cooled die, which leaks less: measured straight after,
    even the max limit would measure a saving. gpu.settle_s at the max limit first."""
    device = open_device(cfg["gpu"])
    runs: list[tuple[float, float]] = []  # (limit, device seconds) of every run, in order
    real = device.run

    def run(workload, iterations, **kw):
        r = real(workload, iterations, **kw)
        runs.append((device.cap_w, r.time_s))
        return r

    monkeypatch.setattr(device, "run", run)
    try:
        opts = typed(ZeusOptions, cfg["optimizer"]["zeus"])
        gpu = typed(GpuConfig, {**cfg["gpu"], "settle_s": 2.0})
        res = run_zeus(device, cfg["workload"], [0, 1], 0.05, opts, gpu, iterations=10, warmup=1)
        tdp = device.tdp_w
    finally:
        device.close()
    *explore, steady = runs
    rewarm_s = 0.0
    while explore[-1][0] == tdp:  # the runs between the sweep and the steady state
        rewarm_s += explore.pop()[1]
    assert explore[-1][0] == min(p["power_limit_w"] for p in res.setting["profile"])  # the sweep's last limit
    assert rewarm_s == pytest.approx(2.0, rel=0.05) and steady[0] == res.setting["power_limit_w"]


def test_zeus_adapter_sets_the_device_limit(cfg):
    device = open_device(cfg["gpu"])
    try:
        with zeus_on_device(device, [0, 1], (100.0, 500.0)) as gpus:
            from zeus.device import get_gpus

            g = get_gpus()
            assert g is gpus and g.get_power_management_limit_constraints(1) == (100_000, 500_000)
            g.set_power_management_limit(0, 250_000)
            assert device.cap_w == 250.0
        assert device.cap_w == device.tdp_w  # back to TDP on exit
    finally:
        device.close()
