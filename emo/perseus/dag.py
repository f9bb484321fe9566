"""Perseus's emulation problem as an EMO Problem: the 1F1B DAG of a pipeline's instructions, the
options lowtime keeps for each, and its energy accounting (ml-energy/zeus, branch kronos,
lowtime/scripts/perseus.py).

- Nodes: every forward and backward of every micro-batch on every stage (device = stage), in
  Merak's order on each stage (emo.perseus.merak; lowtime's `Synchronous1F1B` is the same
  mapping). Edges: a stage's instructions in that order; forward j of stage i before forward j of
  stage i + 1; backward j of stage i + 1 before backward j of stage i (lowtime/perseus/
  instruction.py `forward_dep`, `backward_dep`). No lags: lowtime's DAG has none.
- Options: per (stage, instruction), lowtime's `CandidateExecutionOptions` (lowtime/operation.py):
  the (time, energy) Pareto set of the profile's clocks, times quantised down to `unit_time`
  (`quant_time = time // unit_time`), one option per quantised time (the costliest), and with
  noise factor 0.95 when 3 or fewer are left. Each clock column of the Problem holds the slowest
  kept option at or above that clock (what applying the column would run).
- Accounting: a stage draws `blocking_w` (P2P blocking power) whenever it does not compute, so an
  iteration of time T costs Σ (energy − blocking_w × time) over instructions + stages × T ×
  blocking_w (the script's `option.cost -= p_p2p * quant_time * unit_time` and `real_cost =
  result.cost + num_stages * real_time * p_p2p`). In EMO's Problem that is energy above idle =
  energy − blocking_w × time and idle power = blocking_w on every stage at every clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emo.optimize.problem import Items, Problem, build_problem, make_items
from emo.perseus.merak import FORWARD, instruction_order
from emo.perseus.profile import Profile

# P2P blocking power (W) Perseus's planner charges while a stage waits (lowtime/scripts/perseus.py
# `p_p2p`; the evaluation notebook's `blocking_power`, where A100 means A100-SXM).
BLOCKING_POWER_W = {"a100": 83.64, "a40": 70.38}
NOISE_FACTOR = 0.95  # lowtime/scripts/perseus.py Args.noise_factor


def candidates(time_s: np.ndarray, energy_j: np.ndarray, unit_s: float, noise: float = 1.0) -> np.ndarray:
    """bool[C]: the options lowtime's CandidateExecutionOptions keeps (unit_s = 0: times as
    measured, no quantisation)."""
    order = sorted(range(len(time_s)), key=lambda c: -time_s[c])  # slowest first, stable
    pareto = [
        c for c in order if not any(time_s[o] < time_s[c] * noise and energy_j[o] < energy_j[c] * noise for o in order)
    ]
    keep, seen = [], set()
    for c in sorted(pareto, key=lambda c: -energy_j[c]):  # costliest first: its time is closest to the quantum
        q = quantise(time_s[c], unit_s)
        if q not in seen:
            seen.add(q)
            keep.append(c)
    out = np.zeros(len(time_s), dtype=bool)
    out[keep] = True
    return out


def quantise(t: float | np.ndarray, unit_s: float):
    """lowtime's `real_time // unit_time` × unit_time (seconds); unit_s = 0: t itself."""
    return np.floor_divide(t, unit_s) * unit_s if unit_s > 0 else t


