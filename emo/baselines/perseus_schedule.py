"""Perseus's view of a pipeline: its instructions (one forward or backward of one micro-batch on one
stage, as Megatron-Perseus calls `on_instruction_begin("forward"|"backward")`), read from a trace's
`forward_step` / `backward_step` annotations, and the DAG Perseus plans on (1F1B: a stage runs its
instructions in order; forward j flows down the stages, backward j flows back up).

Pure functions over the normalised event table (emo.trace); no device, no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

KINDS = {"forward_step": "forward", "backward_step": "backward"}  # Megatron's annotations -> Perseus's names
ITERATION = "ProfilerStep#"


@dataclass
class Schedule:
    """One iteration's instructions, in each stage's order. Arrays are per instruction."""

    stage: np.ndarray  # int: the stage (rank order of the ranks that run instructions)
    kind: np.ndarray  # str: "forward" | "backward"
    micro: np.ndarray  # int: micro-batch index within its kind on its stage
    offset_ns: np.ndarray  # float: GPU start of the instruction after its stage's iteration start
    dur_ns: np.ndarray  # float: GPU time of the instruction (first kernel start to last kernel end)
    ranks: list[int]  # the rank whose instructions stand for each stage
    period_ns: float  # the iteration time (mean of the traced iterations' ProfilerStep spans)

    def __len__(self) -> int:
        return len(self.stage)


def instructions(events: pd.DataFrame) -> pd.DataFrame:
    """Per instruction of every traced iteration: rank, step (iteration ordinal on that rank), kind,
    micro (ordinal of its kind within the step), offset_ns (GPU start after the step's start) and
    dur_ns. The GPU work of an instruction is its compute kernels (NCCL's excluded: Perseus's
    instructions leave the P2P sends and receives outside) launched inside the annotation."""
    ann = events[events["kind"].eq("annotation")]
    steps = ann[ann["name"].str.startswith(ITERATION)]
    ins = ann[ann["name"].isin(list(KINDS))]
    launches = events[events["kind"].eq("runtime") & (events["correlation"] >= 0)][["rank", "correlation", "start_ns"]]
    kern = events[events["kind"].eq("kernel") & ~events["name"].str.startswith("nccl")][
        ["rank", "correlation", "start_ns", "dur_ns"]
    ]
    k = kern.merge(launches.rename(columns={"start_ns": "launch_ns"}), on=["rank", "correlation"], how="inner")
    rows = []
    for rank, a in ins.groupby("rank", sort=True):
        s = steps[steps["rank"].eq(rank)].sort_values("start_ns")
        kr = k[k["rank"].eq(rank)].sort_values("launch_ns")
        lt = kr["launch_ns"].to_numpy()
        s0 = s["start_ns"].to_numpy()
        s1 = s0 + s["dur_ns"].to_numpy()
        count: dict[tuple[int, str], int] = {}
        for st, du, nm in zip(a["start_ns"].to_numpy(), a["dur_ns"].to_numpy(), a["name"].to_numpy()):
            i = np.searchsorted(s0, st, side="right") - 1
            if i < 0 or st >= s1[i]:
                continue  # outside a traced iteration
            lo, hi = np.searchsorted(lt, st), np.searchsorted(lt, st + du, side="right")
            if hi <= lo:
                continue
            g0 = kr["start_ns"].iloc[lo:hi].min()
            g1 = (kr["start_ns"] + kr["dur_ns"]).iloc[lo:hi].max()
            kind = KINDS[nm]
            m = count.get((i, kind), 0)
            count[(i, kind)] = m + 1
            rows.append((int(rank), int(i), kind, m, float(g0 - s0[i]), float(g1 - g0)))
    return pd.DataFrame(rows, columns=["rank", "step", "kind", "micro", "offset_ns", "dur_ns"])


def stage_of(ranks: list[int], pp: int) -> dict[int, int]:
    """Each rank's pipeline stage in Megatron's order (TP ranks adjacent, then replicas, then stages:
    pp_rank = rank // (world / pp)), as each rank reports its pp_rank to Perseus's server."""
    world = max(ranks) + 1
    per = max(world // max(pp, 1), 1)
    return {r: r // per for r in ranks}


def schedule(events: pd.DataFrame, stages: dict[int, int]) -> Schedule | None:
    """The instructions of one iteration of each stage (its first rank's, as Perseus's 3D wrapper
    plans for the ranks with dp_rank = tp_rank = 0 and copies the plan to the rest of the stage;
    offsets and times averaged over the traced iterations), or None when the trace has no pipeline
    instructions."""
    df = instructions(events)
    if df.empty:
        return None
    first: dict[int, int] = {}
    for r, st in sorted(stages.items()):
        first.setdefault(st, r)
    ranks = [first[st] for st in sorted(first)]
    df = df[df["rank"].isin(ranks)]
    per = df.groupby(["rank", "step"]).size()
    full = per[per == per.groupby(level=0).transform("max")].reset_index()[["rank", "step"]]
    df = df.merge(full, on=["rank", "step"])
    mean = df.groupby(["rank", "kind", "micro"], as_index=False)[["offset_ns", "dur_ns"]].mean()
    mean = mean.sort_values(["rank", "offset_ns"], kind="stable").reset_index(drop=True)
    ann = events[events["kind"].eq("annotation") & events["name"].str.startswith(ITERATION)]
    period = float(ann.groupby("rank")["dur_ns"].mean().max())
    stage = mean["rank"].map(stages).to_numpy(np.int64)
    return Schedule(
        stage,
        mean["kind"].to_numpy(object),
        mean["micro"].to_numpy(np.int64),
        mean["offset_ns"].to_numpy(float),
        mean["dur_ns"].to_numpy(float),
        ranks,
        period,
    )


def kind_times(events: pd.DataFrame, stages: dict[int, int]) -> dict[tuple[int, str], float]:
    """GPU time (ns) of each (stage, kind) in a trace: the mean over a rank's instructions of that
    kind, the max over the stage's ranks (Perseus's lookup table is per stage and instruction kind;
    its 3D wrapper takes the max time over a stage's ranks)."""
    df = instructions(events)
    df = df[df["rank"].isin(list(stages))]
    per_rank = df.groupby(["rank", "kind"], as_index=False)["dur_ns"].mean()
    per_rank["stage"] = per_rank["rank"].map(stages)
    return {(int(st), str(k)): float(v) for (st, k), v in per_rank.groupby(["stage", "kind"])["dur_ns"].max().items()}


def dag_edges(s: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """(a, b): instruction a must end before b starts. A stage's instructions in its order; forward j
    of stage i before forward j of stage i + 1; backward j of stage i + 1 before backward j of stage i."""
    a, b = [], []
    idx = np.arange(len(s))
    for st in np.unique(s.stage):
        mine = idx[s.stage == st]  # already in order of offset
        a += mine[:-1].tolist()
        b += mine[1:].tolist()
    key = {(int(st), str(k), int(m)): int(i) for i, (st, k, m) in enumerate(zip(s.stage, s.kind, s.micro))}
    for (st, k, m), i in key.items():
        nxt = key.get((st + 1, k, m))
        if nxt is None:
            continue
        if k == "forward":
            a.append(i)
            b.append(nxt)
        else:
            a.append(nxt)
            b.append(i)
    return np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)


def lags(s: Schedule, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per instruction, the time between the later of its predecessors' ends and its start on the
    traced timeline (host work, P2P, synchronisation): what the planned timeline adds to each start
    so that at the traced clocks it reproduces the traced starts."""
    end = s.offset_ns + s.dur_ns
    ready = np.full(len(s), -np.inf)
    np.maximum.at(ready, b, end[a])
    first = ~np.isfinite(ready)
    return np.where(first, s.offset_ns, np.maximum(s.offset_ns - ready, 0.0))


def earliest_starts(dur: np.ndarray, a: np.ndarray, b: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """Start of each instruction when each starts `lag` after its predecessors end (or at `lag`)."""
    n = len(dur)
    order = _topological(n, a, b)
    start = lag.astype(float).copy()
    preds: list[list[int]] = [[] for _ in range(n)]
    for x, y in zip(a.tolist(), b.tolist()):
        preds[y].append(x)
    for v in order:
        if preds[v]:
            start[v] = max(start[p] + dur[p] for p in preds[v]) + lag[v]
    return start


def _topological(n: int, a: np.ndarray, b: np.ndarray) -> list[int]:
    indeg = np.zeros(n, dtype=np.int64)
    np.add.at(indeg, b, 1)
    succ: list[list[int]] = [[] for _ in range(n)]
    for x, y in zip(a.tolist(), b.tolist()):
        succ[x].append(y)
    out, todo = [], [v for v in range(n) if indeg[v] == 0]
    while todo:
        v = todo.pop()
        out.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                todo.append(w)
    if len(out) != n:
        raise ValueError("perseus: the instruction DAG has a cycle (the traced 1F1B order is not a pipeline schedule)")
    return out
