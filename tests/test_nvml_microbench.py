"""The hardware microbenchmark path without a GPU: launch plans from the registry checked against
the CUDA sources, loop sizing, the Nsight Compute command and its CSV, and clear errors."""

from __future__ import annotations

import ctypes
import sys
import types
from types import SimpleNamespace

import pytest

from emo.device import COUNTERS
from emo.device import cuda_launch as cl
from emo.device import nvml as nv
from emo.microbench import load_registry


def test_every_registry_entry_has_a_launch_plan_matching_its_kernel():
    reg = load_registry()
    for _name, entry in reg.items():
        plan = cl.launch_plan(entry)
        assert plan.kernel == entry["kernel"] and len(plan.args) == len(entry["args"])
        assert plan.grid == tuple(entry["grid"]) and plan.smem == entry["dynamic_smem_bytes"]
    p = cl.registry_plan("dram_read_high")
    assert [a[0] for a in p.args] == ["buffer", "scalar", "buffer", "scalar", "scalar"]
    assert p.args[1][1] is ctypes.c_ulonglong and p.args[3][1] is ctypes.c_float
    assert p.buffer_bytes >= 1 << 30  # the DRAM benchmark streams a buffer far larger than L2


def test_registry_mismatch_is_caught_before_any_gpu_work():
    entry = dict(load_registry()["fp32_fma_high"])
    swapped = [entry["args"][1], entry["args"][0], entry["args"][2]]
    with pytest.raises(ValueError, match="do not match emo_fp32_fma's parameters"):
        cl.launch_plan({**entry, "args": swapped})
    wrong_type = [dict(entry["args"][0]), dict(entry["args"][1], type="i32"), entry["args"][2]]
    with pytest.raises(ValueError, match="argument sentinel is float"):
        cl.launch_plan({**entry, "args": wrong_type})
    with pytest.raises(ValueError, match="no benchmark 'nope'"):
        cl.registry_plan("nope")


def test_signature_parser_handles_const_and_declarations():
    src = (
        'extern "C" __global__ void k(const float4* __restrict__ buf, unsigned long long n4, int iters);\n'
        'extern "C" __global__ void k(const float4* buf, unsigned long long n4, int iters) {}\n'
    )
    assert cl.parse_signatures(src) == {"k": [("float4*", "buf"), ("unsigned long long", "n4"), ("int", "iters")]}


def test_loops_span_the_energy_counter_window():
    assert nv.loops_for(0.001, 1.0) == 1000
    assert nv.loops_for(0.3, 1.0) == 4  # 1.2 s >= 1 s
    assert nv.loops_for(2.0, 1.0) == 1
    with pytest.raises(ValueError):
        nv.loops_for(0.0, 1.0)


def test_ncu_range_replay_command():
    cmd = nv.ncu_command(["python", "x.py"])
    assert cmd[:5] == ["ncu", "--clock-control", "none", "--replay-mode", "range"] and cmd[-2:] == ["python", "x.py"]
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert "dram__bytes_read.sum" in metrics and "sm__cycles_active.sum" in metrics
    assert "--profile-from-start" in cmd  # ranges are the cuProfilerStart/Stop pairs
    cmd = nv.ncu_command(["python", "x.py"], nvtx_include="pack/")
    assert cmd[cmd.index("--nvtx-include") + 1] == "pack/"


NCU_OUT = """==PROF== Connected to process 123
==PROF== Profiling "range": 0%....50%....100% - 9 passes
"ID","Process ID","Process Name","Host Name","Range Name","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python","h","range","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,073,741,824"
"0","123","python","h","range","0","9.0","Command line profiler metrics","sm__cycles_active.sum","cycle","5000000"
"0","123","python","h","range","0","9.0","Command line profiler metrics","sm__inst_executed_pipe_tensor_op_hmma.sum","inst","42"
"""


def test_ncu_csv_becomes_a_counter_vector():
    vecs = nv.parse_ncu_csv(NCU_OUT)
    assert len(vecs) == 1 and list(vecs[0]) == list(COUNTERS)
    v = vecs[0]
    assert v["dram_read_bytes"] == 1073741824 and v["sm_active_cycles"] == 5e6
    assert v["tensor_inst"] == 42  # the Hopper-named fallback metric
    assert v["fp64_inst"] != v["fp64_inst"]  # absent -> NaN, never a made-up zero
    assert nv.parse_ncu_passes(NCU_OUT) == 9
    with pytest.raises(ValueError, match="no CSV rows"):
        nv.parse_ncu_csv("==PROF== nothing\n")


def test_missing_ncu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(nv.GpuAccessError, match="Nsight Compute not found"):
        nv.ncu_profile_microbench_range(["fp32_fma_high"], ncu="ncu-not-here")


def test_no_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(RuntimeError, match="cuda-python is not installed"):
        cl.import_cuda()


# --------------------------------------------------------------------------- pack ranges on hardware
def _kernel_csv(values: list[dict[str, float]]) -> str:
    head = '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'
    rows = [f'"{i}","1","k{i}","{m}","x","{v}"' for i, vals in enumerate(values) for m, v in vals.items()]
    return '==PROF== Profiling "k": 0%....50%....100% - 3 passes\n' + "\n".join([head, *rows]) + "\n"


