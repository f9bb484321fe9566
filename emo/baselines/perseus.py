"""Perseus as its own code runs it (zeus/optimizer/pipeline_frequency; docs/baselines.md), online:

1. the pipeline schedule: the instructions (forward/backward of a micro-batch on a stage) of a
   max-clock iteration, from its trace (emo.baselines.perseus_schedule);
2. the lookup table, profiled online: every supported clock from the top down, `warmup_iters` (5)
   then `profile_iters` (30) measured iterations at that clock on every GPU; each (stage, kind)'s
   time from the traced instructions, its energy from the GPUs' energy counters less the blocking
   power (`p_blocking_w`, 70 W) over the time a stage is not in an instruction, shared over the
   instructions by time; the sweep stops after `stop_after_rises` (5) consecutive rises of the
   instructions' energy. Its cost (device time x GPUs, energy) is reported as `explore`;
3. lowtime's Phillips–Dessouky walk on the instruction DAG (lowtime's exponential cost model fitted
   to each (stage, kind)'s options), cost = energy - blocking power x time,
   down to the first schedule within (1 + budget) of the all-max DAG time (no EMO search, repair or
   polish; when none is in exact times, lowtime's last, shortest schedule);
4. after `gpu.settle_s` at the max clock (online.rewarm: the sweep ended at its lowest clocks, on a
   cooled die), one list of clocks per stage per iteration, the same every iteration, one per
   instruction in the stage's instruction order, applied as its code applies it (a host-triggered policy,
   emo.policy.Trigger): when the trainer begins an instruction (the host enters its
   forward_step / backward_step scope, on_instruction_begin) the controller calls
   torch.cuda.synchronize(), so the host waits for the GPU to drain everything queued and loses
   its run-ahead, then hands the instruction's clock to a side process, which sets it through NVML
   only if it differs from the clock it set last, asynchronously to the trainer. Both are charged
   as they happen on the virtual GPU: the synchronize in the host's timeline (a
   cudaDeviceSynchronize), the clock at the host's time after it plus the virtual GPU's
   clock-change latency (the one time-based steps land after). The steps' t_ms are the
   instructions' planned starts, for the record. On real GPUs the runtime applier is time-based
   and refuses such a policy (docs/baselines.md).

Where the trace holds no pipeline instructions (tensor parallel, offload), Perseus has nothing to
schedule: its controller locks the max clock and keeps it (setting.note says so).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from emo.baselines.online import OnlineResult, PhaseMeter, rewarm
from emo.baselines.perseus_schedule import (
    Schedule,
    dag_edges,
    earliest_starts,
    kind_times,
    lags,
    schedule,
    stage_of,
)
from emo.device import Device, runs_triggered_policies
from emo.methods import OnlineContext
from emo.policy import FrequencyPolicy, Step, Trigger

if TYPE_CHECKING:
    from emo.sections import PerseusOptions

# Perseus's on_instruction_begin: torch.cuda.synchronize(), then the instruction's clock to the side process
TRIGGER = Trigger(scopes=("forward_step", "backward_step"), synchronize=True)


def _trace(device: Device, workload: Any, iterations: int, warmup: int):
    from emo.trace.read import read_trace

    with tempfile.TemporaryDirectory(prefix="emo-perseus-") as d:
        run = device.run(workload, iterations, warmup=warmup, trace_dir=Path(d))
        return run, read_trace(Path(d))


def profile(
    device: Device,
    workload: Any,
    devices: Sequence[int],
    stages: dict[int, int],
    clocks_desc: list[int],
    busy_count: dict[tuple[int, str], int],
    opts: PerseusOptions,
    meter: PhaseMeter,
) -> dict:
    """The lookup table {(stage, kind): {clock: (time_ns, energy_j)}} and the clocks profiled."""
    pb = float(opts.p_blocking_w)
    members: dict[int, list[int]] = {}
    for r, st in stages.items():
        members.setdefault(st, []).append(r)
    table: dict[tuple[int, str], dict[int, tuple[float, float]]] = {k: {} for k in busy_count}
    last, rises, done = None, 0, []
    for f in clocks_desc:
        device.set_policy(FrequencyPolicy.static(device.name, list(devices), f))
        with meter.phase("profile"):
            run = device.run(workload, int(opts.profile_iters), warmup=int(opts.warmup_iters))
            _, events = _trace(device, workload, 1, 0)  # the instructions' times at this clock
        times = kind_times(events, stages)
        t_iter = run.time_s / run.iterations
        total = 0.0
        for st, ranks in members.items():
            kinds = [k for k in busy_count if k[0] == st]
            busy = sum(busy_count[k] * times.get(k, 0.0) for k in kinds) * 1e-9
            e_stage = sum(run.energy_per_device_j.get(devices[r], 0.0) for r in ranks) / run.iterations
            e_instr = max(e_stage - pb * len(ranks) * max(t_iter - busy, 0.0), 0.0)
            for k in kinds:
                t = times.get(k, 0.0)
                table[k][f] = (t, e_instr * t * 1e-9 / busy if busy > 0 else 0.0)
                total += busy_count[k] * table[k][f][1]
        done.append(f)
        rises = rises + 1 if last is not None and total > last else 0
        last = total
        if rises >= int(opts.stop_after_rises):
            break
    device.set_policy(None)
    return {"table": table, "clocks": done}


def plan(
    s: Schedule,
    table: dict,
    clocks: list[int],
    budget: float,
    *,
    p_blocking_w: float,
    members: dict[int, int],
    max_iterations: int = 500,
) -> tuple[np.ndarray, dict]:
    """The clock (MHz) of each instruction: lowtime on the instruction DAG (Perseus's planner)."""
    clocks = sorted(clocks, reverse=True)
    n = len(s)
    dur = np.array([[table[(int(st), str(k))][f][0] for f in clocks] for st, k in zip(s.stage, s.kind)])
    en = np.array([[table[(int(st), str(k))][f][1] for f in clocks] for st, k in zip(s.stage, s.kind)])
    pw = p_blocking_w * np.array([members[int(st)] for st in s.stage])  # the stage's GPUs blocked on P2P
    a, b = dag_edges(s)
    zero = np.zeros(n)
    top = earliest_starts(dur[:, 0], a, b, zero)
    t_fast = float(np.max(top + dur[:, 0]))
    slow = earliest_starts(dur.max(axis=1), a, b, zero)
    walk = max(float(np.max(slow + dur.max(axis=1))) - t_fast, 0.0)
    # the time quantum: Perseus's 1 ms, or a tenth of the shortest instruction when that is finer (its
    # instructions were tens of ms), coarse enough that the walk takes at most `max_iterations` steps
    unit = max(1e4, min(1e6, float(dur[:, 0].min()) / 10), walk / max(max_iterations, 1))  # ns
    g, hull = _lowtime_graph(s, dur, en, pw, unit, a, b)
    deadline = t_fast * (1 + budget)
    choice, last, iters, fallbacks = _phillips_dessouky(g, dur, a, b, deadline, max_iterations)
    info: dict[str, Any] = {
        "pd_iterations": iters,
        "unit_time_ms": unit * 1e-6,
        "instructions": int(n),
        "dag_edges": len(a),
        "dag_time_ms": t_fast * 1e-6,
        "rust_panics": fallbacks,
        "hull_cost_models": hull,
    }
    if choice is None and last is not None:  # lowtime's shortest schedule: Perseus's pick at its least time
        info["note"] = "no lowtime iterate met the deadline in exact times: its last (shortest) schedule"
        choice = last
    if choice is None:
        info["note"] = "lowtime returned no schedule: every instruction at the max clock"
        choice = np.zeros(n, dtype=np.int64)
    d = dur[np.arange(n), choice]
    info["planned_dag_time_ms"] = float(np.max(earliest_starts(d, a, b, zero) + d)) * 1e-6
    return np.array(clocks)[choice], info


def _lowtime_graph(s: Schedule, dur: np.ndarray, en: np.ndarray, pw: np.ndarray, unit: float, a, b):
    """lowtime's operation DAG of the instructions (one OperationSpec per (stage, kind), the lookup
    table's row), with source and sink nodes; and how many specs fell back to the hull cost model."""
    import networkx as nx
    from lowtime.cost_model import CostModel, ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, Operation, OperationSpec

    from emo.optimize.solvers.perseus import HullCost

    n = len(s)
    g = nx.DiGraph()
    specs: dict[tuple[int, str], OperationSpec] = {}
    hull = 0
    for v in range(n):
        key = (int(s.stage[v]), str(s.kind[v]))
        if key not in specs:
            # as Perseus's run_optimization.py: seconds, joules, cost = energy - P2P power x quantised time
            opts = [
                ExecutionOption(real_time=float(t) * 1e-9, unit_time=unit * 1e-9, cost=float(e), knob=j)
                for j, (t, e) in enumerate(zip(dur[v], en[v]))
            ]
            for o in opts:
                o.cost -= pw[v] * o.quant_time * o.unit_time
            cand = CandidateExecutionOptions(options=opts)
            try:  # Perseus fits lowtime's exponential cost model to the Pareto-optimal options
                model: CostModel = ExponentialModel(cand, search_strategy="best")
            except (ValueError, RuntimeError, TypeError):  # no fit (lowtime's grid of guesses; < 3 options): the hull
                model, hull = cast(CostModel, HullCost(cand)), hull + 1  # lowtime's contract, duck-typed
            specs[key] = OperationSpec(options=cand, cost_model=model)
        g.add_node(v, op=Operation(spec=specs[key]))
    for x, y in zip(a.tolist(), b.tolist()):
        g.add_edge(x, y)
    add_source_node(g, n)
    add_sink_node(g, n + 1)
    g.graph["source_node"], g.graph["sink_node"] = n, n + 1
    return g, hull


def _phillips_dessouky(g, dur: np.ndarray, a, b, deadline: float, max_iterations: int):
    """lowtime's walk from the fastest schedule to cheaper ones: (the first iterate whose exact time
    meets the deadline or None, the last iterate or None, iterations, Rust panics it fell back from)."""
    from lowtime.solver import PhillipsDessouky

    from emo.optimize.solvers.perseus import _rust_fallback

    n = dur.shape[0]
    zero = np.zeros(n)
    choice = last = None
    iters, fallbacks = 0, [0]
    with _rust_fallback(fallbacks):
        for _ in PhillipsDessouky(g, attr_name="op").run():
            iters += 1
            last = np.array([g.nodes[v]["op"].assigned_knob for v in range(n)], dtype=np.int64)
            d = dur[np.arange(n), last]
            if float(np.max(earliest_starts(d, a, b, zero) + d)) <= deadline + 1.0:
                choice = last
                break
            if iters >= 2 * max_iterations:
                break
    return choice, last, iters, fallbacks[0]


def policy_of(
    s: Schedule,
    mhz: np.ndarray,
    dur_ns: np.ndarray,
    stages: dict[int, int],
    devices: Sequence[int],
    gpu: str,
    budget: float,
) -> FrequencyPolicy:
    """Per GPU, a step per instruction of its stage in instruction order with its clock (the stage's
    list on every rank of the stage), the same list every iteration, requested as Perseus's
    controller does (`TRIGGER`: at the instruction's forward_step / backward_step scope, after a
    device synchronize); each step's t_ms is the instruction's planned start."""
    a, b = dag_edges(s)
    start = earliest_starts(dur_ns, a, b, lags(s, a, b))
    period = s.period_ns + float(np.max(start + dur_ns) - np.max(s.offset_ns + s.dur_ns))
    steps: dict[int, list[Step]] = {}
    for r, st in sorted(stages.items()):
        mine = np.flatnonzero(s.stage == st)
        order = mine[np.argsort(start[mine], kind="stable")]
        steps[int(devices[r])] = [Step(float(start[v] * 1e-6), int(mhz[v])) for v in order]
    return FrequencyPolicy(
        gpu=gpu,
        steps=steps,
        period_ms=period * 1e-6,
        budget=budget,
        lead_ms=0.0,
        meta={"method": "perseus", "per": "instruction"},
        trigger=TRIGGER,
    )


def run_perseus(
    device: Device,
    workload: Any,
    devices: Sequence[int],
    budget: float,
    opts: PerseusOptions,
    *,
    min_clock_fraction: float,
    iterations: int,
    warmup: int,
    settle_s: float = 0.0,
) -> OnlineResult:
    devices = list(devices)
    if not runs_triggered_policies(device):  # say so before the profiling, not after it
        raise ValueError(
            f"optimizer=perseus: its policy is host-triggered (a synchronize and a clock request at each "
            f"instruction) and {type(device).__name__} cannot run one yet: only the virtual GPU does (docs/baselines.md)"
        )
    meter = PhaseMeter(device, devices)
    supported = sorted(device.supported_clocks())
    top = device.default_clock()
    clocks = [c for c in supported if float(min_clock_fraction) * max(supported) <= c <= top][::-1]
    device.set_policy(FrequencyPolicy.static(device.name, devices, top))
    with meter.phase("profile"):
        _, events = _trace(device, workload, 1, 1)  # the pipeline schedule Perseus is given
    ranks = sorted(int(r) for r in events["rank"].unique())
    stages = stage_of(ranks, pipeline_depth(workload))
    sched = schedule(events, stages)
    setting: dict = {"per": "instruction", "trigger": TRIGGER.to_dict()}
    if sched is None:
        setting["note"] = "no pipeline instructions in the trace: Perseus's controller keeps the max clock"
        policy = FrequencyPolicy.static(device.name, devices, top, budget=budget)
    else:
        busy: dict[tuple[int, str], int] = {}
        for st, k in zip(sched.stage, sched.kind):
            busy[(int(st), str(k))] = busy.get((int(st), str(k)), 0) + 1
        prof = profile(device, workload, devices, stages, clocks, busy, opts, meter)
        members = {st: sum(1 for v in stages.values() if v == st) for st in set(stages.values())}
        mhz, info = plan(
            sched,
            prof["table"],
            prof["clocks"],
            budget,
            p_blocking_w=float(opts.p_blocking_w),
            members=members,
            max_iterations=int(opts.max_pd_iterations),
        )
        dur = np.array([prof["table"][(int(st), str(k))][int(f)][0] for st, k, f in zip(sched.stage, sched.kind, mhz)])
        policy = policy_of(sched, mhz, dur, stages, devices, device.name, budget)
        setting.update(
            {
                "profiled_clocks": [int(c) for c in prof["clocks"]],
                "lowtime": info,
                "instruction_clocks": {
                    str(devices[sched.ranks[i]]): [int(x) for x in mhz[sched.stage == i]]
                    for i in range(len(sched.ranks))
                },
            }
        )
    explore = meter.totals("profile")
    setting["profiling_gpu_s"] = explore.time_s * len(devices)
    setting["profiling_energy_j"] = explore.energy_j
    device.set_policy(None)  # the die back to the max clock's warmth after the sweep's lowest clocks
    rewarm(device, workload, settle_s)
    device.set_policy(policy)
    steady = device.run(workload, iterations, warmup=warmup)
    device.set_policy(None)
    setting["policy_steps"] = {str(d): len(st) for d, st in policy.steps.items()}
    return OnlineResult("perseus", steady, explore, setting)


def pipeline_depth(workload: Any) -> int:
    """The workload's pipeline stages: its `pp` key (every pipelined kind's size, as tp's is its
    tensor-parallel one); one for a kind without it (a recorded trace's, a command's, offload's) or a
    workload given as an object. A key read, not the kind's grid: emo.workloads is the virtual GPU's,
    and the optimize stage, which imports this module, must not hash it (tests/test_pipeline.py)."""
    return int(workload["pp"]) if isinstance(workload, dict) and "pp" in workload else 1


def run_online(ctx: OnlineContext) -> OnlineResult:
    """emo.methods' online contract: optimizer.perseus.* and the clock floor, then run_perseus."""
    return run_perseus(
        ctx.device,
        ctx.workload,
        ctx.devices,
        ctx.budget,
        ctx.optimizer.perseus,
        min_clock_fraction=ctx.optimizer.min_clock_fraction,
        iterations=ctx.iterations,
        warmup=ctx.warmup,
        settle_s=float(ctx.gpu.settle_s),
    )
