"""Each extension point takes a new entry registered from outside EMO (here, from this test module)
and runs it through the public path: an offline and an online method (optimizer.name), a workload
(workload.kind, composed from a conf/ file), a trace format (read_trace / emo.analyze.Trace), a GPU
vendor (the control interface behind `emo reset-clocks`, and a device backend)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from emo import methods
from emo.device import backends
from emo.device import control as ctl
from emo.policy import FrequencyPolicy
from emo.schema import WorkloadConfig, at_least
from emo.stages import run_chain
from emo.trace import read as trace_read
from emo.workflow.plan import ROOT, compose
from emo.workloads import _REGISTRY as WORKLOAD_REGISTRY
from emo.workloads import build_program, register_workload
from emo.workloads.program import KernelSpec, Op, Program, Work

OFFLOAD = [
    "workload=offload",
    "workload.model.layers=2",
    "workload.decode_tokens=4",
    "tracking.enabled=false",
    "model.clocks_stride=8",
    "model.repeats=1",
]


# ---------------------------------------------------------------- workload
@dataclass
class ToyWorkload(WorkloadConfig):
    kind: str = "toy"
    kernels: int = field(default=3, metadata=at_least(1))  # GEMM-like kernels per iteration


def build_toy(w: ToyWorkload, arch) -> Program:
    p = Program("toy", 1, [[(Op.ITER,)]], meta={"kind": "toy"})
    k = p.kernel(KernelSpec("toy_gemm", Work(fp32_flop=4e9, dram_read_bytes=1e8, active_warps=0.8)))
    p.ops[0] += [(Op.LAUNCH, 7, k) for _ in range(w.kernels)] + [(Op.DEVICE_SYNC,)]
    return p


@pytest.fixture
def toy_workload():
    register_workload("toy", ToyWorkload, build_toy)
    yield
    WORKLOAD_REGISTRY.pop("toy", None)


def test_a_registered_workload_composes_and_runs_on_the_virtual_gpu(toy_workload, tmp_path, run_stage):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "workload" / "toy.yaml").write_text("defaults:\n  - toy_schema\n  - _self_\nkind: toy\nkernels: 4\n")
    cfg = compose(["workload=toy", "tracking.enabled=false", "trace.iterations=3"], config_dir=conf)
    assert cfg["workload"] == {"kind": "toy", "kernels": 4}
    with pytest.raises(ValueError, match="workload.kernels"):  # its schema's ranges are checked
        compose(["workload=toy", "workload.kernels=0"], config_dir=conf)
    assert build_program(cfg["workload"]).kernel_launches() == 4
    run_stage("trace", cfg, {}, tmp_path / "trace")
    events = pd.read_parquet(tmp_path / "trace/events.parquet")
    assert (events["name"].astype(str) == "toy_gemm").sum() >= 3 * 4


def test_an_unknown_workload_kind_is_one_line():
    with pytest.raises(ValueError, match="workload.kind: unknown synthetic workload 'nope'"):
        build_program({"kind": "nope"})


# ---------------------------------------------------------------- methods
@pytest.fixture(scope="module")
def offload(tmp_path_factory):
    d = tmp_path_factory.mktemp("offload")
    run_chain(compose(OFFLOAD), d, until="fit")
    return d


@pytest.fixture
def registered():
    names = []

    def register(name, **kw):
        names.append(name)
        return methods.register_method(name, **kw)

    yield register
    for n in names:
        methods._REGISTRY.pop(n, None)


def test_a_registered_offline_method_plans_in_the_optimize_stage(offload, tmp_path, run_stage, registered):
    from emo.model.predict import predict

    seen = {}

    def lowest_clock(ctx: methods.PlanContext):  # a run of its own, without emo's Planner
        seen["budget"] = ctx.budget
        clocks = sorted(int(c) for c in ctx.tables.clocks_mhz)
        policy = FrequencyPolicy.static(ctx.gpu, [0], clocks[0], budget=ctx.budget)
        pred = predict(ctx.tables, policy)  # the stage's predictor (emo.model)
        policy.predicted_time_s, policy.predicted_energy_j = pred.time_s, pred.energy_j
        return policy, {
            "method": ctx.name,
            ctx.name: {"transition_ms": [0.0, 0.0, 0.0], "transition_source": "none: one clock"},
        }

    registered("lowest", online=False, run=lowest_clock)
    assert "lowest" in methods.OFFLINE and "lowest" in methods.METHODS and "lowest" not in methods.ONLINE
    cfg = compose(OFFLOAD + ["optimizer.name=lowest", "budget=0.05"])
    run_stage(
        "optimize",
        cfg,
        {
            "packs": offload / "pack/packs.parquet",
            "model": offload / "fit/model.parquet",
            "calibration": offload / "calibrate/calibration.json",
        },
        tmp_path / "optimize",
    )
    policy = FrequencyPolicy.load(tmp_path / "optimize/policy.json")
    assert seen == {"budget": 0.05}
    assert [s.sm_mhz for s in policy.steps[0]] == [min(cfg["gpu"]["clocks_mhz"])]
    assert json.loads((tmp_path / "optimize/summary.json").read_text())["method"] == "lowest"


def test_a_registered_online_method_runs_in_the_validate_stage(tmp_path, run_stage, registered):
    from emo.baselines import OnlineResult

    calls = []

    def at_max(ctx: methods.OnlineContext) -> OnlineResult:
        calls.append((list(ctx.devices), ctx.budget))
        ctx.device.set_policy(None)
        run = ctx.device.run(ctx.workload, ctx.iterations, warmup=ctx.warmup)
        return OnlineResult(method="atmax", steady=run, setting={"clock": "default"})

    registered("atmax", online=True, run=at_max)
    assert "atmax" in methods.ONLINE
    cfg = compose(OFFLOAD + ["optimizer.name=atmax", "validate.iterations=5", "validate.min_seconds=0.001"])
    run_stage("validate", cfg, {}, tmp_path / "validate")
    result = json.loads((tmp_path / "validate/result.json").read_text())
    assert len(calls) == 1 and calls[0][1] == cfg["budget"]
    assert result["method"] == "atmax"


def test_an_unknown_method_is_one_line():
    with pytest.raises(ValueError, match="optimizer.name: unknown method 'nope'"):
        methods.method("nope")


# ---------------------------------------------------------------- trace format
def read_parquet_trace(path: Path) -> pd.DataFrame:
    """A toy format: the normalised event table as Parquet (magic bytes PAR1)."""
    from emo.trace.schema import COLUMNS, normalise

    df = pd.read_parquet(path)
    return normalise({c: df[c] for c in COLUMNS})


@pytest.fixture
def parquet_format():
    fmt = trace_read.TraceFormat("events-parquet", lambda p, head: head.startswith(b"PAR1"), read_parquet_trace)
    before = list(trace_read.FORMATS)
    trace_read.register_trace_format(fmt)
    yield
    trace_read.FORMATS[:] = before


def test_a_registered_trace_format_is_analysed(parquet_format, tmp_path):
    from emo.analyze import Trace
    from emo.trace import read_trace

    src = ROOT / "tests/data/traces/hta_event_sync_a100_1stream.json.gz"
    events = read_trace(src)
    f = tmp_path / "trace.events"
    events.to_parquet(f)
    assert len(read_trace(f)) == len(events)
    assert Trace(f).breakdown() == pytest.approx(Trace(src).breakdown())


# ---------------------------------------------------------------- GPU vendor
class ToyControl(ctl.GpuControl):
    """Two GPUs whose changes are a log."""

    def __init__(self):
        self.log: list[tuple] = []
        TOY.append(self)

    def count(self):
        return 2

    def visible(self):
        return [0, 1]

    def supported_clocks(self, index):
        return [500, 1000]

    def lock_sm_clock(self, index, mhz):
        self.log.append(("lock", index, mhz))

    def reset_sm_clock(self, index):
        self.log.append(("reset", index))

    def power_limit_range_w(self, index):
        return (100.0, 300.0, 250.0)

    def set_power_limit(self, index, watts):
        self.log.append(("power", index, watts))

    def reset_power_limit(self, index):
        self.log.append(("power-reset", index))

    def energy_j(self, index):
        return 10.0 * (index + 1)


TOY: list[ToyControl] = []


@pytest.fixture
def toy_vendor(monkeypatch):
    monkeypatch.setitem(ctl.CONTROLS, "toy", ToyControl)
    monkeypatch.setenv(ctl.VENDOR_ENV, "toy")
    TOY.clear()
    yield


def test_a_registered_gpu_vendor_serves_reset_clocks_and_measure(toy_vendor, capsys):
    from emo import loop
    from emo.cli import main

    assert main(["reset-clocks", "--power"]) == 0
    assert "reset clocks and power limits of GPU 0, 1" in capsys.readouterr().out
    assert TOY[-1].log == [("reset", 0), ("power-reset", 0), ("reset", 1), ("power-reset", 1)]
    w = loop.EnergyWindow(sync=False)
    assert w.read_j() == {0: 10.0, 1: 20.0}
    assert main(["reset-clocks", "--gpus", "5"]) != 0  # the vendor's count bounds the indices


def test_a_registered_device_backend_is_opened_by_gpu_backend(monkeypatch):
    opened = []
    monkeypatch.setitem(backends.BACKENDS, "toy", lambda cfg: opened.append(cfg) or "toy-device")
    assert backends.open_device({"backend": "toy", "name": "t"}) == "toy-device"
    assert opened == [{"backend": "toy", "name": "t"}]
    with pytest.raises(ValueError, match="gpu.backend: unknown backend 'nope'"):
        backends.open_device({"backend": "nope"})


def test_the_virtual_gpu_behind_the_control_interface():
    from emo.device.sim import SimDevice

    dev = SimDevice(compose([])["gpu"])
    c = dev.control
    assert isinstance(c, ctl.GpuControl)
    lo = c.supported_clocks(0)[0]
    c.lock_sm_clock(1, lo)
    assert dev.policy.steps == {1: [FrequencyPolicy.static("x", [1], lo).steps[1][0]]}
    c.reset_sm_clock(1)
    assert dev.policy is None
    with pytest.raises(ctl.GpuAccessError, match="no GPU 99"):
        c.energy_j(99)
    with pytest.raises(ctl.GpuAccessError, match="not a supported clock"):
        c.lock_sm_clock(0, lo + 1)


def test_a_method_module_named_by_convention_is_found(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("emo.optimize.solvers.conventional")
    mod.run = lambda ctx: None  # the method's `run` (emo.methods: one context object)
    monkeypatch.setitem(sys.modules, "emo.optimize.solvers.conventional", mod)
    try:
        assert "conventional" in methods.OFFLINE  # loaded by `in`, as plan.py and validate ask
        assert methods.method("conventional").run is mod.run
    finally:
        methods._REGISTRY.pop("conventional", None)


def test_a_workload_module_named_by_convention_is_found(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("emo.workloads.conventional")
    mod.SCHEMA, mod.build = ToyWorkload, build_toy
    monkeypatch.setitem(sys.modules, "emo.workloads.conventional", mod)
    try:
        assert build_program({"kind": "conventional", "kernels": 2}).kernel_launches() == 2
    finally:
        WORKLOAD_REGISTRY.pop("conventional", None)