def test_profile_ranges_reruns_the_command_under_ncu_and_sums_each_range(monkeypatch, tmp_path):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import nvml_fake

    from emo.device import KernelRange
    from emo.workloads.command import CommandWorkload

    nvml_fake.install(monkeypatch)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    dev = nv.NvmlDevice({"name": "a100"})
    kern = [
        {"sm__cycles_active.sum": c, "sm__warps_active.avg.pct_of_peak_sustained_active": w, "dram__bytes_read.sum": b}
        for c, w, b in ((100, 50, 1e6), (300, 10, 2e6), (50, 90, 0), (10, 20, 5))
    ]
    seen = {}

    def fake_run(cmd, env, timeout_s=1800):
        seen.update(cmd=cmd, env=env)
        return _kernel_csv(kern), 8.0

    monkeypatch.setattr(nv, "_run_ncu", fake_run)
    wl = CommandWorkload(command=["python", "train.py"], wait=4, warmup=2, active=3)
    res = dev.profile_ranges(wl, [KernelRange(0, (0, 1)), KernelRange(0, (3,))])
    cmd = seen["cmd"]
    assert cmd[cmd.index("--replay-mode") + 1] == "kernel"
    # a process-wide window (cudaProfilerStart/Stop), not a per-thread NVTX range; the command as given
    assert cmd[cmd.index("--profile-from-start") + 1] == "off" and "--nvtx-include" not in cmd
    assert cmd[-2:] == ["python", "train.py"]
    env = seen["env"]
    assert env["EMO_PROFILE_ITERATION"] == "6" and "EMO_CAPTURE_DIR" not in env
    assert (env["EMO_ITERATIONS"], env["EMO_STOP"]) == ("8", "1")  # EMO ends it after the window
    assert env["PYTHONPATH"].startswith(str(__import__("emo.device.launcher").device.launcher.SITE_DIR))
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    a, b = res
    assert a.counters["sm_active_cycles"] == 400 and a.counters["dram_read_bytes"] == 3e6
    assert a.counters["active_warps"] == pytest.approx((100 * 50 + 300 * 10) / 400)  # cycle-weighted
    assert b.counters["sm_active_cycles"] == 10 and b.counters["fp64_inst"] != b.counters["fp64_inst"]
    assert (a.passes, a.cost_s, b.cost_s) == (3, pytest.approx(8 * 2 / 3), pytest.approx(8 / 3))
    with pytest.raises(ValueError, match="needs kernel ordinal 7"):
        dev.profile_ranges(wl, [KernelRange(0, (7,))])
    with pytest.raises(ValueError, match="rank 2 not in the command"):  # multi-rank: tests/test_nvml_profile_ranks.py
        dev.profile_ranges(CommandWorkload(command=["python", "t.py"], nproc=2), [KernelRange(2, (0,))])
    with pytest.raises(ValueError, match="'command' workloads only"):
        dev.profile_ranges({"kind": "tp"}, [])


def test_profile_window_brackets_exactly_one_iteration():
    from emo.capture import ProfileWindow

    log = []
    prof = SimpleNamespace(start=lambda: log.append(("start",)), stop=lambda: log.append(("stop",)))
    w = ProfileWindow(2, profiler=prof, sync=lambda: log.append(("sync",)))
    for i in range(5):
        log.append(("marker", i + 1))
        w.step()
    w.close()
    assert log == [
        ("marker", 1),
        ("marker", 2),
        ("sync",),
        ("start",),
        ("marker", 3),
        ("sync",),
        ("stop",),
        ("marker", 4),
        ("marker", 5),
    ]
    assert w.done
    log.clear()
    w = ProfileWindow(0, profiler=prof, sync=lambda: None)  # iteration 0 starts at once
    w.close()
    assert log == [("start",), ("stop",)]


def test_ncu_leaves_out_metrics_this_gpu_lacks(monkeypatch):
    nv.ncu_available_metrics.cache_clear()
    query = (
        "Device NVIDIA H200 (GH100)\n---------- ----\nMetric Name   Metric Description\n"
        "dram__bytes_read   # of bytes read from DRAM\nsm__cycles_active   # of cycles with at least one warp\n"
    )
    monkeypatch.setattr(nv.subprocess, "run", lambda cmd, **kw: types.SimpleNamespace(returncode=0, stdout=query))
    avail = nv.ncu_available_metrics("ncu-fake")
    assert avail == {"dram__bytes_read", "sm__cycles_active"}
    cmd = nv.ncu_command(["python", "x.py"], available=avail)
    assert cmd[cmd.index("--metrics") + 1] == "dram__bytes_read.sum,sm__cycles_active.sum"
    nv.ncu_available_metrics.cache_clear()
    monkeypatch.setattr(nv.subprocess, "run", lambda cmd, **kw: (_ for _ in ()).throw(FileNotFoundError(cmd[0])))
    assert nv.ncu_available_metrics("no-such-ncu") is None
    nv.ncu_available_metrics.cache_clear()
