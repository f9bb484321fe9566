"""Problem instances for tests and benchmarks: random multi-GPU DAGs with a DVFS-shaped cost model,
pipeline schedules built from measured per-stage clock sweeps (Perseus' A100/A40 profiles), and a
large pipeline generator. Pure functions of their arguments; nothing here touches a device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from emo.optimize.problem import Problem, build_problem


def dvfs_curves(
    clocks: np.ndarray,
    base_ns: np.ndarray,
    alpha: np.ndarray,
    activity_w: np.ndarray,
    knee: float = 0.78,
    v_min: float = 0.8,
):
    """Duration (ns) and energy above idle (J) of kernels at each clock: time = base × (α·fmax/f + 1 − α)
    (α: compute-bound share), dynamic power ∝ activity · V(f)² · f with V flat below the knee."""
    f = clocks / clocks.max()
    v = np.where(f <= knee, v_min, v_min + (1 - v_min) * (f - knee) / (1 - knee))
    t = base_ns[:, None] * (alpha[:, None] / f[None, :] + (1 - alpha[:, None]))
    p = activity_w[:, None] * v[None, :] ** 2 * f[None, :]
    return t, p * t * 1e-9


def idle_curve(
    clocks: np.ndarray, static_w: float = 60.0, idle_dyn_w: float = 35.0, knee: float = 0.78, v_min: float = 0.8
):
    f = clocks / clocks.max()
    v = np.where(f <= knee, v_min, v_min + (1 - v_min) * (f - knee) / (1 - knee))
    return static_w * v + idle_dyn_w * v**2 * f


def random_problem(
    seed: int,
    *,
    gpus: int = 2,
    kernels: int = 12,
    clocks: int = 7,
    side_stream: bool = True,
    pipeline: bool = True,
    min_clock_fraction: float = 0.5,
) -> tuple[Problem, dict]:
    """A small random training-like DAG: per GPU a host thread launching kernels on a main stream
    (CPU stalls leave GPU slack), a side stream of communication-like kernels joined by events, and
    point-to-point transfers GPU g -> g+1 through fixed-duration link nodes."""
    rng = np.random.default_rng(seed)
    mhz = np.linspace(1410 * min_clock_fraction, 1410, clocks).round().astype(np.int64)
    dev, base, alpha, act, src, dst, fs = [], [], [], [], [], [], []

    def node(d, b, a, w):
        dev.append(d), base.append(b), alpha.append(a), act.append(w)
        return len(dev) - 1

    def edge(u, v, from_start=False):
        src.append(u), dst.append(v), fs.append(from_start)

    mains = []
    for g in range(gpus):
        prev_cpu, prev_k, main, joins = -1, -1, [], []
        for j in range(kernels):
            stall = rng.random() < 0.2  # a CPU-bound stretch: the GPU waits, slack appears
            cpu = node(-1, rng.uniform(2e6, 8e6) if stall else rng.uniform(0.05e6, 0.4e6), 0, 0)
            if prev_cpu >= 0:
                edge(prev_cpu, cpu)
            prev_cpu = cpu
            k = node(g, rng.uniform(1e6, 8e6), rng.uniform(0.1, 1.0), rng.uniform(150, 350))
            edge(cpu, k, from_start=bool(rng.random() < 0.5))
            if prev_k >= 0:
                edge(prev_k, k)
            prev_k = k
            main.append(k)
            if side_stream and rng.random() < 0.3 and j < kernels - 2:
                side = node(g, rng.uniform(1e6, 6e6), rng.uniform(0.0, 0.3), rng.uniform(40, 120))
                edge(k, side)
                joins.append((side, j + int(rng.integers(1, 3))))  # a later main kernel waits on it
        for side, target in joins:
            edge(side, main[min(target, kernels - 1)])
        mains.append(main)
    if pipeline and gpus > 1:
        for g in range(gpus - 1):
            for j in range(0, kernels, max(2, kernels // 4)):
                link = node(-1, rng.uniform(0.2e6, 1.5e6), 0, 0)
                edge(mains[g][j], link)
                edge(link, mains[g + 1][min(j + 1, kernels - 1)])
    dev = np.array(dev)
    gpu = dev >= 0
    dur, en = dvfs_curves(mhz.astype(float), np.array(base), np.array(alpha), np.array(act))
    en[~gpu] = 0.0
    idle = np.tile(idle_curve(mhz.astype(float)), (gpus, 1))
    delay = np.where(gpu, rng.uniform(3e3, 8e3, len(dev)), 0.0)  # launch latency
    p = build_problem(src, dst, dev, dur, en, idle, mhz, from_start=fs, delay_ns=delay)
    return p, {"seed": seed, "gpus": gpus, "nodes": int(p.n), "kind": "random"}


# --------------------------------------------------------------------------- pipelines
def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Per stage, the 1F1B order of (forward|backward, microbatch)."""
    out = []
    for s in range(stages):
        warm = min(stages - s - 1, microbatches)
        seq = [("forward", m) for m in range(warm)]
        f, b = warm, 0
        while b < microbatches:
            if f < microbatches:
                seq.append(("forward", f))
                f += 1
            seq.append(("backward", b))
            b += 1
        out.append(seq)
    return out


