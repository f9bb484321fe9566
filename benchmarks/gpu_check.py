"""Check EMO's real-GPU path on this machine, end to end, in under 8 minutes; print what it measured.

    python benchmarks/gpu_check.py [--json out.json] [--budget-s 480] [--skip-pipeline]
    python benchmarks/gpu_check.py --observe OUT [--budget-s 420]

--observe: the observe-only check (benchmarks/gpu_observe.py), for a GPU whose clocks, power limits,
persistence, compute mode and MIG must not change: it never locks a clock, and refuses every NVML
call that would change the GPU. Without it, sections 2, 3 and 6 below lock SM clocks.

Sections (each PASS / FAIL / SKIP with its numbers):
  1. NVML reads: model, driver, supported SM clocks, power limits, energy counter (idle power)
  2. locked clocks: can this user set them (root or zeusd), and does the GPU follow
  3. microbenchmarks: time and energy per launch at three clocks (NVRTC-compiled, >= 1 s windows)
  4. CUPTI tracer and Nsight Compute range replay (when installed), with overhead
  5. a small PyTorch training loop traced with emo.capture (torch.profiler, cuda_sync events)
  6. the pipeline on that loop (trace -> graph -> pack -> fit -> optimize -> validate: the stages
     this checkout has), then measured vs predicted time and energy of a static and an EMO policy

Exit status: 0 all checks that ran passed; 1 a check failed; 77 no NVIDIA GPU or driver here (nothing
was checked; 77 is the conventional "skipped" status of test harnesses).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = (
    "gpu-check",
    "gpu-check-observe",
)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_observe import gpu_present  # noqa: E402  (one check for both modes)

from emo import benchreport  # noqa: E402

SKIPPED = 77

TRAIN = textwrap.dedent("""
    # A small transformer-style training loop: bf16 GEMMs of a few ms, an all-GPU step.
    import sys, torch
    torch.manual_seed(0)
    dev = "cuda"
    d, layers, batch = 2048, 4, 8192
    blocks = [torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
              for _ in range(layers)]
    model = torch.nn.Sequential(*blocks).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, d, device=dev, dtype=torch.bfloat16)
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 10 == 9:
            loss.item()  # a host sync now and then, as real loops log
