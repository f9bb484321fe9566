"""GEEPAFS baseline: online, performance-aware SM-clock selection from memory-bandwidth utilisation.

Re-implemented from the paper's control loop (no public package): every control period it probes a
few SM clocks for a short window each, reading the GPU's memory(-bandwidth) utilisation (what
`nvmlDeviceGetUtilizationRates().memory` reports). Utilisation is a proxy of throughput, and versus
the clock it follows a fold line: rising in proportion to the clock while the SMs limit progress,
flat once memory bandwidth does,

    u(f) = min(b + a * f, c).

With the fitted line it picks the lowest supported clock whose predicted throughput stays within the
performance target, u(f) >= c / (1 + budget), i.e. f = (c / (1 + budget) - b) / a, holds it for the rest
of the period, and starts over (phases change, so it keeps probing). Each GPU is tuned on its own
utilisation. The probe window here is one iteration (the device runs whole iterations); the steady
state is measured at the clocks it settles on, and the probing reported as its overhead.

    fit_fold_line(clocks, util) -> FoldLine
    run_geepafs(device, workload, devices, budget, options) -> OnlineResult
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from emo.baselines.online import OnlineResult, PhaseMeter
from emo.policy import FrequencyPolicy, Step

log = logging.getLogger("emo.baselines.geepafs")


@dataclass(frozen=True)
class FoldLine:
    """u(f) = min(intercept + slope * f, plateau)."""

    slope: float  # utilisation per MHz on the rising part
    intercept: float
    plateau: float  # utilisation once memory-bound
    sse: float

    @property
    def knee_mhz(self) -> float:
        return (self.plateau - self.intercept) / self.slope if self.slope > 0 else 0.0

    def __call__(self, f: np.ndarray | float) -> np.ndarray | float:
        return np.minimum(self.intercept + self.slope * np.asarray(f, float), self.plateau)


def _line(f: np.ndarray, u: np.ndarray) -> tuple[float, float]:
    """(slope, intercept): least squares with an intercept from >= 2 points, through the origin from 1."""
    if f.size >= 2 and np.ptp(f) > 0:
        slope, intercept = np.polyfit(f, u, 1)
        return float(slope), float(intercept)
    return float(u[0] / f[0]) if f[0] > 0 else 0.0, 0.0


def fit_fold_line(clocks: Sequence[float], util: Sequence[float]) -> FoldLine:
    """Least-squares fit of the fold line: every split of the probes (sorted by clock) into a rising
    part (a line) and a flat part (their mean) gives a candidate; the one whose fold line fits all
    probes best wins. All probes flat: the knee is at or below the lowest probe."""
    f = np.asarray(clocks, float)
    u = np.asarray(util, float)
    if f.shape != u.shape or f.size < 2:
        raise ValueError("fit_fold_line: need >= 2 (clock, utilisation) probes of equal length")
    order = np.argsort(f)
    f, u = f[order], u[order]
    best: FoldLine | None = None
    for j in range(f.size + 1):  # probes [j:] on the plateau
        if j == 0:
            c = float(u.mean())
            slope, icpt = (c / f[0] if f[0] > 0 else 0.0), 0.0
        else:
            slope, icpt = _line(f[:j], u[:j])
            c = float(u[j:].mean()) if j < f.size else icpt + slope * f[-1]
        if slope <= 0 or c <= 0:
            continue
        line = FoldLine(slope, icpt, c, 0.0)
        sse = float(((line(f) - u) ** 2).sum())
        if best is None or sse < best.sse - 1e-15:
            best = FoldLine(slope, icpt, c, sse)
    if best is None:  # no rising signal (idle, or utilisation falling with the clock): any clock will do
        return FoldLine(0.0, 0.0, float(u.max(initial=0.0)), 0.0)
    return best


def choose_clock(line: FoldLine, budget: float, supported: Sequence[int], floor_mhz: int) -> int:
    """The lowest supported clock (>= floor) whose fold-line throughput is within the target."""
    clocks = np.asarray(sorted(supported), float)
    if line.slope <= 0:
        return int(clocks[clocks >= floor_mhz][0]) if (clocks >= floor_mhz).any() else int(clocks[-1])
    need = (line.plateau / (1.0 + budget) - line.intercept) / line.slope
    ok = clocks[(clocks >= need - 1e-9) & (clocks >= floor_mhz)]
    return int(ok[0]) if ok.size else int(clocks[-1])


def probe_clocks(supported: Sequence[int], fractions: Sequence[float]) -> list[int]:
    """Supported clocks nearest to the given fractions of the highest one, highest first."""
    clocks = np.asarray(sorted(supported))
    picks = {int(clocks[np.abs(clocks - fr * clocks[-1]).argmin()]) for fr in fractions}
    return sorted(picks, reverse=True)


def _policy(gpu: str, clocks: dict[int, int]) -> FrequencyPolicy:
    return FrequencyPolicy(gpu=gpu, steps={d: [Step(0.0, int(f))] for d, f in clocks.items()})


def _utilization(device: Any, d: int) -> float:
    read = getattr(device, "utilization", None)
    if not callable(read):
        raise ValueError(f"optimizer=geepafs needs a device with utilization() (memory-bandwidth utilisation); "
                         f"{type(device).__name__} has none")
    return float(read(d)["memory"])


def run_geepafs(device: Any, workload: Any, devices: Sequence[int], budget: float, options: dict) -> OnlineResult:
    """Run the GEEPAFS loop for `options['periods']` control periods (probe, fit, hold), then measure
    `options['iterations']` iterations at the clocks it holds. Probing is a recurring cost: it is
    reported as `explore` (time and energy of the probe iterations) and as the probes' share of the
    loop's time, `probe_time_fraction`."""
    supported = device.supported_clocks()
    probes = probe_clocks(supported, options["probe_fractions"])
    if len(probes) < 2:
        raise ValueError("optimizer.geepafs.probe_fractions: need >= 2 distinct clocks")
    floor = int(options["min_clock_fraction"] * max(supported))
    name = device.name
    history = []
    meter = PhaseMeter(device, devices)
    chosen: dict[int, int] = {}
    for period in range(options["periods"]):
        util: dict[int, list[float]] = {d: [] for d in devices}
        with meter.phase("probe"):
            for f in probes:
                device.set_policy(_policy(name, {d: f for d in devices}))
                device.run(workload, 1, warmup=0)
                for d in devices:
                    util[d].append(_utilization(device, d))
        lines = {d: fit_fold_line(probes, util[d]) for d in devices}
        chosen = {d: choose_clock(lines[d], budget, supported, floor) for d in devices}
        history.append({"period": period, "clocks": {str(d): c for d, c in chosen.items()},
                        "util": {str(d): u for d, u in util.items()},
                        "knee_mhz": {str(d): ln.knee_mhz for d, ln in lines.items()}})
        device.set_policy(_policy(name, chosen))
        with meter.phase("hold"):
            device.run(workload, options["hold_iterations"], warmup=0)
    steady = device.run(workload, options["iterations"], warmup=options["warmup"])
    device.set_policy(None)
    probe, hold = meter.totals("probe"), meter.totals("hold")
    log.info("geepafs: clocks %s (probes %s)", history[-1]["clocks"], probes)
    return OnlineResult(method="geepafs", steady=steady, explore=probe,
                        setting={"clocks": history[-1]["clocks"], "probes": probes, "history": history,
                                 "probe_time_fraction": probe.time_s / max(probe.time_s + hold.time_s, 1e-12)})