def pipeline_dag(stages: int, microbatches: int, packs_per_pass: int, *, links: bool):
    """The DAG of a 1F1B pipeline, as arrays: each pass is a chain of `packs_per_pass` packs on its
    stage's GPU; a pass waits for the previous one on its stage, and for the same microbatch's pass
    on the stage before (forward) or after (backward), through a host node (`links`, a p2p transfer)
    or directly; the last stage's backward waits for its forward. Returns (stage, instruction (0 fwd,
    1 bwd), pack index within its pass, src, dst); link nodes have -1 in the first three."""
    order = one_f_one_b(stages, microbatches)
    stage, instr, part, src, dst = [], [], [], [], []
    first, last = {}, {}
    for s in range(stages):
        prev = -1
        for kind, m in order[s]:
            for j in range(packs_per_pass):
                stage.append(s), instr.append(0 if kind == "forward" else 1), part.append(j)
                if prev >= 0:
                    src.append(prev), dst.append(len(stage) - 1)
                prev = len(stage) - 1
            first[(s, kind, m)], last[(s, kind, m)] = prev - packs_per_pass + 1, prev
    for s in range(stages):
        for m in range(microbatches):
            for kind, nxt in (("forward", s + 1), ("backward", s - 1)):
                if 0 <= nxt < stages:
                    u, v = last[(s, kind, m)], first[(nxt, kind, m)]
                    if links:
                        stage.append(-1), instr.append(-1), part.append(-1)
                        src += [u, len(stage) - 1]
                        dst += [len(stage) - 1, v]
                    else:
                        src.append(u), dst.append(v)
            if s == stages - 1:
                src.append(last[(s, "forward", m)]), dst.append(first[(s, "backward", m)])
    return np.array(stage), np.array(instr), np.array(part), src, dst


def pipeline_problem(
    time_s: np.ndarray,
    energy_j: np.ndarray,
    clocks_mhz: np.ndarray,
    *,
    microbatches: int,
    idle_w: float,
    link_ns: float = 0.0,
    split: int = 1,
    min_clock_fraction: float = 0.0,
) -> Problem:
    """A 1F1B pipeline: stage s, instruction i (0 fwd, 1 bwd) takes time_s[s, i, c] and energy_j[s, i, c]
    (total, idle included) at clocks_mhz[c]; each pass is split into `split` equal packs."""
    S, C = time_s.shape[0], len(clocks_mhz)
    stage, instr, _, src, dst = pipeline_dag(S, microbatches, split, links=link_ns > 0)
    pack = stage >= 0
    dur = np.full((len(stage), C), float(link_ns))
    energy = np.zeros((len(stage), C))
    dur[pack] = time_s[stage[pack], instr[pack]] * 1e9 / split
    energy[pack] = (energy_j - idle_w * time_s)[stage[pack], instr[pack]] / split
    idle = np.full((S, C), float(idle_w))
    return build_problem(src, dst, stage, dur, energy, idle, clocks_mhz, min_clock_fraction=min_clock_fraction)


def perseus_profile(path: str | Path, stages: int | None = None, clock_stride: int = 1):
    """time_s[s, i, c], energy_j[s, i, c], clocks (ascending) from a Perseus stage-profile CSV."""
    path = Path(path)
    try:
        df = pd.read_csv(path)
        df = df[["stage", "instruction", "frequency", "time", "energy"]]
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a Perseus stage profile ({e})") from e
    clocks = np.sort(df["frequency"].unique())
    clocks = np.unique(np.r_[clocks[::-1][::clock_stride], clocks.max()])
    S = int(df["stage"].max()) + 1 if stages is None else stages
    t = np.zeros((S, 2, len(clocks)))
    e = np.zeros_like(t)
    piv_t = df.pivot_table(index=["stage", "instruction"], columns="frequency", values="time")
    piv_e = df.pivot_table(index=["stage", "instruction"], columns="frequency", values="energy")
    for s in range(S):
        for i, kind in enumerate(("forward", "backward")):
            t[s, i] = piv_t.loc[(s, kind), clocks].to_numpy()
            e[s, i] = piv_e.loc[(s, kind), clocks].to_numpy()
    return t, e, clocks


def large_pipeline(
    stages: int = 8,
    microbatches: int = 64,
    packs_per_pass: int = 50,
    seed: int = 0,
    clocks: int = 48,
    link_ns: float = 20e3,
) -> Problem:
    """A big pipeline (stages × microbatches × 2 × packs_per_pass packs) with DVFS-shaped packs of
    varied compute share: the optimiser's scaling test."""
    rng = np.random.default_rng(seed)
    mhz = np.linspace(705, 1410, clocks).round()
    fwd = rng.uniform(0.5e6, 3e6, (stages, packs_per_pass))
    alpha = rng.uniform(0.2, 1.0, (stages, packs_per_pass))
    act = rng.uniform(120, 350, (stages, packs_per_pass))
    stage, instr, part, src, dst = pipeline_dag(stages, microbatches, packs_per_pass, links=True)
    pack = stage >= 0
    base = np.full(len(stage), float(link_ns))
    al, ac = np.zeros(len(stage)), np.zeros(len(stage))
    base[pack] = fwd[stage[pack], part[pack]] * (1.0 + instr[pack])  # a backward pass takes twice as long
    al[pack], ac[pack] = alpha[stage[pack], part[pack]], act[stage[pack], part[pack]]
    dur, en = dvfs_curves(mhz, base, al, ac)
    dur[~pack] = base[~pack][:, None]
    en[~pack] = 0.0
    idle = np.tile(idle_curve(mhz), (stages, 1))
    return build_problem(src, dst, stage, dur, en, idle, mhz.astype(np.int64))
