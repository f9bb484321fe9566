"""How often one `emo run workload=command` job starts the user's program: once per stage that needs
the GPU. The GPU stages (trace, profile, validate) run in-process on the NVML backend against the
NVML fake (here and in every rank: tests/fake_pynvml) and a fake `ncu` (tests/fake_ncu), over a real
2-rank torchrun DDP job on CPU torch (gloo) that logs each start of its rank 0.

Before this change a job started the program 9 times (trace 1; profile: ncu 1, the default-clock
baseline 1, one per level clock 3; validate: a probe 1, max clock 1, the policy 1). Now: trace 1,
profile 2 (ncu's replay cannot share a launch with energy measurements), validate 1."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

from emo.device import KernelRange  # noqa: E402
from emo.policy import FrequencyPolicy, Step  # noqa: E402
from emo.workloads.command import CommandWorkload  # noqa: E402

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent

PROGRAM = textwrap.dedent("""
    import os, sys, torch
    if os.environ.get("RANK", "0") == "0":
        with open(os.environ["LAUNCH_LOG"], "a") as f:
            f.write(" ".join(k for k in ("EMO_CAPTURE_DIR", "EMO_PROFILE_ITERATION", "EMO_SEGMENTS") if k in os.environ) + "\\n")
    try:
        import fake_cuda  # present only under the fake ncu
    except ImportError:
        fake_cuda = None
    import torch.distributed as dist
    dist.init_process_group("gloo")
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    for i in range(100000):
        if fake_cuda: fake_cuda.launch("k")
        loss = m(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
""")


@pytest.fixture
def job(tmp_path, monkeypatch):
    from emo.device import nvml as nv

    (tmp_path / "train.py").write_text(PROGRAM)
    nvml_fake.install(monkeypatch, gpus=2)
    guard = type(nv._GUARD)()
    monkeypatch.setattr(nv, "_GUARD", guard)
    monkeypatch.setattr(guard, "_install", lambda: setattr(guard, "_installed", True))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE / "fake_pynvml"), str(HERE.parent)]))
    monkeypatch.setenv("EMO_FAKE_NVML_GPUS", "2")
    monkeypatch.setenv("PATH", f"{HERE / 'fake_ncu'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "ncu.log"))
    monkeypatch.setenv("LAUNCH_LOG", str(tmp_path / "launches.log"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return tmp_path


def _launches(tmp: Path) -> list[str]:
    return (tmp / "launches.log").read_text().splitlines() if (tmp / "launches.log").exists() else []


def test_one_launch_per_gpu_stage(job, monkeypatch):
    from emo.device.backends import open_device
    from emo.model import profiling as profile
    from emo.stages import run_in_place

    torchrun = str(Path(sys.executable).with_name("torchrun"))
    wl = {
        **vars(
            CommandWorkload(
                command=[torchrun, "--nproc-per-node", "2", str(job / "train.py")], wait=1, warmup=1, active=2
            )
        )
    }
    # no settling: the launches are what is counted; 0 MHz and 0 W: what NVML reports, as conf/gpu/nvml.yaml
    gpu = {"name": "a100", "backend": "nvml", "default_mhz": 0, "tdp_w": 0.0, "settle_s": 0.0}
    counts = {}

    # the trace stage's device call (the stage itself refuses a CPU trace: no kernels to analyse)
    monkeypatch.setattr(profile, "BASELINE_SECONDS", 0.02)
    device = open_device(gpu)
    try:
        rr = device.run(wl, 3, warmup=1, trace_dir=job / "trace")
        assert len(rr.trace_files) == 2 and rr.iterations == 3
        # and the same program untraced (the graph's timing: the trace is not the run), never under
        # the profiler's window
        plain = device.run(wl, 3, warmup=1)
        assert plain.iterations == 3 and not plain.trace_files
        counts["trace"] = len(_launches(job))
        # the profile stage's two device calls: Nsight Compute over one iteration, then the baselines
        # at the default clock and the level clocks
        device.profile_ranges(wl, [KernelRange(0, (0,)), KernelRange(1, (0,))])
        base = profile.measure_baselines(
            device, wl, iteration_s=0.002, min_seconds=0.02, warmup=1, gpus=[0, 1], fractions=[0.95, 0.85, 0.7]
        )
    finally:
        device.close()
    counts["profile"] = len(_launches(job)) - counts["trace"]
    assert [lv["sm_mhz"] for lv in base["levels"]] == [1380, 900] and base["sm_mhz"] == 1410
    assert base["energy_per_device_j"].keys() == {"0", "1"}

    pol = FrequencyPolicy(
        gpu="a100",
        steps={r: [Step(0.0, 1410), Step(0.5, 900)] for r in (0, 1)},
        period_ms=2.0,
        meta={"baseline_time_s": 0.002, "baseline_energy_j": 1.0},
    )
    pol.save(job / "policy.json")
    vcfg = {"iterations": 5, "warmup": 1, "min_seconds": 0.02, "pareto_points": 0}
    res = run_in_place(
        "validate",
        {"gpu": gpu, "workload": wl, "optimizer": {"name": "emo"}, "budget": 0.05, "validate": vcfg},
        {"policy": job / "policy.json"},
        job / "validate",
    )
    counts["validate"] = len(_launches(job)) - counts["trace"] - counts["profile"]
    assert "es_pct" in res
    result = json.loads((job / "validate" / "result.json").read_text())
    assert result["optimized"]["iterations"] == 10  # 0.02 s / 2 ms
    assert result["baseline"]["iterations"] == 20  # before and after it, in the same launch
    # each measured iteration is a real one: the policy's run takes about as long as the max clock's
    # (CPU ranks, so within what machine load does to 2 ms steps; iterations that were not run, as
    # when a segment's applier marked its own, measure about a thousandth of it)
    ratio = result["optimized"]["iteration_time_s"] / result["baseline"]["iteration_time_s"]
    assert 0.1 < ratio < 10, (ratio, result)
    levels = [lv["iteration_time_s"] / base["iteration_time_s"] for lv in base["levels"]]
    assert all(0.1 < r < 10 for r in levels), (levels, base)

    assert counts == {"trace": 2, "profile": 2, "validate": 1}
    assert _launches(job) == [
        "EMO_CAPTURE_DIR",
        "EMO_SEGMENTS",
        "EMO_PROFILE_ITERATION",
        "EMO_SEGMENTS",
        "EMO_SEGMENTS",
    ]
