"""EMO's planner on Perseus's own problem: its SOSP'24 emulation (8-stage 1F1B pipelines of GPT-3
175B and BLOOM on A100-SXM and A40, 12-96 microbatches).

For each of the 16 published frontiers (`emulation/iteration_time_energy/<gpu>/<model>_bf16_mb<N>.csv`,
what lowtime reached at each iteration time), EMO plans the same DAG (emo.perseus.dag: Merak's 1F1B
order, lowtime's options per instruction, times quantised to the frontier's own unit) under the
same accounting (P2P blocking power while a stage waits) with each sampled frontier time as its
deadline, and its energy is divided by Perseus's. Perseus's energies are lowtime's: its fitted
exponential cost model at integer durations (`result.cost`), the options' measured energies only
where a duration is an option; EMO's are the profile's measured energies of the clocks it picks.

With --lowtime, Perseus's planner itself (lowtime, the `baselines` extra) is re-run on the named
cases exactly as lowtime/scripts/perseus.py sets it up: that checks the DAG against the published
frontier (max difference printed), gives the wall time lowtime needs to reach each sampled time
(setup and model fits included), and the measured-table energy of lowtime's own clock choice
there. EMO's solve time is measured on the same points, side by side, after one warm-up solve.

    python benchmarks/perseus_frontier.py ../shared/data/perseus-sosp24 [--points 21]
        [--lowtime 'a100_sxm/*_mb12,a100_sxm/*_mb24'] [--cases 'a100_sxm/*'] [--explain]

One line per case; the last: `perseus frontier: energy ratio max X, mean Y over N points, EMO Z× faster`
(Z: lowtime's total time to the timed points / EMO's on them).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from emo import benchreport
from emo.perseus.dag import BLOCKING_POWER_W, PerseusDag, pipeline, plan
from emo.perseus.merak import instruction_order
from emo.perseus.profile import Profile, read_profile

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("perseus-frontier",)
STAGES = 8  # the emulation's pipeline (evaluation.ipynb: tp, pp = 8, 8; 8 stages in every profile)
GPUS = {"a100_sxm": "a100", "a40": "a40"}


def frontier_unit(times: np.ndarray) -> float:
    """The time quantum lowtime walked in (1 ms on A100-SXM, 0.1 ms on A40): the frontier's step."""
    step = np.diff(np.sort(np.unique(np.round(times, 9))))
    return float(10 ** np.round(np.log10(step.min())))


def cases(root: Path):
    base = root / "emulation" / "iteration_time_energy"
    for gpu in GPUS:
        for f in sorted((base / gpu).glob("*_bf16_mb*.csv*"), key=lambda f: (f.name.split("_")[0], _mb(f))):
            yield gpu, f.name.split("_bf16")[0], _mb(f), f


def _mb(f: Path) -> int:
    return int(f.name.split("_mb")[1].split(".")[0])


def sample(n_rows: int, points: int) -> np.ndarray:
    if points <= 0 or points >= n_rows:
        return np.arange(n_rows)
    return np.unique(np.round(np.linspace(0, n_rows - 1, points)).astype(int))


def emo_at(dag: PerseusDag, target_s: float) -> tuple[float, float, float]:
    """(time s, energy J, solve s) of EMO's plan with deadline target_s."""
    t0 = time.perf_counter()
    cols = plan(dag, target_s)
    wall = time.perf_counter() - t0
    t, e = dag.accounting(cols)
    return t, e, wall


