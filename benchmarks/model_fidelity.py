"""Fidelity of EMO's energy-latency model on the virtual GPU, and the packing/sampling ablation.

For each GPU model (a100, h100, rtx3080ti) and workload (tp 2/4/8, pp 2/4/8, offload) it runs the
pipeline stages in-process (trace, graph, pack, profile, fit; calibrate once per GPU), then
predicts with emo.model.predict and measures on the virtual GPU:
  (a) static policies at every supported clock >= half the max;
  (b) five random policies that change every GPU's clock every 20 ms between half and full clock.
Measured = the virtual GPU's exact energy and time over the measured iterations (its true energy
integral, so the energy counter's 100 ms granularity is not counted as model error). Prints the
MAPE of time and energy per case, the worst case, and the ablation: kernels, packs, distinct
signatures, and profiling cost for raw per-kernel profiling, packing alone and packing with
sampling (first occurrence of each signature only).

Per pack, beside the end-to-end error: for every distinct signature, the model's time and energy
(idle power over its time plus its dynamic energy) relative to the default clock (the measured
anchor at f0 cancels) against the virtual GPU's own kernels of that pack run alone at each static
clock (the simulator's physics tables: no noise, no contention), MAPE and max over signatures x
clocks (`pack T%`, `pack E%`). A per-pack error near 0 would mean the model mirrors
the simulator; microbenchmark-mix models err by ~5-10 % per kernel across clocks on hardware.
`given the true time`: the same per-pack energy error with the model's time replaced by the virtual
GPU's (idle power x true time + the model's dynamic energy): the power law's error alone.

    python benchmarks/model_fidelity.py [--quick] [--gpus a100,h100] [--jobs 2]
                                        [--counters ncu|dcgm] [--clocks-stride N]

--counters dcgm: the virtual GPU answers the profiler in DCGM form (7 activity ratios per range:
SM active, occupancy, tensor/FP64/FP32/FP16 pipes, DRAM) instead of ncu totals; --clocks-stride N:
calibrate every N-th clock only, the fit interpolating the rest (model.clocks_stride).

The shipped optimizer's own plans (`--budgets`, default 0 and 0.02: optimizer=emo, the optimize
stage in-process on the same fit): each plan's predicted ES / PL (its policy's prediction, in
expectation over the measured clock-request latencies, against the predicted max-clock baseline)
against the measured ones (the max clock before and after the plan and the plan, each over the
same iterations, exact energy). Static and random policies cannot show a bias the optimizer selects for: a plan is chosen
for its low predicted energy, so it sits where the model errs in its favour, if anywhere. Over every
clock-changing plan (one that runs some GPU below the max clock): the mean |predicted - measured
ES| and the mean signed error (its bias, positive = the saving was predicted too large), and the
worst plan.

Last lines: `per-pack MAPE %: T (time) E (energy); max T / E` (the worst single pack x clock beside
the means), `worst MAPE %: X` and `optimized plans: mean |dES| X points, bias Y points over N
clock-changing plans`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from emo import benchreport

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = (
    "model-fidelity",
    "model-fidelity-quick",
)
WORKLOADS = {
    "tp2": ["workload=tp", "workload.tp=2"],
    "tp4": ["workload=tp", "workload.tp=4"],
    "tp8": ["workload=tp", "workload.tp=8"],
    "pp2": ["workload=pp", "workload.pp=2"],
    "pp4": ["workload=pp", "workload.pp=4"],
    "pp8": ["workload=pp", "workload.pp=8"],
    "offload": ["workload=offload"],
}
GPUS = ("a100", "h100", "rtx3080ti")


def stage(name, cfg, inputs, out: Path) -> dict:
    from emo.stages import run_in_place

    return run_in_place(name, cfg, inputs, out)


def calibrate(gpu: str, root: Path, quick: bool, extra: tuple = ()) -> Path:
    from emo.workflow.plan import compose

    out = root / f"calibrate-{gpu}"
    if not (out / "bench.parquet").exists():
        cfg = compose([f"gpu={gpu}", "tracking.enabled=false", *extra])
        stage("calibrate", cfg, {}, out)
    return out / "bench.parquet"


def measure(device, workload, policy, iterations: int) -> tuple[float, float]:
    """Per-iteration time and exact energy (all GPUs) of `iterations` iterations after one warm-up."""
    device.set_policy(policy)
    device.run(workload, iterations, warmup=1)
    sim = device.last_sim
    e = sum(float(device.meters[g.idx].true_j(sim.t_end) - device.meters[g.idx].true_j(sim.t_start)) for g in sim.gpus)
    return (sim.t_end - sim.t_start) * 1e-9 / iterations, e / iterations


def random_policy(gpu: str, devices: int, clocks: list[int], period_ms: float, rng) -> FrequencyPolicy:  # noqa: F821
    from emo.policy import FrequencyPolicy, Step

    fmax = max(clocks)
    ok = [c for c in clocks if c >= fmax / 2]
    n = max(int(np.ceil(period_ms / 20.0)), 1)
    steps = {d: [Step(20.0 * i, int(rng.choice(ok))) for i in range(n)] for d in range(devices)}
    return FrequencyPolicy(gpu=gpu, steps=steps, period_ms=period_ms, lead_ms=10.0)


def pack_errors(device, workload, packs, ranges, model, clocks: list[int]) -> dict:
    """Model vs the virtual GPU per signature across `clocks` (see the module docstring)."""
    from emo.device.sim.profiling import launch_table
    from emo.model.fit import model_arrays

    program = device._program(workload)
    table = launch_table(program)
    m = model_arrays(model)
    f0 = m.default_mhz
    cols = [int(np.searchsorted(m.clocks, c)) for c in clocks if c != f0 and c in set(m.clocks.tolist())]
    at = [device.clocks.index(int(m.clocks[i])) for i in cols]
    i0_m, i0_d = int(np.searchsorted(m.clocks, f0)), device.clocks.index(f0)
    first = packs["first_occurrence"].to_numpy()
    err_t, err_e, err_g = [], [], []
    for sig, rng_, is_first in zip(packs["signature"].astype(str), ranges, first):
        if not is_first or sig not in m.signatures:
            continue
        kids = [table[rng_.rank][o] for o in rng_.ordinals]
        kids = [k for k in kids if k >= 0]
        if not kids:
            continue
        tab = device.gp.kernel_tables([program.kernels[k].work for k in kids])
        d = tab.dur_ns.sum(axis=0)
        e = (tab.power_w * tab.dur_ns).sum(axis=0)
        r = m.signatures.index(sig)
        t_m = m.time_s[r]
        e_m = m.idle_power_w * t_m + m.dynamic_energy_j[r]
        err_t += [100 * ((t_m[i] / t_m[i0_m]) / (d[j] / d[i0_d]) - 1) for i, j in zip(cols, at)]
        if e_m[i0_m] > 0 and e[i0_d] > 0:
            err_e += [100 * ((e_m[i] / e_m[i0_m]) / (e[j] / e[i0_d]) - 1) for i, j in zip(cols, at)]
            # given the true time: the model's energy with its time replaced by the simulator's
            t_g = t_m[i0_m] * d / d[i0_d]
            e_g0 = m.idle_power_w[i0_m] * t_g[i0_d] + m.dynamic_energy_j[r][i0_m]
            err_g += [
                100 * (((m.idle_power_w[i] * t_g[j] + m.dynamic_energy_j[r][i]) / e_g0) / (e[j] / e[i0_d]) - 1)
                for i, j in zip(cols, at)
            ]
    a_t, a_e = np.abs(err_t), np.abs(err_e)
    return {
        "pack_t": float(a_t.mean()) if a_t.size else float("nan"),
        "pack_t_max": float(a_t.max()) if a_t.size else float("nan"),
        "pack_e": float(a_e.mean()) if a_e.size else float("nan"),
        "pack_e_max": float(a_e.max()) if a_e.size else float("nan"),
        "pack_points": int(a_t.size),
        "pack_e_given_t": float(np.abs(err_g).mean()) if err_g else float("nan"),
        "pack_e_given_t_max": float(np.abs(err_g).max()) if err_g else float("nan"),
    }


def measured_transition_ms(device, clocks: list[int], rng) -> float:
    """The clock-request latency the predictor plans with, measured through the device protocol (the
    median over random steps between the random policies' clocks, read every 1 ms)."""
    if not hasattr(device, "clock_step_latencies_ms"):  # a device without the measurement (older sim)
        return 10.0  # the midpoint of its configured uniform 5-15 ms
    fmax = max(clocks)
    ok = [c for c in clocks if c >= fmax / 2]
    pairs = [(int(a), int(b)) for a, b in rng.choice(ok, size=(40, 2)) if a != b]
    return float(np.median(device.clock_step_latencies_ms(pairs, 1.0)))


def optimized_rows(cfg: dict, d: Path, bench: Path, device, tables, budgets, iters: int) -> list[tuple]:
    """(budget, clock-changing, pred ES, meas ES, pred PL, meas PL, pred t, meas t, pred E, meas E)
    per budget: optimizer=emo's plan on this fit, predicted as the optimize stage reports it and
    measured against the max clock over the same iterations, run before and after it (as validate
    does: the die warms over the runs, and a baseline measured only first would be the coldest)."""
    from emo.policy import FrequencyPolicy

    rows = []
    for b in budgets:
        c = {**cfg, "optimizer": {**cfg["optimizer"], "name": "emo"}, "budget": float(b)}
        inputs = {
            "packs": d / "pack/packs.parquet",
            "model": d / "fit/model.parquet",
            "calibration": bench.parent / "calibration.json",
        }
        if (d / "fit/check.json").exists():
            inputs["check"] = d / "fit/check.json"
        stage("optimize", c, inputs, d / f"optimize-{b:g}")
        pol = FrequencyPolicy.load(d / f"optimize-{b:g}/policy.json")
        pt0, pe0 = pol.meta["baseline_time_s"], pol.meta["baseline_energy_j"]
        before = measure(device, cfg["workload"], None, iters)
        mt, me = measure(device, cfg["workload"], pol, iters)
        after = measure(device, cfg["workload"], None, iters)
        mt0, me0 = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        changing = any(s.sm_mhz != tables.default_mhz for st in pol.steps.values() for s in st)
        rows.append(
            (
                float(b),
                changing,
                100 * (1 - pol.predicted_energy_j / pe0),
                100 * (1 - me / me0),
                100 * (pol.predicted_time_s / pt0 - 1),
                100 * (mt / mt0 - 1),
                pol.predicted_time_s,
                mt,
                pol.predicted_energy_j,
                me,
            )
        )
    return rows


def case(args) -> dict:
    gpu, wl, bench, quick, root, extra, budgets = args
    import pandas as pd

    from emo.device import KernelRange, settle_iterations
    from emo.device.backends import open_device
    from emo.model.predict import load_pack_tables, predict
    from emo.pack.ranges import kernel_ordinals, pack_ranges
    from emo.policy import FrequencyPolicy
    from emo.workflow.plan import compose

    t_start = time.perf_counter()
    cfg = compose([f"gpu={gpu}", *WORKLOADS[wl], "tracking.enabled=false", *extra])
    d = Path(root) / f"{gpu}-{wl}"
    stage("trace", cfg, {}, d / "trace")
    stage("graph", cfg, {"events": d / "trace/events.parquet"}, d / "graph")
    pk = stage("pack", cfg, {"nodes": d / "graph/nodes.parquet"}, d / "pack")
    pr = stage(
        "profile",
        cfg,
        {
            "packs": d / "pack/packs.parquet",
            "events": d / "trace/events.parquet",
            "measured": d / "trace/measured.json",
            "graph_nodes": d / "graph/nodes.parquet",
        },
        d / "profile",
    )
    stage(
        "fit",
        cfg,
        {
            "bench": bench,
            "metrics": d / "profile/metrics.parquet",
            "packs": d / "pack/packs.parquet",
            "baseline": d / "profile/baseline.json",
            "iterations": d / "pack/iterations.parquet",
        },
        d / "fit",
    )
    tables = load_pack_tables(d / "pack", d / "fit")

    device = open_device(cfg["gpu"])
    clocks = device.supported_clocks()
    fmax = max(clocks)
    devices = len(tables.device_keys)
    period_ms = pr["baseline_iteration_s"] * 1e3
    # the die at its working temperature before anything is measured, as profile and validate settle
    settle = settle_iterations(float(cfg["gpu"]["settle_s"]), pr["baseline_iteration_s"])
    if settle:
        device.run(cfg["workload"], settle, warmup=0)
    # enough iterations for the policy's steady state, at least ~1 s of virtual time
    iters = int(max(3, min(12, np.ceil(1.0 / pr["baseline_iteration_s"]))))
    static = [c for c in clocks if c >= fmax / 2][::-1]
    if quick:
        static = static[::6]
    rows = []
    for c in static:
        pol = FrequencyPolicy.static(gpu, devices, c)
        p = predict(tables, pol)
        mt, me = measure(device, cfg["workload"], pol, iters)
        rows.append(("static", c, p.time_s, mt, p.energy_j, me))
    rng = np.random.default_rng(7)
    lat_ms = measured_transition_ms(device, clocks, np.random.default_rng(11))
    for i in range(2 if quick else 5):
        pol = random_policy(gpu, devices, clocks, period_ms, rng)
        p = predict(tables, pol, transition_ms=lat_ms)
        mt, me = measure(device, cfg["workload"], pol, iters)
        rows.append(("random", i, p.time_s, mt, p.energy_j, me))
    opt = pd.DataFrame(
        optimized_rows(cfg, d, Path(bench), device, tables, budgets, iters),
        columns=[
            "budget",
            "changing",
            "es_pred",
            "es_meas",
            "pl_pred",
            "pl_meas",
            "pred_t",
            "meas_t",
            "pred_e",
            "meas_e",
        ],
    )
    device.close()
    r = pd.DataFrame(rows, columns=["set", "which", "pred_t", "meas_t", "pred_e", "meas_e"])
    r["err_t"] = 100 * (r["pred_t"] / r["meas_t"] - 1)
    r["err_e"] = 100 * (r["pred_e"] / r["meas_e"] - 1)

    # ablation: profiling cost of every kernel, every pack, first occurrences only
    events = pd.read_parquet(d / "trace/events.parquet")
    nodes = pd.read_parquet(d / "graph/nodes.parquet")
    packs = pd.read_parquet(d / "pack/packs.parquet")
    ords = kernel_ordinals(events)
    k = nodes[nodes["kind"] == "kernel"]
    ko = ords.loc[k["event"].to_numpy()]
    raw = [KernelRange(int(a), (int(b),)) for a, b in zip(ko["rank"], ko["ordinal"])]
    every = pack_ranges(packs, nodes["event"].to_numpy(np.int64), ords)
    costs = {}
    from emo.device import ProfilingUnavailable

    for name, ranges in (("raw", raw), ("packs", every)):
        dev = open_device(cfg["gpu"])
        try:
            costs[name] = float(sum(x.cost_s for x in dev.profile_ranges(cfg["workload"], ranges)))
        except ProfilingUnavailable:  # --counters none: nothing is profiled
            costs[name] = 0.0
        dev.close()
    costs["sampled"] = float(pr["profiling_cost_s"])
    model = pd.read_parquet(d / "fit/model.parquet")
    per_pack = pack_errors(open_device(cfg["gpu"]), cfg["workload"], packs, every, model, static)
    out = {
        "gpu": gpu,
        "workload": wl,
        "kernels": pk["kernels"],
        "packs": pk["packs"],
        "signatures": pk["signatures"],
        "iterations_traced": tables.iterations,
        **{f"cost_{k}_s": v for k, v in costs.items()},
        "rows": r,
        "optimized": opt,
        "wall_s": time.perf_counter() - t_start,
        **per_pack,
    }
    for s in ("static", "random"):
        q = r[r["set"] == s]
        out[f"{s}_t"] = float(q["err_t"].abs().mean())
        out[f"{s}_e"] = float(q["err_e"].abs().mean())
        out[f"{s}_t_max"] = float(q["err_t"].abs().max())
        out[f"{s}_e_max"] = float(q["err_e"].abs().max())
    return out


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchreport.add_flag(ap)
    ap.add_argument("--quick", action="store_true", help="a100 only, every 6th static clock, 2 random policies")
    ap.add_argument("--gpus", default=None, help="comma-separated GPU models (default: a100,h100,rtx3080ti)")
    ap.add_argument("--workloads", default=None, help=f"comma-separated, from {','.join(WORKLOADS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--counters",
        choices=("ncu", "dcgm", "none"),
        default="ncu",
        help="the virtual GPU's counter form (none: no profiling permission)",
    )
    ap.add_argument("--clocks-stride", type=int, default=1, help="calibrate every N-th clock (interpolated)")
    ap.add_argument("--budgets", default="0,0.02", help="budgets of optimizer=emo's plans to score ('' for none)")
    a = ap.parse_args(argv)
    try:
        budgets = [float(x) for x in a.budgets.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--budgets {a.budgets!r}: not a comma-separated list of fractions")
    extra = (f"gpu.counters={a.counters}", f"model.clocks_stride={a.clocks_stride}")
    print(f"counters {a.counters}, calibration clock stride {a.clocks_stride}", flush=True)
    gpus = a.gpus.split(",") if a.gpus else (["a100"] if a.quick else list(GPUS))
    wls = a.workloads.split(",") if a.workloads else list(WORKLOADS)
    root = Path(tempfile.mkdtemp(prefix="emo-fidelity-"))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as ex:
        benches = dict(
            zip(gpus, ex.map(calibrate, gpus, [root] * len(gpus), [a.quick] * len(gpus), [extra] * len(gpus)))
        )
        print(f"calibrated {', '.join(gpus)} in {time.perf_counter() - t0:.0f} s", flush=True)
        jobs = [(g, w, benches[g], a.quick, str(root), extra, budgets) for g in gpus for w in wls]
        results = []
        print(
            f"{'gpu':10} {'workload':8} {'static T%':>9} {'static E%':>9} {'random T%':>9} {'random E%':>9}"
            f" {'max T%':>7} {'max E%':>7} {'pack T%':>7} {'max':>6} {'pack E%':>7} {'max':>6}"
            f"  kernels packs sigs  raw_s packs_s sampled_s  raw/sampled",
            flush=True,
        )
        for r in ex.map(case, jobs):
            results.append(r)
            print(
                f"{r['gpu']:10} {r['workload']:8} {r['static_t']:9.2f} {r['static_e']:9.2f} {r['random_t']:9.2f}"
                f" {r['random_e']:9.2f} {max(r['static_t_max'], r['random_t_max']):7.2f}"
                f" {max(r['static_e_max'], r['random_e_max']):7.2f} {r['pack_t']:7.2f} {r['pack_t_max']:6.1f}"
                f" {r['pack_e']:7.2f} {r['pack_e_max']:6.1f}  {r['kernels']:7d} {r['packs']:5d}"
                f" {r['signatures']:4d} {r['cost_raw_s']:6.1f} {r['cost_packs_s']:7.1f} {r['cost_sampled_s']:9.2f}"
                f"  {r['cost_raw_s'] / max(r['cost_sampled_s'], 1e-9):10.0f}x",
                flush=True,
            )
    worst, name = 0.0, ""
    for r in results:
        for key in ("static_t", "static_e", "random_t", "random_e"):
            if r[key] > worst:
                worst, name = (
                    r[key],
                    f"{r['gpu']} {r['workload']} {key.replace('_t', ' time').replace('_e', ' energy')}",
                )
    print(f"worst case: {name} (MAPE {worst:.2f} %); signed errors there:")
    w = next(r for r in results if name.startswith(f"{r['gpu']} {r['workload']} "))
    print(w["rows"].round(4).to_string(index=False))
    print(f"total {time.perf_counter() - t0:.0f} s; artifacts in {root}")
    pt = np.nanmean([r["pack_t"] for r in results])
    pe = np.nanmean([r["pack_e"] for r in results])
    print(
        f"per-pack MAPE %: {pt:.2f} (time) {pe:.2f} (energy); max {np.nanmax([r['pack_t_max'] for r in results]):.1f}"
        f" / {np.nanmax([r['pack_e_max'] for r in results]):.1f}"
    )
    print(
        f"per-pack energy MAPE % given the true time: {np.nanmean([r['pack_e_given_t'] for r in results]):.2f}"
        f" (max {np.nanmax([r['pack_e_given_t_max'] for r in results]):.1f}; "
        + ", ".join(f"{r['workload']} {r['pack_e_given_t']:.2f}" for r in results)
        + ")"
    )
    print(f"worst MAPE %: {worst:.2f}")
    optimized_summary(results)  # its last line: the bias over the optimizer's own plans
    return worst


def optimized_summary(results: list[dict]) -> dict | None:
    """Print every optimized plan's predicted vs measured ES/PL and the bias line; the numbers."""
    import pandas as pd

    frames = [r["optimized"].assign(gpu=r["gpu"], workload=r["workload"]) for r in results if len(r["optimized"])]
    if not frames:
        return None
    o = pd.concat(frames, ignore_index=True)
    o["d_es"] = o["es_pred"] - o["es_meas"]
    o["err_t"] = 100 * (o["pred_t"] / o["meas_t"] - 1)
    o["err_e"] = 100 * (o["pred_e"] / o["meas_e"] - 1)
    print("optimizer=emo's plans (ES, PL %: predicted / measured; dES = predicted - measured, points):")
    cols = [
        "gpu",
        "workload",
        "budget",
        "changing",
        "es_pred",
        "es_meas",
        "d_es",
        "pl_pred",
        "pl_meas",
        "err_t",
        "err_e",
    ]
    print(o[cols].round(3).to_string(index=False))
    c = o[o["changing"]]
    if not len(c):
        print("optimized plans: none changes a clock")
        return {"plans": 0}
    w = c.loc[c["d_es"].abs().idxmax()]
    out = {
        "plans": int(len(c)),
        "mean_abs_des": float(c["d_es"].abs().mean()),
        "bias_des": float(c["d_es"].mean()),
        "positive": int((c["d_es"] > 0).sum()),
    }
    print(f"worst plan: {w['gpu']} {w['workload']} at {w['budget']:g}: dES {w['d_es']:+.2f} points")
    print(
        f"optimized plans: mean |dES| {out['mean_abs_des']:.2f} points, bias {out['bias_des']:+.2f} points over "
        f"{out['plans']} clock-changing plans ({out['positive']} predicted too large)"
    )
    return out


if __name__ == "__main__":
    with benchreport.recording(lambda argv: "model-fidelity-quick" if "--quick" in argv else "model-fidelity"):
        sys.exit(0 if main() is not None else 1)
