"""The A100's clock-request latency as Perseus's real runs show it (issue 45, item 4).

    python benchmarks/perseus_clock_latency.py [--data ../shared/data/perseus-sosp24] [--json out.json]

Perseus's Merak runs (`perseus/A100/dp1+pp4+tp1/*`, a 4-stage pipeline on A100-PCIe) set the SM clock
of every instruction from a second process just before the instruction starts (`N.sched.json`:
`power_states`, one per instruction in Merak's MergeP2PTrainSchedule order) and time every forward
and backward between two `cuda.synchronize()` calls (`N.prof.json`: `time_breakdown`). An instruction
whose clock differs from the one before runs its first L ms at the old clock, so it takes
t_new - L (t_new / t_old - 1), with t_new, t_old the same instruction's time on the same rank when the
clock did not change (their medians over every plan). Each change thus gives one estimate of L,
blurred by the instruction's run-to-run noise (the spread of the unchanged instructions, divided by
|t_new / t_old - 1|). The model fitted by maximum likelihood to all of them, that noise deconvolved:
L lognormal, its median m0 for a target at or below the voltage knee and m0 (1 + slope x) above it
(x: the target's share of the way from the knee to the max clock, as the virtual GPU's
`clock_target_slope`), plus an outlier share spread evenly over what an instruction can show.
Only changes whose time ratio moves by >= `--min-ratio` (default 10 %) are used.

Prints per model the number of changes used and the raw percentiles of L for steps up and down,
then the fit: `fit: m0 M ms, sigma S, slope K, outliers W %; body p5-p95 at or below the knee A-B ms`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, stats

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "perseus-sosp24"
RUNS = "perseus/A100/dp1+pp4+tp1"
KNEE_MHZ, FMAX_MHZ = 1097.0, 1410.0  # conf/gpu/a100.yaml: the virtual A100's knee and max clock
OUTLIER_MS = (-100.0, 200.0)  # the outlier component's range: what an instruction of ~40-400 ms can show


def merak_order(stages: int, stage: int, micro: int) -> list[str]:
    """Merak's MergeP2PTrainSchedule on one stage, one letter per instruction: P (a P2P send/receive),
    L (load a micro-batch), F, B, C (reduce gradients), O (optimizer step). Perseus's `power_states`
    has one entry per instruction in this order."""
    out: list[str] = []
    prev = -1

    def valid(m: int) -> bool:
        return 0 <= m < micro

    steps = 2 * (micro + stages - 1)
    for step in range(steps):
        even_step, even_stage = step % 2 == 0, stage % 2 == 0
        if even_step == even_stage:  # a forward step
            mb, fwd = (step if even_step else step - 1) // 2 - stage // 2, True
        elif even_step:
            mb, fwd = step // 2 - stages + (stage + 1) // 2, False
        else:
            mb, fwd = (step - 1) // 2 - stages + 1 + stage // 2, False
        neighbour = stage > 0 if fwd else stage < stages - 1
        if neighbour and (valid(mb) or valid(prev)):
            out.append("P")
        if fwd and valid(mb) and stage in (0, stages - 1):
            out.append("L")
        if valid(mb):
            out.append("F" if fwd else "B")
        if step == steps - 1:
            out += ["C", "C", "O"]
        prev = mb
    return out


@dataclass
class Change:
    """One instruction that ran right after its clock was changed."""

    model: str
    rank: int
    kind: str  # F or B
    f_from: int
    f_to: int
    t_ms: float  # measured
    t_new_ms: float  # unchanged-clock median at f_to
    t_old_ms: float  # ... at f_from
    noise_ms: float  # run-to-run spread of this (rank, kind)'s unchanged instructions

    @property
    def q(self) -> float:
        return self.t_new_ms / self.t_old_ms - 1.0

    @property
    def latency_ms(self) -> float:
        return (self.t_new_ms - self.t_ms) / self.q

    @property
    def sd_ms(self) -> float:
        return self.noise_ms / abs(self.q)


def read_model(folder: Path) -> list[tuple[int, str, int, int, int, float]]:
    """(rank, kind, clock, clock before, clock two before, time s) of every forward and backward of
    every plan, the warm-up iteration left out."""
    micro = int(re.search(r"nmb(\d+)", folder.name).group(1))  # type: ignore[union-attr]
    stages = int(re.search(r"pp(\d+)", folder.name).group(1))  # type: ignore[union-attr]
    out = []
    for sched_file in sorted(folder.glob("*.sched.json.gz")):
        prof_file = folder / sched_file.name.replace(".sched.", ".prof.")
        sched = json.loads(gzip.open(sched_file).read())
        prof = {r["rank"]: r for r in json.loads(gzip.open(prof_file).read())}
        for r in sched:
            rank, ps = r["rank"], r["power_states"]
            order = merak_order(stages, rank, micro)
            if len(order) != len(ps):
                raise ValueError(f"{sched_file}: rank {rank} has {len(ps)} power states, Merak's order {len(order)}")
            for kind, key in (("F", "forward"), ("B", "backward")):
                idx = [i for i, k in enumerate(order) if k == kind]
                for times in prof[rank]["time_breakdown"][key][1:]:
                    if len(times) != len(idx):
                        raise ValueError(f"{prof_file}: rank {rank}: {len(times)} {key} times for {len(idx)}")
                    out += [(rank, kind, ps[i], ps[i - 1], ps[i - 2], t) for i, t in zip(idx, times)]
    return out


def changes(model: str, rows: list[tuple[int, str, int, int, int, float]], min_ratio: float) -> list[Change]:
    """The instructions whose clock changed from a clock held for the instruction before (so the old
    clock had landed), with the unchanged-clock medians to compare them with."""
    steady: dict[tuple[int, str, int], list[float]] = {}
    for rank, kind, f, p1, p2, t in rows:
        if f == p1 == p2:
            steady.setdefault((rank, kind, f), []).append(t * 1e3)
    med = {k: float(np.median(v)) for k, v in steady.items()}
    noise: dict[tuple[int, str], list[float]] = {}
    for (rank, kind, f), v in steady.items():
        noise.setdefault((rank, kind), []).extend(np.asarray(v) - med[(rank, kind, f)])
    # a robust spread (MAD): the few slow outliers are the outlier component's, not the noise's
    sd = {k: 1.4826 * float(np.median(np.abs(v))) for k, v in noise.items()}
    out = []
    for rank, kind, f, p1, p2, t in rows:
        if f != p1 and p1 == p2 and (rank, kind, f) in med and (rank, kind, p1) in med:
            c = Change(model, rank, kind, p1, f, t * 1e3, med[(rank, kind, f)], med[(rank, kind, p1)], sd[(rank, kind)])
            if abs(c.q) >= min_ratio:
                out.append(c)
    return out


def target_share(f_to: np.ndarray) -> np.ndarray:
    return np.clip((f_to - KNEE_MHZ) / (FMAX_MHZ - KNEE_MHZ), 0.0, None)


GRID = np.geomspace(0.05, 300.0, 240)  # true latency (ms) the likelihood integrates over


def neg_log_likelihood(params: np.ndarray, lat: np.ndarray, sd: np.ndarray, share: np.ndarray) -> float:
    """-log L of the observed estimates: lognormal latency (median m0 (1 + slope x), shape sigma)
    convolved with each estimate's Gaussian noise, mixed with a uniform outlier share w."""
    log_m0, log_sigma, slope, logit_w = params
    if slope < 0:
        return 1e18
    sigma, w = float(np.exp(log_sigma)), 1.0 / (1.0 + float(np.exp(-logit_w)))
    med = np.exp(log_m0) * (1.0 + slope * share)
    dens = stats.lognorm.pdf(GRID[None, :], sigma, scale=med[:, None])  # (n, grid)
    noise = stats.norm.pdf(lat[:, None], loc=GRID[None, :], scale=sd[:, None])
    body = np.trapezoid(dens * noise, GRID, axis=1)
    lo, hi = OUTLIER_MS
    p = (1 - w) * body + w / (hi - lo)
    return float(-np.log(np.maximum(p, 1e-300)).sum())