def lp_bound(dag: PerseusDag, target_s: float) -> float:
    """The least energy of any mix of clocks per instruction within target_s (the LP relaxation
    EMO's solver starts from, emo.optimize.solvers.milp.formulation): no clock plan is below it."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    from emo.optimize.solvers.milp import formulation

    p = dag.problem
    c, A, lo, hi, lb, ub = formulation(p, dag.items, target_s * 1e9)
    res = milp(c, constraints=LinearConstraint(A, lo, hi), bounds=Bounds(lb, ub), options={"disp": False})
    if res.status != 0:
        raise RuntimeError(f"LP relaxation at {target_s} s: {res.message}")
    # the items' idle energy holds the stages' max-clock iteration at blocking power once more
    return float(res.fun) - dag.stages * dag.blocking_w * p.makespan0_ns * 1e-9


def lowtime_walk(profile: Profile, dag: PerseusDag, mb: int, blocking_w: float, unit_s: float) -> pd.DataFrame:
    """Perseus's planner as lowtime/scripts/perseus.py runs it: per iteration its time, energy
    (model), wall time since the start (setup and model fits included) and the measured-table
    energy of its clock choice (time as Perseus counts it, energy by dag.accounting)."""
    import networkx as nx
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, Operation, OperationSpec
    from lowtime.solver import PhillipsDessouky

    warnings.filterwarnings("ignore", module="lowtime")  # its grid search's failed curve fits, by design
    warnings.filterwarnings("ignore", message="overflow", category=RuntimeWarning)
    t0 = time.perf_counter()
    specs = {}
    for s in range(STAGES):
        for k, kind in enumerate(("forward", "backward")):
            opts = [
                ExecutionOption(real_time=float(t), unit_time=unit_s, cost=float(e), knob=int(c))
                for t, e, c in zip(profile.time_s[s, k], profile.energy_j[s, k], profile.clocks_mhz)
            ]
            cand = CandidateExecutionOptions(options=opts)
            if len(cand.options) <= 3:
                cand = CandidateExecutionOptions(options=opts, noise_factor=0.95)
            for o in cand.options:
                o.cost -= blocking_w * o.quant_time * o.unit_time
            specs[s, kind] = OperationSpec(options=cand, cost_model=ExponentialModel(cand, search_strategy="best"))
    g = nx.DiGraph()
    node: dict[tuple[int, str, int], int] = {}
    for s in range(STAGES):
        prev = None
        for kind, m in instruction_order(s, STAGES, mb):
            node[s, kind, m] = nid = len(node) + 2  # 0, 1: source and sink, as the script
            g.add_node(nid, op=Operation(spec=specs[s, kind]))
            if prev is not None:
                g.add_edge(prev, nid)
            prev = nid
    for (s, kind, m), i in node.items():
        j = node.get((s + 1, kind, m))
        if j is not None:
            g.add_edge(*((i, j) if kind == "forward" else (j, i)))
    add_source_node(g, 0)
    add_sink_node(g, 1)
    g.graph["source_node"], g.graph["sink_node"] = 0, 1
    # dag's node order is the same as ours (stage by stage, Merak's order): map knobs to columns
    ids = np.array(list(node.values()))
    rows = []
    for r in PhillipsDessouky(g).run():
        wall = time.perf_counter() - t0
        knob = np.array([g.nodes[i]["op"].assigned_knob for i in ids])
        col = np.searchsorted(profile.clocks_mhz, knob)
        rows.append((r.real_time, r.cost + STAGES * r.real_time * blocking_w, wall, *dag.accounting(col)))
    return pd.DataFrame(rows, columns=["time", "energy", "wall_s", "table_time", "table_energy"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("data", type=Path, help="the perseus-sosp24 folder")
    ap.add_argument("--points", type=int, default=21, help="frontier points per case, evenly spaced (0: all)")
    ap.add_argument(
        "--lowtime",
        default="a100_sxm/*_mb12,a100_sxm/*_mb24",
        help="cases (gpu/model_mbN patterns) on which to re-run lowtime; '' for none",
    )
    ap.add_argument("--cases", default="*", help="only these cases (gpu/model_mbN patterns, comma-separated)")
    ap.add_argument(
        "--explain",
        action="store_true",
        help="at each point where EMO is above Perseus, the LP relaxation's bound (no clock plan is below it)",
    )
    a = ap.parse_args()
    profiles = a.data / "emulation" / "stage_profile"
    if not profiles.is_dir():
        print(f"{a.data}: no emulation/stage_profile folder (the perseus-sosp24 data)", file=sys.stderr)
        return 2
    patterns = [x for x in a.lowtime.split(",") if x]
    # warm-up: numba compiles EMO's kernels on the first solve; not counted
    warm = read_profile(profiles / "bloom+a100_sxm_bf16.csv")
    small = pipeline(warm, STAGES, 2, BLOCKING_POWER_W["a100"], 1e-3)
    emo_at(small, 1.05e-9 * small.problem.makespan0_ns)
    ratios, emo_s, lt_s = [], 0.0, 0.0
    print(
        f"{'case':24s} {'unit':>6s} {'points':>6s} {'T range s':>15s} {'ratio max':>9s} {'mean':>7s} {'min':>7s} "
        f"{'EMO s/pt':>8s} {'lowtime':>30s}"
    )
    wanted = [x for x in a.cases.split(",") if x]
    for gpu, model, mb, path in cases(a.data):
        name = f"{gpu}/{model}_mb{mb}"
        if not any(fnmatch.fnmatch(name, pat) for pat in wanted):
            continue
        front = pd.read_csv(path)
        unit = frontier_unit(front["time"].to_numpy())
        w = BLOCKING_POWER_W[GPUS[gpu]]
        prof = read_profile(profiles / f"{model}+{gpu}_bf16.csv")
        dag = pipeline(prof, STAGES, mb, w, unit)
        idx = sample(len(front), a.points)
        got = [emo_at(dag, float(front["time"].iloc[i])) for i in idx]
        r = np.array([e / front["energy"].iloc[i] for i, (_, e, _) in zip(idx, got)])
        late = [front["time"].iloc[i] for i, (t, _, _) in zip(idx, got) if t > front["time"].iloc[i] + 1e-9]
        if late:
            raise AssertionError(f"{name}: EMO's plan is late at {late}")
        ratios += r.tolist()
        wall = np.array([g[2] for g in got])
        lt = ""
        if any(fnmatch.fnmatch(name, pat) for pat in patterns):
            walk = lowtime_walk(prof, dag, mb, w, unit)
            pub = front["energy"].to_numpy()
            n = min(len(walk), len(pub))
            dev = float(np.max(np.abs(walk["energy"].to_numpy()[:n] / pub[:n] - 1)))
            reach = walk["wall_s"].to_numpy()[idx]
            table = walk["table_energy"].to_numpy()[idx] / front["energy"].to_numpy()[idx]
            vs_plan = np.array([e for _, e, _ in got]) / walk["table_energy"].to_numpy()[idx]
            lt_s += float(reach.sum())
            emo_s += float(wall.sum())
            lt = (
                f"{walk['wall_s'].iloc[-1]:6.1f} s walk, {reach.mean():5.1f} s/pt, "
                f"matches published within {dev:.1e}, its plans by the table {table.min():.4f}-{table.max():.4f}, "
                f"EMO / its plans max {vs_plan.max():.4f}"
            )
        print(
            f"{name:24s} {unit * 1e3:5.1f}ms {len(idx):6d} {front['time'].min():7.3f}-{front['time'].max():7.3f} "
            f"{r.max():9.4f} {r.mean():7.4f} {r.min():7.4f} {wall.mean():8.2f} {lt}",
            flush=True,
        )
        for i, ratio in zip(idx, r) if a.explain else ():
            if ratio > 1:
                target, perseus = float(front["time"].iloc[i]), float(front["energy"].iloc[i])
                bound = lp_bound(dag, target)
                print(
                    f"  above at {target:.4f} s: EMO / Perseus {ratio:.5f}, LP bound / Perseus {bound / perseus:.5f}, "
                    f"EMO / LP bound {ratio * perseus / bound:.5f}",
                    flush=True,
                )
    ratios_a = np.array(ratios)
    speed = f"{lt_s / emo_s:.1f}× faster" if emo_s > 0 else "n/a× faster (no lowtime case timed)"
    print(
        f"perseus frontier: energy ratio max {ratios_a.max():.4f}, mean {ratios_a.mean():.4f} over {len(ratios_a)} points, "
        f"EMO {speed}"
    )
    return 0


if __name__ == "__main__":
    with benchreport.recording("perseus-frontier"):
        sys.exit(main())