def options(profile: Profile, unit_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time_s, energy_j, knob_mhz), each [S, 2, C]: per clock column, the kept option it stands for."""
    S, _, C = profile.time_s.shape
    time = np.empty((S, 2, C))
    energy = np.empty((S, 2, C))
    knob = np.empty((S, 2, C), dtype=np.int64)
    for s in range(S):
        for k in range(2):
            t, e = profile.time_s[s, k], profile.energy_j[s, k]
            keep = candidates(t, e, unit_s)
            if keep.sum() <= 3:
                keep = candidates(t, e, unit_s, NOISE_FACTOR)
            kept = np.flatnonzero(keep)  # ascending clocks
            # the slowest kept clock at or above each column (the fastest kept one above them all)
            pick = kept[np.minimum(np.searchsorted(kept, np.arange(C)), len(kept) - 1)]
            time[s, k] = quantise(t[pick], unit_s)
            energy[s, k] = e[pick]
            knob[s, k] = profile.clocks_mhz[pick]
    return time, energy, knob


@dataclass
class PerseusDag:
    problem: Problem
    items: Items  # one item per instruction: its own clock
    stage: np.ndarray  # int64[n], the caller's node order: stage by stage, Merak's order within
    kind: np.ndarray  # int64[n]: 0 forward, 1 backward
    micro: np.ndarray  # int64[n]
    knob_mhz: np.ndarray  # int64[S, 2, C]: the clock each column runs
    blocking_w: float
    unit_s: float

    @property
    def stages(self) -> int:
        return int(self.stage.max()) + 1

    def node_columns(self, choice: np.ndarray) -> np.ndarray:
        """int64[n] (caller order): the clock column of each instruction under an item choice."""
        col = np.empty(self.problem.n, dtype=np.int64)
        col[self.problem.perm] = np.asarray(choice)[self.items.item_of]
        return col

    def node_mhz(self, choice: np.ndarray) -> np.ndarray:
        return self.knob_mhz[self.stage, self.kind, self.node_columns(choice)]

    def accounting(self, columns: np.ndarray) -> tuple[float, float]:
        """(iteration time s, energy J) of per-instruction clock columns (caller order), by Perseus's
        accounting, computed from the tables directly (not through the solver's bookkeeping)."""
        p = self.problem
        inv = np.empty(p.n, dtype=np.int64)
        inv[p.perm] = np.arange(p.n)
        col = np.asarray(columns)[p.perm]  # internal order
        dur = p.dur_ns[np.arange(p.n), col]
        _, _, makespan = p.forward(dur)
        t = makespan * 1e-9
        return t, float(p.energy_j[np.arange(p.n), col].sum() + self.stages * t * self.blocking_w)


def pipeline(profile: Profile, n_stages: int, n_microbatches: int, blocking_w: float, unit_s: float) -> PerseusDag:
    """The 1F1B DAG over the first `n_stages` stages of the profile (lowtime/scripts/perseus.py reads
    stages 0..num_stages-1)."""
    if not 1 <= n_stages <= profile.stages:
        raise ValueError(
            f"{profile.name}: --stages {n_stages} needs stages 0..{n_stages - 1} (the profile has {profile.stages})"
        )
    if n_microbatches < 1:
        raise ValueError(f"--microbatches must be >= 1 (got {n_microbatches})")
    if blocking_w < 0 or unit_s < 0:
        raise ValueError(f"blocking power ({blocking_w} W) and unit time ({unit_s} s) must be >= 0")
    time, energy, knob = options(profile, unit_s)
    stage, kind, micro = [], [], []
    for s in range(n_stages):
        for k, m in instruction_order(s, n_stages, n_microbatches):
            stage.append(s)
            kind.append(0 if k == FORWARD else 1)
            micro.append(m)
    st, kd, mb = (np.array(x, dtype=np.int64) for x in (stage, kind, micro))
    n = len(st)
    node = {(int(a), int(b), int(c)): i for i, (a, b, c) in enumerate(zip(st, kd, mb))}
    src, dst = [], []
    same = np.flatnonzero(st[1:] == st[:-1])  # consecutive on one stage
    src += same.tolist()
    dst += (same + 1).tolist()
    for (s, kid, m), i in node.items():
        nxt = node.get((s + 1, kid, m))
        if nxt is not None:
            src.append(i if kid == 0 else nxt)
            dst.append(nxt if kid == 0 else i)
    dur_s = time[st, kd]  # [n, C]
    p = build_problem(
        np.array(src),
        np.array(dst),
        st.astype(np.int32),
        dur_s * 1e9,
        energy[st, kd] - blocking_w * dur_s,
        np.full((n_stages, profile.clocks_mhz.size), blocking_w),
        profile.clocks_mhz,
    )
    # one item per instruction (window = its place on its stage); each window's length shares out
    # the stage's whole max-clock iteration, so that a longer iteration costs every stage's
    # blocking power, as in Perseus's `num_stages * real_time * p_p2p`
    pos = np.concatenate([np.arange((st == s).sum()) for s in range(n_stages)])
    ref = dur_s[:, p.ref]
    lens = np.zeros((n_stages, 2 * n_microbatches))
    for s in range(n_stages):
        mine = st == s
        lens[s, pos[mine]] = ref[mine] * p.makespan0_ns / ref[mine].sum()
    items = make_items(p, 0.0, replicate=False, windows=pos, groups=[[s] for s in range(n_stages)], window_len_ns=lens)
    assert n == p.n
    return PerseusDag(p, items, st, kd, mb, knob, float(blocking_w), float(unit_s))


def plan(dag: PerseusDag, target_s: float) -> np.ndarray:
    """EMO's least-energy plan whose iteration (as the DAG times it) ends within target_s: the clock
    column of each instruction (caller order). One line naming the target when it is too short."""
    from emo.optimize.solvers.dp import optimize

    t0 = dag.problem.makespan0_ns * 1e-9
    if target_s < t0 - 1e-12:
        raise ValueError(f"target time {target_s:.6g} s is below the iteration at the maximum clocks ({t0:.6g} s)")
    sol = optimize(dag.problem, max(target_s / t0 - 1.0, 0.0), items=dag.items)
    return dag.node_columns(sol.choice)