""")


class Check:
    def __init__(self, budget_s: float):
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.results: dict[str, dict] = {}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, name: str, fn, *, need_s: float = 0.0) -> dict | None:
        if self.left() < need_s:
            self._record(name, "SKIP", {"reason": f"time budget: {self.left():.0f} s left, needs ~{need_s:.0f} s"})
            return None
        t = time.monotonic()
        try:
            out = fn() or {}
            status = out.pop("_status", "PASS")
        except Exception as e:  # report and go on: one broken part must not hide the others
            out, status = (
                {
                    "error": f"{type(e).__name__}: {e}",
                    "where": traceback.format_exc(limit=-2).strip().splitlines()[-3:],
                },
                "FAIL",
            )
        out["seconds"] = round(time.monotonic() - t, 1)
        self._record(name, status, out)
        return out if status == "PASS" else None

    def _record(self, name, status, out):
        self.results[name] = {"status": status, **out}
        print(f"\n[{status}] {name}")
        for k, v in out.items():
            print(f"    {k}: {v}")
        sys.stdout.flush()


# --------------------------------------------------------------------------- sections
def nvml_reads(dev) -> dict:
    import pynvml

    h = dev._handles[0]
    clocks = dev.supported_clocks()
    lo, default, hi = dev.power_limits_w(0)
    e0, t0 = dev.energy_j(0), time.perf_counter()
    time.sleep(1.0)
    e1, t1 = dev.energy_j(0), time.perf_counter()
    return {
        "model": dev.model,
        "gpus": dev.device_count,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "sm_clocks_mhz": f"{len(clocks)} clocks, {clocks[0]}-{clocks[-1]}",
        "sm_clock_now_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "power_limit_w": f"min {lo:g}, default {default:g}, max {hi:g}",
        "idle_power_w": round((e1 - e0) / (t1 - t0), 1),
        "energy_counter_j": round(e1, 1),
    }


def locked_clocks(dev) -> dict:
    import pynvml

    clocks = dev.supported_clocks()
    target = clocks[len(clocks) // 2]
    dev.lock_clock(0, target)
    time.sleep(0.2)
    seen = pynvml.nvmlDeviceGetClockInfo(dev._handles[0], pynvml.NVML_CLOCK_SM)
    dev.set_policy(None)
    time.sleep(0.2)
    after = pynvml.nvmlDeviceGetClockInfo(dev._handles[0], pynvml.NVML_CLOCK_SM)
    return {
        "via": dev.controller.via,
        "locked_mhz": target,
        "sm_clock_while_locked": seen,
        "sm_clock_after_reset": after,
        "_status": "PASS" if abs(seen - target) <= 30 else "FAIL",
    }


def three_clocks(dev) -> list[int]:
    c = dev.supported_clocks()
    return [c[len(c) // 3], c[(2 * len(c)) // 3], c[-1]]


def microbenchmarks(dev, names: list[str]) -> dict:
    out = {}
    for name in names:
        for mhz in three_clocks(dev):
            m = dev.run_microbenchmark(name, mhz, min_seconds=1.0)
            out[f"{name}@{mhz}"] = (
                f"{m.time_s * 1e3:.3f} ms, {m.energy_j:.4f} J, {m.energy_j / m.time_s:.0f} W per launch"
            )
    dev.set_policy(None)
    return out


def cupti_and_ncu(dev) -> dict:
    out = {}
    from emo.device import cuda_launch
    from emo.trace import read_trace
    from emo.trace.cupti import CuptiTracer

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cupti.json.gz"
        bench = cuda_launch.microbenchmark("fp32_fma_high", 0)
        t_plain = time.perf_counter()
        bench.run(20)
        t_plain = time.perf_counter() - t_plain
        with CuptiTracer(path) as tr:
            t_traced = time.perf_counter()
            for _ in range(5):
                bench.run(4)
                tr.step()
            t_traced = time.perf_counter() - t_traced
        ev = read_trace(path)
        out["cupti_kernels_read"] = int((ev["kind"] == "kernel").sum())
        out["cupti_tracing_overhead"] = f"{(t_traced / t_plain - 1) * 100:+.1f} %"
        out["_status"] = "PASS" if out["cupti_kernels_read"] == 20 else "FAIL"
    if shutil.which("ncu"):
        r = dev.profile_range(["fp32_fma_high", "dram_read_high"])
        out["ncu_range_counters"] = {k: v for k, v in r.counters.items() if v == v}
        out["ncu_passes"] = r.passes
        out["ncu_cost_s"] = round(r.cost_s, 2)
    else:
        out["ncu"] = "not on PATH: pack profiling on hardware not checked"
    return out


def traced_training_loop(dev, workdir: Path) -> dict:
    from emo.trace import read_trace
    from emo.workloads.command import CommandWorkload

    script = workdir / "train.py"
    script.write_text(TRAIN)
    wl = CommandWorkload(command=[sys.executable, str(script), "20"], wait=5, warmup=2, active=3)
    res = dev.run(wl, 3, warmup=2, trace_dir=workdir / "capture")
    ev = read_trace(workdir / "capture")
    sync = int(ev["kind"].astype(str).str.contains("sync").sum()) if "kind" in ev else 0
    return {
        "trace_files": [p.name for p in res.trace_files],
        "iterations": res.iterations,
        "iteration_ms": [round(t * 1e3, 2) for t in res.iteration_times_s],
        "energy_j": round(res.energy_j, 2),
        "power_w": round(res.energy_j / res.time_s, 1),
        "events": len(ev),
        "kernels": int((ev["kind"] == "kernel").sum()),
        "sync_events": sync,
    }


def _gpu_overrides(dev, script: Path, results: Path) -> list[str]:
    clocks = dev.supported_clocks()
    stride = max(1, math.ceil(len(clocks) / 6))  # calibrate ~6 clocks: the check must fit its budget
    _, default_w, _ = dev.power_limits_w(0)
    wl = "command" if (ROOT / "conf/workload/command.yaml").exists() else "command_schema"
    return [
        "gpu=h100",
        "gpu.backend=nvml",
        f"gpu.name={dev.model.split()[-1].lower()}",
        f"gpu.clocks_mhz=[{','.join(map(str, clocks))}]",
        f"gpu.default_mhz={clocks[-1]}",
        f"gpu.tdp_w={default_w:g}",
        f"workload={wl}",
        f"workload.command=[{sys.executable},{script}]",
        "workload.wait=5",
        "workload.warmup=2",
        "workload.active=3",
        f"model.clocks_stride={stride}",
        "model.min_seconds=1.0",
        "model.repeats=1",
        f"results={results}",
        "tracking.enabled=false",
    ]


def pipeline(dev, workdir: Path, check: Check) -> dict:
    from emo.workflow import plan
    from emo.workflow import run as emo_run

    order = ["trace", "graph", "pack", "profile", "fit", "optimize", "validate"]
    have = [s for s in order if s in plan.STAGES]
    missing = [s for s in order if s not in plan.STAGES]
    if not have:
        return {"_status": "SKIP", "reason": "this checkout has no pipeline stages yet"}
    script = workdir / "train.py"
    script.write_text(TRAIN.replace("else 30", "else 40"))
    results = workdir / "results"
    out = {"stages_run": have, "stages_absent": missing or "none"}
    optimizers = [o for o in ("static", "emo") if (ROOT / f"conf/optimizer/{o}.yaml").exists()]
    for opt in optimizers if "optimize" in have and optimizers else [None]:
        ov = _gpu_overrides(dev, script, results)
        if opt:
            ov.append(f"optimizer={opt}")
        error = emo_run.snakemake([ov], os.cpu_count() or 1, until=have[-1])  # None: it succeeded
        ok = error is None
        out[f"pipeline[{opt or 'default'}]"] = "ok" if ok else f"failed: {error}"
        if not ok:
            out["_status"] = "FAIL"
            return out
    for stage in have:
        for m in sorted((results / stage).glob("*/metrics.json")):
            out[f"{stage}/{m.parent.name}"] = json.loads(m.read_text())
    policies = sorted(results.glob("optimize/*/policy.json"))
    if policies:
        out.update(measure_policies(dev, policies, script, check))
    else:
        out["measured_vs_predicted"] = "no policy.json produced (optimize stage absent)"
    return out


def measure_policies(dev, policies: list[Path], script: Path, check: Check) -> dict:
    """Run the loop under each policy on the GPU; compare to the policy's predicted time and energy."""
    from emo.policy import FrequencyPolicy
    from emo.workloads.command import CommandWorkload

    wl = CommandWorkload(command=[sys.executable, str(script), "20"], wait=5, warmup=2, active=5)
    out = {}
    dev.set_policy(None)
    base = dev.run(wl, 5, warmup=2)
    out["measured[max clock]"] = (
        f"{base.time_s / base.iterations * 1e3:.2f} ms/iter, {base.energy_j / base.iterations:.2f} J/iter"
    )
    for p in policies:
        if check.left() < 40:
            out[f"measured[{p.parent.name}]"] = "skipped: time budget"
            continue
        pol = FrequencyPolicy.load(p)
        name = pol.meta.get("optimizer", p.parent.name)
        dev.set_policy(pol)
        r = dev.run(wl, 5, warmup=2)
        dev.set_policy(None)
        t_it, e_it = r.time_s / r.iterations, r.energy_j / r.iterations
        pt = pol.predicted_time_s
        pe = pol.predicted_energy_j
        out[f"measured[{name}]"] = (
            f"{t_it * 1e3:.2f} ms/iter ({(t_it / (base.time_s / base.iterations) - 1) * 100:+.1f} % time), "
            f"{e_it:.2f} J/iter ({(1 - e_it / (base.energy_j / base.iterations)) * 100:.1f} % energy saved)"
        )
        if pt and pe:
            out[f"predicted[{name}]"] = (
                f"{pt * 1e3:.2f} ms/iter (error {(pt / t_it - 1) * 100:+.1f} %), "
                f"{pe:.2f} J/iter (error {(pe / e_it - 1) * 100:+.1f} %)"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting sections after this")
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument("--observe", metavar="OUT", help="observe only (never change the GPU); results in folder OUT")
    args = ap.parse_args(argv)
    if args.observe:
        import gpu_observe

        return gpu_observe.main(args.observe, args.budget_s)

    why = gpu_present()
    if why is not None:
        print(f"gpu_check: no NVIDIA GPU to check ({why}); nothing was run. Exit status {SKIPPED} = skipped.")
        return SKIPPED

    from emo.device.nvml import NvmlDevice

    check = Check(args.budget_s)
    workdir = Path(tempfile.mkdtemp(prefix="emo-gpu-check-"))
    dev = NvmlDevice({"name": "gpu", "backend": "nvml"})
    try:
        check.run("1. NVML reads", lambda: nvml_reads(dev))
        can_lock = check.run("2. locked SM clocks", lambda: locked_clocks(dev)) is not None
        if can_lock:
            check.run(
                "3. microbenchmarks at three clocks",
                lambda: microbenchmarks(dev, ["fp32_fma_high", "dram_read_high"]),
                need_s=30,
            )
        else:
            check._record("3. microbenchmarks at three clocks", "SKIP", {"reason": "clocks cannot be locked"})
        check.run("4. CUPTI tracer / ncu range replay", lambda: cupti_and_ncu(dev), need_s=20)
        check.run("5. traced PyTorch training loop", lambda: traced_training_loop(dev, workdir), need_s=40)
        if args.skip_pipeline or not can_lock:
            check._record(
                "6. pipeline and policies",
                "SKIP",
                {"reason": "--skip-pipeline" if args.skip_pipeline else "clocks cannot be locked"},
            )
        else:
            check.run("6. pipeline and policies", lambda: pipeline(dev, workdir, check), need_s=90)
    finally:
        dev.close()
    if args.json:
        Path(args.json).write_text(json.dumps(check.results, indent=2, default=str))
    failed = [k for k, v in check.results.items() if v["status"] == "FAIL"]
    print(
        f"\ngpu_check: {len(check.results) - len(failed)} of {len(check.results)} sections passed or skipped"
        f"{'; FAILED: ' + ', '.join(failed) if failed else ''} ({time.monotonic() - check.t0:.0f} s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    with benchreport.recording(lambda argv: "gpu-check-observe" if "--observe" in argv else "gpu-check"):
        sys.exit(main())
