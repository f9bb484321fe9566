"""EMO on a real GPU whose settings must not change: everything EMO does except lowering a clock.

    python benchmarks/gpu_check.py --observe OUT [--budget-s 420]

For a GPU that is lent or shared under rules that forbid changing clocks, power limits, persistence,
compute mode or MIG. Every NVML function that sets, resets or clears anything is refused in this
process and in the training program it starts (`guard_nvml`), and Nsight Compute runs with
`--clock-control none`. It measures, at the clock the GPU runs at:

  1. discovery: `emo gpu-config` from NVML, and the energy counter's update period and resolution
     (polled as fast as NVML answers over 2 s of back-to-back bf16 matrix products);
  2. microbenchmarks: every registry benchmark compiled by NVRTC for this GPU (sm_90 on Hopper),
     time and NVML energy per launch over >= 1 s, and Nsight Compute counters of one launch each,
     with the utilisation of the unit it claims to stress beside the busiest unit;
  3. a training step: a small GPT-style model (bf16, a side stream for host-to-device copies) traced
     with EMO's capture -> graph (critical path, replay error against the measured iteration time) ->
     packs -> Nsight Compute counters of each pack signature's first occurrence (every kernel of one
     iteration, autograd's thread included) -> the model's iteration time and energy at this clock
     from the microbenchmarks of section 2 -> against NVML energy over >= 5 s of untraced iterations,
     in which two runtime appliers run in record mode (the policy's requests timed as if issued, no
     NVML call made), one timed from the host's iteration marker, one from the GPU reaching it.
Each section says what it cost in seconds. Results go to OUT (8 files, flat): summary.json,
gpu.yaml, energy_counter.csv, microbench.csv, ncu_bench.txt, training.json, applier.csv, log.txt.

Exit status: 0 every section passed; 1 one failed; 77 no NVIDIA GPU here (nothing was run).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SKIPPED = 77
MIN_BENCH_S = 1.0  # per microbenchmark window: many energy-counter updates
ENERGY_PROBE_S = 2.0  # polling the energy counter while the GPU is busy
MEASURE_S = 5.0  # untraced training iterations whose NVML energy the prediction is compared with
UNTRACED_ITERATIONS = 10  # the loop measured without the profiler, as the trace stage does (trace.untraced_iterations)

# --------------------------------------------------------------------------- read-only NVML
# Anything that sets, resets or clears GPU state (clocks, power limits, persistence, compute mode,
# MIG, ECC, accounting, ...). Matching by name covers functions this file has never heard of.
PRIVILEGED = re.compile(r"^nvml\w*?(Set|Reset|Clear|Create|Destroy)(?![a-z])")


class ObserveViolation(RuntimeError):
    """Something asked NVML to change the GPU during an observe-only check."""


class ReadOnlyNvml(types.ModuleType):
    """pynvml with every privileged function replaced by one that raises ObserveViolation."""

    def __init__(self, real):
        super().__init__("pynvml")
        self._real = real
        self.refused: list[str] = []

    def __getattr__(self, name):
        if PRIVILEGED.match(name):

            def refuse(*args, **kwargs):
                self.refused.append(name)
                raise ObserveViolation(f"observe-only check: {name} refused (it would change the GPU)")

            return refuse
        return getattr(self._real, name)


def guard_nvml() -> ReadOnlyNvml:
    """Make `import pynvml` in this process return the read-only module (idempotent)."""
    cur = sys.modules.get("pynvml")
    if isinstance(cur, ReadOnlyNvml):
        return cur
    if cur is None:
        import pynvml as cur
    guarded = ReadOnlyNvml(cur)
    sys.modules["pynvml"] = guarded
    return guarded


# --------------------------------------------------------------------------- the runner
class Sections:
    """Runs named sections within a budget of seconds; one that fails is reported and the rest go on."""

    def __init__(self, budget_s: float, log):
        self.t0, self.budget_s, self.log = time.monotonic(), budget_s, log
        self.results: dict[str, dict] = {}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, name: str, fn, need_s: float = 0.0):
        if self.left() < need_s:
            return self.record(name, "SKIP", {"reason": f"budget: {self.left():.0f} s left, needs ~{need_s:.0f} s"})
        t = time.monotonic()
        try:
            out, status = fn() or {}, "PASS"
        except Exception as e:  # one broken section must not hide the others
            out, status = (
                {
                    "error": f"{type(e).__name__}: {e}",
                    "where": traceback.format_exc(limit=-3).strip().splitlines()[-4:],
                },
                "FAIL",
            )
        out = dict(out) if isinstance(out, dict) else {"value": out}
        out["cost_s"] = round(time.monotonic() - t, 1)
        return self.record(name, status, out)

    def record(self, name: str, status: str, out: dict) -> dict | None:
        self.results[name] = {"status": status, **out}
        self.log(f"\n[{status}] {name}")
        for k, v in out.items():
            if not k.startswith("_"):
                self.log(f"    {k}: {_short(v)}")
        return out if status == "PASS" else None


def _short(v, limit: int = 600) -> str:
    s = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return s if len(s) <= limit else s[:limit] + " ..."


# --------------------------------------------------------------------------- 1. discovery
def discovery(dev, out: Path) -> dict:
    from emo.device.nvml import discover_gpu_config, gpu_config_yaml
    from emo.sections import GpuConfig, typed

    cfg = discover_gpu_config(dev.nvml)
    (out / "gpu.yaml").write_text(gpu_config_yaml(typed(GpuConfig, cfg), cfg))
    nv, h = dev.nvml, dev._handles[0]
    lo, default, hi = dev.power_limits_w(0)
    return {
        "model": dev.model,
        "driver": dev.driver,
        "gpus": dev.device_count,
        "sm_clocks_mhz": f"{len(cfg['clocks_mhz'])} clocks, {cfg['clocks_mhz'][0]}-{cfg['clocks_mhz'][-1]}",
        "default_mhz": cfg["default_mhz"],
        "memory_mhz": cfg["memory_mhz"],
        "sm_clock_now_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        "power_limit_w": {"min": lo, "default": default, "max": hi},
    }


def energy_counter(dev, busy, out: Path, seconds: float | None = None) -> dict:
    """Poll the energy counter while `busy()` keeps the GPU working: how often it changes (update
    period) and by how little (resolution). `busy(seconds)` queues that much GPU work and returns a
    function that waits for it."""
    seconds = ENERGY_PROBE_S if seconds is None else seconds
    wait = busy(seconds + 0.5)
    samples = []
    t_end = time.perf_counter() + seconds
    while (t := time.perf_counter()) < t_end:
        samples.append((t, dev.energy_j(0)))
    wait()
    rows = energy_updates(samples)
    # the reads at which the value changed (and the one before each): every update, a small file
    keep = [i for i in range(1, len(samples)) if samples[i][1] != samples[i - 1][1]]
    rows_kept = sorted({j for i in keep for j in (i - 1, i)})
    (out / "energy_counter.csv").write_text(
        "t_s,energy_j\n" + "".join(f"{samples[i][0]:.6f},{samples[i][1]:.3f}\n" for i in rows_kept)
    )
    return rows


def energy_updates(samples: list[tuple[float, float]]) -> dict:
    """Update period (time between changes of the reading) and resolution (smallest change) of a
    polled counter; the first change is dropped (polling may start anywhere in a period)."""
    import numpy as np

    t = np.array([s[0] for s in samples])
    e = np.array([s[1] for s in samples])
    change = np.flatnonzero(np.diff(e) != 0) + 1
    if len(change) < 3:
        raise ValueError(
            f"the energy counter changed {len(change)} times in {len(samples)} reads over "
            f"{t[-1] - t[0]:.2f} s: no update period to measure"
        )
    period = np.diff(t[change])[1:] * 1e3
    step = np.diff(e[change])[1:] * 1e3
    return {
        "reads": len(samples),
        "read_cost_us": round(float(np.diff(t).mean()) * 1e6, 2),
        "updates": int(len(change)),
        "update_period_ms": {
            "p10": round(float(np.percentile(period, 10)), 3),
            "median": round(float(np.median(period)), 3),
            "p90": round(float(np.percentile(period, 90)), 3),
        },
        "smallest_step_mj": round(float(step[step > 0].min()), 3) if (step > 0).any() else None,
        "power_w": round(float((e[change[-1]] - e[change[0]]) / (t[change[-1]] - t[change[0]])), 1),
    }


def torch_busy(seconds: float):
    """Back-to-back bf16 matrix products for about `seconds` (timed first), queued at once."""
    import torch

    a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)  # ~10 ms a product: the queue never fills
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    n = max(1, int(seconds / ((time.perf_counter() - t) / 10)))
    done = torch.cuda.Event()
    for _ in range(n):
        a @ b
    done.record()
    return done.synchronize


# --------------------------------------------------------------------------- 2. microbenchmarks
# The unit each registry `stresses` claim names, as Nsight Compute's utilisation of that unit.
UNIT_METRICS = {
    "int32": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "fp32": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "fp64": "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active",
    "sfu": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "hmma": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "imma": "sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active",
    "shared": "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "l1": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "l2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
}
CONTEXT_METRICS = ("gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second")


def unit_of(claim: str) -> str:
    return "dram" if claim.startswith("dram") else claim


def sm_clock(dev) -> int:
    nv = dev.nvml
    return int(nv.nvmlDeviceGetClockInfo(dev._handles[0], nv.NVML_CLOCK_SM))


def measure_bench(dev, bench, min_seconds: float) -> dict:
    """Time and NVML energy per launch of a compiled microbenchmark at the clock the GPU runs at,
    over >= min_seconds; the SM clock is read while the launches run."""
    from emo.device.nvml import loops_for

    bench.run(3)  # warm: module loaded, clock settled
    per = bench.time_one()
    n = loops_for(per, min_seconds)
    e0, t0 = dev.energy_j(0), time.perf_counter()
    for _ in range(n):
        bench.launch()
    mhz = sm_clock(dev)
    bench.ctx.synchronize()
    t1, e1 = time.perf_counter(), dev.energy_j(0)
    return {
        "sm_mhz": mhz,
        "launches": n,
        "time_s": (t1 - t0) / n,
        "energy_j": (e1 - e0) / n,
        "power_w": (e1 - e0) / (t1 - t0),
    }


def microbenchmarks(dev, names: list[str], out: Path, ncu: str = "ncu") -> tuple[dict, object]:
    """(section result, calibration table at this clock: emo.model.bench.BENCH_COLUMNS)."""
    import pandas as pd

    from emo.device import COUNTERS, cuda_launch
    from emo.microbench import load_registry

    reg = load_registry()
    rows = []
    for name in names:
        t = time.perf_counter()
        b = cuda_launch.microbenchmark(name, 0)
        compiled = time.perf_counter() - t
        rows.append(
            {
                "bench": name,
                "stresses": reg[name]["stresses"][0],
                "compile_s": round(compiled, 2),
                **measure_bench(dev, b, MIN_BENCH_S),
                "cost_s": round(time.perf_counter() - t, 2),
            }
        )
    arch = "sm_{}{}".format(*b.ctx.cc)
    counters, note = bench_counters(names, ncu, out)
    table = pd.DataFrame(rows)
    for i, c in enumerate(counters):
        for k, v in c.items():
            table.loc[i, k] = v
    for _claim, metric in UNIT_METRICS.items():
        if metric not in table:
            table[metric] = float("nan")
    table["claimed_unit_pct"] = [
        row.get(UNIT_METRICS[unit_of(row["stresses"])], float("nan")) if row["stresses"] != "idle" else float("nan")
        for row in table.to_dict("records")
    ]
    util = table[[UNIT_METRICS[u] for u in UNIT_METRICS]]
    table["busiest_unit"] = [
        max(UNIT_METRICS, key=lambda u: -1 if math.isnan(r[UNIT_METRICS[u]]) else r[UNIT_METRICS[u]])
        if not util.iloc[i].isna().all()
        else ""
        for i, r in enumerate(table.to_dict("records"))
    ]
    table.to_csv(out / "microbench.csv", index=False)
    # the model's calibration at one clock: the clock the GPU ran most benchmarks at (each row keeps
    # the clock it was read at in microbench.csv)
    mhz = int(table["sm_mhz"].mode().iloc[0])
    cols = {c: table[c] if c in table else float("nan") for c in COUNTERS}
    bench = pd.DataFrame(
        {
            "bench": table["bench"],
            "sm_mhz": mhz,
            "repeat": 0,
            "time_s": table["time_s"],
            "energy_j": table["energy_j"],
            **cols,
        }
    )
    stressed = table[table["stresses"] != "idle"]
    agree = stressed.apply(lambda r: unit_of(r["stresses"]) == r["busiest_unit"], axis=1)
    res = {
        "arch": arch,
        "benchmarks": len(rows),
        "sm_mhz_seen": sorted(set(int(r["sm_mhz"]) for r in rows)),
        "counters": note,
        "busiest_unit_is_the_claimed_one": f"{int(agree.sum())} of {len(stressed)}",
        "per_benchmark": {
            r["bench"]: f"{r['time_s'] * 1e3:.3f} ms, {r['energy_j'] * 1e3:.1f} mJ, {r['power_w']:.0f} W, "
            f"{r['stresses']} {r['claimed_unit_pct']:.0f} % (busiest: {r['busiest_unit'] or '?'})"
            for r in table.to_dict("records")
        },
    }
    return res, bench


def bench_counters(names: list[str], ncu: str, out_dir: Path | None = None) -> tuple[list[dict], dict]:
    """One launch of each benchmark under Nsight Compute kernel replay (one ncu run for all):
    EMO's counter vector plus each unit's utilisation, per benchmark in `names` order."""
    from emo.device import nvml as nv

    argv = [sys.executable, "-m", "emo.device.cuda_launch", "--range", ",".join(names)]
    extra = (*UNIT_METRICS.values(), *CONTEXT_METRICS)
    available = nv.ncu_available_metrics(ncu)
    cmd = nv.ncu_command(argv, ncu=ncu, replay="kernel", extra=extra, available=available)
    text, cost = nv._run_ncu(cmd, dict(os.environ), timeout_s=600)
    raw = nv._ncu_results(text)
    if len(raw) != len(names):
        raise ValueError(f"ncu profiled {len(raw)} kernels, expected one per benchmark ({len(names)})")
    out = [{**nv.emo_counters(m), **{k: m.get(k, float("nan")) for k in extra}} for m in raw]
    asked = cmd[cmd.index("--metrics") + 1].split(",")
    missing = sorted(({m for ms in nv.NCU_METRICS.values() for m in ms} | set(extra)) - set(asked))
    if out_dir is not None:  # what ncu said, for the record (its progress lines, the first CSV rows)
        (out_dir / "ncu_bench.txt").write_text("\n".join(text.splitlines()[:120]) + "\n")
    return out, {
        "how": f"ncu kernel replay, {nv.parse_ncu_passes(text)} passes, {cost:.1f} s",
        "metrics_this_gpu_lacks": missing or "none",
    }


# --------------------------------------------------------------------------- 3. a training step
TRAIN = textwrap.dedent("""
    # A small GPT-style training loop for EMO's observe-only GPU check (benchmarks/gpu_observe.py).
    # Traced under emo.capture (iteration markers from the optimizer step), or, with EMO_CHECK_MEASURE,
    # run untraced for >= EMO_CHECK_SECONDS with NVML energy read around the iterations and the
    # runtime applier in record mode (its requests timed, no NVML call made).
    import json, math, os, sys, time
    sys.path.insert(0, os.environ["EMO_CHECK_BENCHMARKS"])
    import gpu_observe
    gpu_observe.guard_nvml()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        sys.exit("train_gpt: no CUDA device")
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    vocab, d, heads, layers, seq, batch = 8192, 1024, 16, 4, 1024, 8

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    model = GPT().to(dev, dt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    copy = torch.cuda.Stream()  # host-to-device copies of the next batch on a side stream
    host = [torch.randint(0, vocab, (batch, seq + 1)).pin_memory() for _ in range(2)]

    def fetch(i):
        with torch.cuda.stream(copy):
            return host[i % 2].to(dev, non_blocking=True)

    def iteration(i, nxt):
        torch.cuda.current_stream().wait_stream(copy)
        cur, nxt = nxt, fetch(i + 1)
        logits = model(cur[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), cur[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 10 == 9:
            loss.item()  # a host sync now and then, as real loops log
        return nxt

    nxt = fetch(0)
    measure = os.environ.get("EMO_CHECK_MEASURE")
    if not measure:
        for i in range(int(os.environ.get("EMO_CHECK_ITERATIONS", "20"))):
            nxt = iteration(i, nxt)
        torch.cuda.synchronize()
        sys.exit(0)

    from emo.device.nvml import NvmlDevice
    from emo.policy import FrequencyPolicy
    from emo.runtime import PolicyApplier

    class Record:  # the applier's setter in record mode: no NVML call, only the time of each request
        def set_clock(self, device, mhz):
            pass
        def reset_clock(self, device):
            pass

    nvml = NvmlDevice({"name": "gpu"})
    for i in range(10):
        nxt = iteration(i, nxt)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(10, 20):
        nxt = iteration(i, nxt)
    torch.cuda.synchronize()
    per_s = (time.perf_counter() - t) / 10
    n = math.ceil(float(os.environ.get("EMO_CHECK_SECONDS", "5")) / per_s)
    policy = FrequencyPolicy.load(os.environ["EMO_CHECK_POLICY"])
    if os.environ.get("EMO_CHECK_UNTRACED_PERIOD"):  # re-plan the same steps on this loop's own period
        k = per_s * 1e3 / policy.period_ms
        policy.steps = {d: [type(st)(st.t_ms * k, st.sm_mhz) for st in ss] for d, ss in policy.steps.items()}
        policy.period_ms *= k
    # two appliers in record mode: one timed from the host's marker, one from the GPU reaching it
    on_host, on_gpu = PolicyApplier(policy, Record()), PolicyApplier(policy, Record())
    e0, t0 = nvml.energy_j(0), time.perf_counter()
    for i in range(20, 20 + n):
        on_host.step()
        mark = torch.cuda.Event()
        mark.record()
        on_gpu.step(ready=mark.synchronize)
        nxt = iteration(i, nxt)
    torch.cuda.synchronize()
    t1, e1 = time.perf_counter(), nvml.energy_j(0)
    time.sleep(0.1)  # the last GPU-aligned marker's requests
    on_host.close()
    on_gpu.close()
    with open(measure, "w") as f:
        json.dump({"iterations": n, "time_s": t1 - t0, "energy_j": e1 - e0, "policy": policy.to_dict(),
                   "appliers": {k: {"marks": a.marks, "requests": [[t, d, m] for t, d, m in a.log],
                                    "errors": [str(e) for e in a.errors], "lead_ms": a.lead_ms}
                                for k, a in (("host", on_host), ("gpu", on_gpu))}}, f)
""")


def record_policy(gpu: str, clocks: list[int], period_ms: float, lead_ms: float = 5.0):
    """A policy for the applier's record mode: down to a middle clock at 30 % of the iteration and back
    up at 70 % (two requests per iteration). It is never applied: only its timing is."""
    from emo.policy import FrequencyPolicy, Step

    hi, mid = clocks[-1], clocks[len(clocks) // 2]
    steps = [Step(0.0, hi), Step(0.3 * period_ms, mid), Step(0.7 * period_ms, hi)]
    return FrequencyPolicy(
        gpu=gpu,
        steps={0: steps},
        period_ms=period_ms,
        lead_ms=lead_ms,
        meta={"purpose": "record mode of the observe-only check; never applied"},
    )


def issue_jitter(policy, marks: list[float], requests: list) -> list[dict]:
    """Per request the applier made: its planned issue time (the iteration marker plus the issue
    plan's offset) and the actual one. Each request is matched to the nearest planned issue of the
    same clock; the very first (at the first marker) is the starting clock."""
    from emo.policy import issue_plan

    if not marks:
        return []
    plan = issue_plan(policy.steps[0], lead_ms=policy.lead_ms, period_ms=policy.period_ms)
    first = sorted(policy.steps[0], key=lambda st: st.t_ms)[0].sm_mhz
    planned = sorted([(marks[0], first)] + [(m + i.at_s, i.sm_mhz) for m in marks for i in plan])
    rows = []
    for t, _, mhz in requests:
        cands = [p for p, c in planned if c == mhz]
        if not cands:
            continue
        p = min(cands, key=lambda x: abs(x - t))
        rows.append({"planned_s": p - marks[0], "actual_s": t - marks[0], "late_ms": (t - p) * 1e3, "sm_mhz": mhz})
    return rows


def analyze_training(dev, wl, bench, work: Path, *, default_mhz: int, delta_max_ms: float = 5.0) -> dict:
    """Trace `wl` on `dev` -> graph -> packs -> counters of each signature's first occurrence ->
    the model's iteration time and energy at `default_mhz` from `bench` (one clock). Uses the
    pipeline stages' own functions; works on any device of the protocol (tested on the virtual GPU)."""
    import numpy as np
    import pandas as pd

    from emo.graph import Graph
    from emo.model.levels import fit_time
    from emo.model.predict import pack_tables, predict
    from emo.model.profiling import profile_first_occurrences
    from emo.stages import graph as graph_stage
    from emo.stages import pack as pack_stage
    from emo.trace import read_trace

    cost = {}
    t = time.monotonic()
    trace_dir = work / "trace"
    res = dev.run(wl, int(_get(wl, "active", 3) or 3), warmup=1, trace_dir=trace_dir)
    events = read_trace(trace_dir)
    events.to_parquet(work / "events.parquet")
    # the same loop untraced, as the trace stage measures it: what the graph is corrected to
    plain = dev.run(wl, UNTRACED_ITERATIONS, warmup=1)
    (work / "measured.json").write_text(
        json.dumps(
            {
                "iteration_times_s": res.iteration_times_s,
                "untraced": {"iterations": plain.iterations, "iteration_times_s": plain.iteration_times_s},
            }
        )
    )
    cost["trace_s"] = time.monotonic() - t
    t = time.monotonic()
    gdir, pdir = work / "graph", work / "pack"
    gdir.mkdir(exist_ok=True)
    pdir.mkdir(exist_ok=True)
    graph_stage.run({}, {"events": work / "events.parquet", "measured": work / "measured.json"}, gdir)
    summary = json.loads((gdir / "summary.json").read_text())
    pack_stage.run(
        {"packing": {"delta_max_ms": delta_max_ms}},
        {"nodes": gdir / "nodes.parquet", "iterations": gdir / "iterations.parquet"},
        pdir,
    )
    packs = pd.read_parquet(pdir / "packs.parquet")
    anchors = pd.read_parquet(pdir / "iterations.parquet")
    graph = Graph.load(gdir)
    cost["graph_pack_s"] = time.monotonic() - t
    t = time.monotonic()
    metrics = profile_first_occurrences(dev, wl, packs, events, graph.nodes)
    cost["profile_s"] = time.monotonic() - t
    t = time.monotonic()
    model = fit_time(bench, metrics, packs, default_mhz, [default_mhz])
    tables = pack_tables(Graph.load(pdir), packs, model, anchors)
    pred = predict(tables)
    cost["fit_predict_s"] = time.monotonic() - t
    measured = np.asarray(res.iteration_times_s, float)
    k = events[events["kind"] == "kernel"] if "kind" in events else events.iloc[:0]
    busy_ms = float(k["dur_ns"].sum()) * 1e-6 / max(len(measured), 1)
    traced_j = res.energy_j / res.iterations if res.iterations and res.energy_j == res.energy_j else None
    iters = max(int(anchors.groupby("rank").size().max()) if len(anchors) else 1, 1)
    cp_s = summary["critical_path_us"] * 1e-6 / iters
    kernels = int((events["kind"] == "kernel").sum()) if "kind" in events else 0
    untraced = np.asarray(plain.iteration_times_s, float)
    return {
        "untraced_iteration_ms": round(float(untraced.mean()) * 1e3, 3),
        "untraced_iteration_sd_ms": round(float(untraced.std()) * 1e3, 3),
        "untraced_correction": summary["untraced"],
        "time_vs_untraced_pct": round((pred.time_s / float(untraced.mean()) - 1) * 100, 2),
        "traced_iterations": len(measured),
        "measured_iteration_ms": round(float(measured.mean()) * 1e3, 3),
        "measured_iteration_sd_ms": round(float(measured.std()) * 1e3, 3),
        "kernels_traced": kernels,
        "kernel_busy_ms_per_iteration": round(busy_ms, 3),
        "traced_iteration_energy_j": None if traced_j is None else round(traced_j, 4),
        "energy_vs_traced_window_pct": None if not traced_j else round((pred.energy_j / traced_j - 1) * 100, 2),
        "time_vs_traced_window_pct": round((pred.time_s / float(measured.mean()) - 1) * 100, 2),
        "graph_nodes": summary["nodes"],
        "graph_edges": summary["edges"],
        "critical_path_ms_per_iteration": round(cp_s * 1e3, 3),
        "critical_path_vs_measured_pct": round((cp_s / float(measured.mean()) - 1) * 100, 2),
        "replay_error_us": summary["replay_error_us"],
        "breakdown_us": summary["breakdown_us"],
        "slack_us": summary["slack_us"],
        "packs": len(packs),
        "signatures": int(packs["signature"].nunique()),
        "profiled_signatures": int(len(metrics)),
        "counter_source": sorted(set(metrics["source"])),
        "kernels_profiled": int(metrics["kernels"].sum()),
        "profile_passes": int(metrics["passes"].max()) if len(metrics) else 0,
        "predicted_iteration_ms": round(pred.time_s * 1e3, 3),
        "predicted_iteration_energy_j": round(pred.energy_j, 4),
        "predicted_idle_energy_j": round(pred.idle_energy_j / max(pred.iterations, 1), 4),
        "fit_residual_max": float(model["fit_residual"].max()),
        "cost_s": {k: round(v, 1) for k, v in cost.items()},
    }


def _get(wl, key, default=None):
    return wl.get(key, default) if isinstance(wl, dict) else getattr(wl, key, default)


def training(dev, bench, out: Path, work: Path, log, ncu_timeout_s: float = 240) -> dict:
    """Section 3 on the NVML device: the GPT loop traced, analysed, predicted, then measured."""
    from emo.device import nvml as nv

    run_ncu = nv._run_ncu
    nv._run_ncu = lambda cmd, env, timeout_s=0: run_ncu(cmd, env, ncu_timeout_s)  # the check has a budget
    script = work / "train_gpt.py"
    script.write_text(TRAIN)
    os.environ["EMO_CHECK_BENCHMARKS"] = str(Path(__file__).resolve().parent)
    os.environ["EMO_CHECK_ITERATIONS"] = "20"
    wl = {
        "kind": "command",
        "command": [sys.executable, str(script)],
        "nproc": 1,
        "wait": 5,
        "warmup": 2,
        "active": 12,
    }  # a plain dict: emo.config (OmegaConf) is not on the GPU box
    mhz = int(bench["sm_mhz"].median())
    try:
        res = analyze_training(dev, wl, bench, work, default_mhz=mhz)
    finally:
        nv._run_ncu = run_ncu
    log(f"    (traced and predicted: {_short(res, 300)})")
    t = time.monotonic()
    policy = record_policy(dev.name, dev.supported_clocks(), res["measured_iteration_ms"])
    policy.save(work / "record_policy.json")
    env = dict(
        os.environ,
        EMO_CHECK_MEASURE=str(work / "measure.json"),
        EMO_CHECK_SECONDS=str(MEASURE_S),
        EMO_CHECK_POLICY=str(work / "record_policy.json"),
        EMO_CHECK_UNTRACED_PERIOD="1",
    )
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"measured run exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    m = json.loads((work / "measure.json").read_text())
    it_s, it_j = m["time_s"] / m["iterations"], m["energy_j"] / m["iterations"]
    from emo.policy import FrequencyPolicy

    policy = FrequencyPolicy.from_dict(m["policy"])  # as the loop re-planned it on its own period
    res["record_policy_period_ms"] = round(policy.period_ms, 3)
    rows = []
    for kind, a in m["appliers"].items():
        j = issue_jitter(policy, a["marks"], a["requests"])
        rows += [{"marker": kind, **r} for r in j]
        res[f"applier_record_mode_{kind}_marker"] = jitter_summary(j, a, planned=2 * m["iterations"])
    (out / "applier.csv").write_text(
        "marker,planned_s,actual_s,late_ms,sm_mhz\n"
        + "".join(
            f"{r['marker']},{r['planned_s']:.6f},{r['actual_s']:.6f},{r['late_ms']:.4f},{r['sm_mhz']}\n" for r in rows
        )
    )
    res["cost_s"]["measure_s"] = round(time.monotonic() - t, 1)
    res.update(measured_window(it_s, it_j, m, res))
    (out / "training.json").write_text(json.dumps(res, indent=2, default=str))
    return res


def measured_window(it_s: float, it_j: float, m: dict, res: dict) -> dict:
    return {
        "untraced_iterations": m["iterations"],
        "untraced_seconds": round(m["time_s"], 2),
        "untraced_iteration_ms": round(it_s * 1e3, 3),
        "untraced_iteration_energy_j": round(it_j, 4),
        "untraced_power_w": round(m["energy_j"] / m["time_s"], 1),
        "time_prediction_error_pct": round((res["predicted_iteration_ms"] / (it_s * 1e3) - 1) * 100, 2),
        "energy_prediction_error_pct": round((res["predicted_iteration_energy_j"] / it_j - 1) * 100, 2),
    }


def jitter_summary(rows: list[dict], a: dict, planned: int | None = None) -> dict:
    """How many requests one record-mode applier made (of `planned`) and how late they were issued."""
    import numpy as np

    late = np.array([r["late_ms"] for r in rows]) if rows else np.zeros(0)
    return {
        "requests": len(a["requests"]),
        "planned": planned,
        "matched": len(rows),
        "errors": a["errors"],
        "late_ms": {
            "p50": round(float(np.percentile(late, 50)), 4),
            "p90": round(float(np.percentile(late, 90)), 4),
            "p99": round(float(np.percentile(late, 99)), 4),
            "max": round(float(late.max()), 4),
        }
        if len(late)
        else None,
        "lead_ms": a["lead_ms"],
    }


# --------------------------------------------------------------------------- main
def gpu_present() -> str | None:
    """None when an NVIDIA GPU answers through NVML, else why not."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as e:
        return f"NVML: {e}"
    return None if n > 0 else "NVML reports 0 GPUs"


def main(
    out: str, budget_s: float = 420.0, *, busy=torch_busy, names: list[str] | None = None, ncu: str = "ncu"
) -> int:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    guarded = guard_nvml()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    logf = open(out_dir / "log.txt", "w")

    def log(line: str) -> None:
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    why = gpu_present()
    if why is not None:
        log(f"gpu_check --observe: no NVIDIA GPU to observe ({why}); nothing was run. Exit status {SKIPPED} = skipped.")
        return SKIPPED
    from emo.device.nvml import NvmlDevice
    from emo.microbench import benchmark_names

    s = Sections(budget_s, log)
    work = Path(tempfile.mkdtemp(prefix="emo-observe-"))
    dev = NvmlDevice({"name": "auto", "backend": "nvml"})
    try:
        s.run("1a. discovery (emo gpu-config)", lambda: discovery(dev, out_dir))
        s.run("1b. NVML energy counter", lambda: energy_counter(dev, busy, out_dir), need_s=5)
        box = {}

        def bench():
            res, box["bench"] = microbenchmarks(dev, names or benchmark_names(), out_dir, ncu)
            return res

        s.run("2. microbenchmarks at the current clock", bench, need_s=60)
        if "bench" in box:
            s.run(
                "3. GPT training step: trace, graph, packs, counters, prediction vs NVML",
                lambda: training(dev, box["bench"], out_dir, work, log),
                need_s=120,
            )
        else:
            s.record(
                "3. GPT training step: trace, graph, packs, counters, prediction vs NVML",
                "SKIP",
                {"reason": "no microbenchmark table (section 2 did not pass)"},
            )
    finally:
        dev.close()
        shutil.rmtree(work, ignore_errors=True)  # the traces and the GPT script: what matters is in OUT
    s.results["observe_only"] = {"privileged_nvml_calls_refused": list(guarded.refused), "ncu_clock_control": "none"}
    (out_dir / "summary.json").write_text(json.dumps(s.results, indent=2, default=str))
    failed = [k for k, v in s.results.items() if v.get("status") == "FAIL"]
    log(
        f"\ngpu_check --observe: {len(s.results) - 1 - len(failed)} of {len(s.results) - 1} sections passed or "
        f"skipped{'; FAILED: ' + ', '.join(failed) if failed else ''}; {len(guarded.refused)} privileged NVML "
        f"calls refused ({time.monotonic() - s.t0:.0f} s); results in {out_dir}"
    )
    logf.close()
    return 1 if failed or guarded.refused else 0
