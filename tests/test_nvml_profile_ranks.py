"""Profiling a multi-rank command on hardware, with fakes at the NVML and Nsight Compute boundaries:
one ncu run follows every rank of torchrun, NCCL kernels are not replayed, and each range gets its
own rank's kernels; the cost is stated before it starts; without ncu or permission the profile stage
goes on without counters and says so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

from emo.device import KernelRange  # noqa: E402
from emo.device import nvml as nv  # noqa: E402
from emo.workloads.command import CommandWorkload  # noqa: E402


def _csv(per_rank: list[list[float]], pids=None) -> str:
    """ncu kernel-replay CSV of every rank's process; kernel k of rank r has r*1000 + k active cycles.
    Results interleave across processes, as concurrent ranks do."""
    head = '"ID","Process ID","Process Name","Kernel Name","Device","Metric Name","Metric Unit","Metric Value"'
    rows, rid = [], 0
    longest = max(len(k) for k in per_rank)
    for k in range(longest):
        for r, ks in reversed(list(enumerate(per_rank))):  # rank order is not ncu's order
            if k < len(ks):
                pid = (pids or {}).get(r, 4000 + 7 * r)
                for m, v in (
                    ("sm__cycles_active.sum", ks[k]),
                    ("dram__bytes_read.sum", 10.0 * ks[k]),
                    ("sm__warps_active.avg.pct_of_peak_sustained_active", 50.0),
                ):
                    rows.append(f'"{rid}","{pid}","python","k{k}","{r}","{m}","x","{v}"')
                rid += 1
    return '==PROF== Profiling "k": 0%....50%....100% - 6 passes\n' + "\n".join([head, *rows]) + "\n"


@pytest.fixture
def dev(monkeypatch):
    nvml_fake.install(monkeypatch, gpus=8)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return nv.NvmlDevice({"name": "a100"})


@pytest.mark.parametrize("nproc", [2, 8])
def test_every_rank_is_profiled_in_one_ncu_run(dev, monkeypatch, nproc):
    # each rank launches 5 compute kernels and, at ordinals 2 and 5, two NCCL kernels (not profiled)
    per_rank = [[r * 1000.0 + k for k in range(5)] for r in range(nproc)]
    seen = {}

    def fake_run(cmd, env, timeout_s=1800):
        seen.update(cmd=cmd, env=env)
        return _csv(per_rank), 30.0

    monkeypatch.setattr(nv, "_run_ncu", fake_run)
    wl = CommandWorkload(command=["python", "train.py"], nproc=nproc, wait=1, warmup=1, active=2)
    ranges = [KernelRange(r, (0, 1), nccl=(2, 5)) for r in range(nproc)] + [
        KernelRange(r, (3, 4, 6), nccl=(2, 5)) for r in range(nproc)
    ]
    res = dev.profile_ranges(wl, ranges)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--target-processes") + 1] == "all"
    assert cmd[cmd.index("--kernel-name") + 1] == nv.NCCL_KERNELS
    assert "torch.distributed.run" in cmd and f"--nproc-per-node={nproc}" in cmd
    assert "CUDA_VISIBLE_DEVICES" not in seen["env"] or seen["env"]["CUDA_VISIBLE_DEVICES"] != "0"
    for r in range(nproc):
        a, b = res[r], res[nproc + r]
        assert a.counters["sm_active_cycles"] == 2 * r * 1000 + 0 + 1  # compute kernels 0, 1
        # ordinals 3, 4, 6 skip NCCL ordinals 2 and 5: compute kernels 2, 3, 4
        assert b.counters["sm_active_cycles"] == 3 * r * 1000 + 2 + 3 + 4
        assert b.counters["dram_read_bytes"] == 10 * b.counters["sm_active_cycles"]
    assert sum(x.cost_s for x in res) == pytest.approx(30.0) and res[0].passes == 6


def test_a_missing_rank_or_a_nccl_range_is_one_clear_line(dev, monkeypatch):
    monkeypatch.setattr(nv, "_run_ncu", lambda cmd, env, timeout_s=1800: (_csv([[1.0, 2.0]]), 1.0))
    wl = CommandWorkload(command=["python", "train.py"], nproc=2)
    with pytest.raises(ValueError, match="kernels of 1 processes, but the command has 2 ranks"):
        dev.profile_ranges(wl, [KernelRange(0, (0,))])
    monkeypatch.setattr(nv, "_run_ncu", lambda cmd, env, timeout_s=1800: (_csv([[1.0, 2.0], [3.0, 4.0]]), 1.0))
    with pytest.raises(ValueError, match="ordinal 1 is a NCCL kernel"):
        dev.profile_ranges(wl, [KernelRange(1, (1,), nccl=(1,))])


def test_ranks_follow_the_device_not_the_process_id(dev, monkeypatch):
    text = _csv([[1.0], [2.0]], pids={0: 9000, 1: 100})
    monkeypatch.setattr(nv, "_run_ncu", lambda cmd, env, timeout_s=1800: (text, 1.0))
    res = dev.profile_ranges(
        CommandWorkload(command=["python", "t.py"], nproc=2), [KernelRange(0, (0,)), KernelRange(1, (0,))]
    )
    assert [r.counters["sm_active_cycles"] for r in res] == [1.0, 2.0]


def test_cost_is_estimated_from_the_kernels(dev):
    # slowest rank: 3 kernels of 1 ms, 8 passes of (1 ms + 2 ms save/restore) each
    assert dev.profile_cost_s([[1e-3] * 3, [1e-3]], run_s=10.0) == pytest.approx(10.0 + 8 * 3 * 3e-3)


def test_no_permission_and_no_ncu_are_profiling_unavailable(monkeypatch):
    import subprocess

    from emo.device import ProfilingUnavailable

    monkeypatch.setattr(
        subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(
            a,
            1,
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters",
            "",
        ),
    )
    with pytest.raises(ProfilingUnavailable, match="no permission"):
        nv._run_ncu(["ncu", "python"], {})
    monkeypatch.undo()
    with pytest.raises(ProfilingUnavailable, match="Nsight Compute not found"):
        nv._run_ncu(["ncu-not-here-at-all"], {})