def fit(cs: list[Change]) -> dict[str, float]:
    lat = np.array([c.latency_ms for c in cs])
    sd = np.array([c.sd_ms for c in cs])
    share = target_share(np.array([c.f_to for c in cs], dtype=float))
    x0 = np.array([np.log(4.0), np.log(0.5), 2.0, -3.0])
    res = optimize.minimize(
        neg_log_likelihood,
        x0,
        args=(lat, sd, share),
        method="Nelder-Mead",
        options={"xatol": 1e-4, "fatol": 1e-3, "maxiter": 4000},
    )
    log_m0, log_sigma, slope, logit_w = res.x
    m0, sigma = float(np.exp(log_m0)), float(np.exp(log_sigma))
    z = stats.norm.ppf(0.95)
    return {
        "m0_ms": m0,
        "sigma": sigma,
        "slope": float(slope),
        "outlier_share": float(1.0 / (1.0 + np.exp(-logit_w))),
        "p5_ms": m0 * float(np.exp(-z * sigma)),
        "p95_ms": m0 * float(np.exp(z * sigma)),
        "n": len(cs),
        "converged": bool(res.success),
    }


def percentiles(v: list[float]) -> str:
    p = np.percentile(v, [5, 25, 50, 75, 95])
    return "p5 {:.1f}, p25 {:.1f}, p50 {:.1f}, p75 {:.1f}, p95 {:.1f} ms".format(*p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--min-ratio", type=float, default=0.10)
    ap.add_argument("--json", type=Path, default=None, help="also write every estimate and the fit here")
    a = ap.parse_args(argv)
    folders = sorted((a.data / RUNS).glob("merak+*"))
    if not folders:
        print(f"perseus_clock_latency: {a.data / RUNS}: no Merak runs (merak+*) there", file=sys.stderr)
        return 2
    every: list[Change] = []
    for folder in folders:
        model = folder.name.split("+")[1]
        cs = changes(model, read_model(folder), a.min_ratio)
        every += cs
        line = f"{model}: {len(cs)} clock changes used"
        for name, keep in (("up", lambda c: c.f_to > c.f_from), ("down", lambda c: c.f_to < c.f_from)):
            v = [c.latency_ms for c in cs if keep(c)]
            if v:
                targets = sorted({c.f_to for c in cs if keep(c)})
                line += f"; {name} ({len(v)}, to {targets[0]}-{targets[-1]} MHz): {percentiles(v)}"
        print(line)
    if not every:
        print("perseus_clock_latency: no clock change moved an instruction's time enough", file=sys.stderr)
        return 1
    f = fit(every)
    print(
        f"fit: m0 {f['m0_ms']:.2f} ms, sigma {f['sigma']:.3f}, slope {f['slope']:.2f}, outliers "
        f"{100 * f['outlier_share']:.2f} %; body p5-p95 at or below the knee {f['p5_ms']:.2f}-{f['p95_ms']:.2f} ms "
        f"({f['n']} changes)"
    )
    if a.json:
        a.json.write_text(json.dumps({"fit": f, "changes": [c.__dict__ for c in every]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
