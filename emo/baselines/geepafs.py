"""GEEPAFS baseline: online, performance-assured SM-clock selection from sampled utilisation.

Re-implemented from the paper (Zhang et al., "Improving GPU Energy Efficiency through an
Application-transparent Frequency Scaling Policy with Performance Assurance", EuroSys '24,
Algorithms 1-2) and, where the paper leaves a detail open, the authors' code
(github.com/zyjopensource/geepafs). Every control period T1 (`period_ms`), on each GPU:

1. probing: the probe clocks F are visited low -> high -> low (`samples_per_clock` visits of each,
   M samples in all), each for one sample interval T2 (`sample_ms`); at its end the loop reads what
   NVML reports: GPU utilisation G and memory(-bandwidth) utilisation U (NVML's utilisation samples
   of the interval, `Device.utilization_samples`) and the power P (energy counter over the interval);
2. the fold line (Eq. 1): U(f) = a1 f + b1 below a critical clock f_c, a2 f + b2 above it, two
   sloped segments, least squares over every split of the probe clocks (a split's crossing outside
   its gap is pinned to the gap's lower clock); one line over all samples competes, and a fold needs
   a1 > a2. U is proportional to throughput (the paper's GPUbwUt-performance correlation);
3. f_bound, the lowest clock whose modelled throughput is >= (1 - delta) of the max clock's
   (Algorithm 2); f_eff, the probe clock of the highest modelled throughput per watt of sampled
   power; f_cap = (1 - delta) f_max max_i G(f_i), the utilisation cap; and
   f_opt = min(max(f_bound, f_eff), f_cap) (Algorithm 1), within [floor, f_max], rounded up to a
   supported clock. When memory utilisation is below `min_memory_utilization` or the fit's RMS error
   above `max_fit_error`, the model is dropped: f_bound = f_max, f_eff = the lowest probe clock;
4. hold f_opt for the rest of the period (T1 - M T2), then probe again.

The budget is a slowdown: throughput >= 1 / (1 + budget), so 1 - delta = 1 / (1 + budget). A device
runs whole iterations, so an interval is the fewest iterations spanning it at the max clock
(timed by one pilot iteration). The first period starts the loop (its cost: `explore`); the steady
state validate scores is the next `periods` whole periods, probing included, as the loop repeats it.

    fit_fold_line(clocks, util) -> FoldLine
    choose_clock(line, budget, supported, floor, probes, power, gpu_util, ...) -> (clock, why)
    run_geepafs(device, workload, devices, budget, options, min_clock_fraction=, iterations=, warmup=) -> OnlineResult
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from emo.baselines.online import OnlineResult, PhaseTotals
from emo.device import Device, RunResult
from emo.errors import ConfigError
from emo.methods import OnlineContext
from emo.policy import FrequencyPolicy, Step

if TYPE_CHECKING:
    from emo.sections import GeepafsOptions

log = logging.getLogger("emo.baselines.geepafs")


@dataclass(frozen=True)
class FoldLine:
    """U(f) = a1 f + b1 for f < f_c, a2 f + b2 for f >= f_c (one line: f_c = inf); `f_lo`, the
    lowest probed clock; `sse`, the squared error over the samples it was fitted to."""

    a1: float
    b1: float
    a2: float
    b2: float
    f_c: float
    f_lo: float
    sse: float
    samples: int

    @property
    def rms(self) -> float:
        return math.sqrt(self.sse / max(self.samples, 1))

    def __call__(self, f: np.ndarray | float) -> np.ndarray | float:
        f = np.asarray(f, float)
        return np.where(f < self.f_c, self.a1 * f + self.b1, self.a2 * f + self.b2)

    def throughput(self, f: np.ndarray | float) -> np.ndarray | float:
        """Modelled throughput (in utilisation units), never rising as the clock falls, as the authors
        read the model: a falling first segment means the lowest probe's throughput everywhere, a
        falling second one that it saturates at f_c."""
        f = np.asarray(f, float)
        if self.a1 <= 0:
            return np.full(f.shape, float(self(self.f_lo)))
        if self.a2 <= 0:
            return np.minimum(self.a1 * f + self.b1, self.a1 * self.f_c + self.b1)
        return self(f)


def _line(f: np.ndarray, u: np.ndarray) -> tuple[float, float, float]:
    """(slope, intercept, sse) of the least-squares line."""
    slope, icpt = np.polyfit(f, u, 1)
    return float(slope), float(icpt), float(((slope * f + icpt - u) ** 2).sum())


def _pinned_fold(f: np.ndarray, u: np.ndarray, lo: np.ndarray, xc: float) -> tuple[float, float, float, float, float]:
    """(a1, b1, a2, b2, sse): the least-squares fold line whose segments meet at xc."""
    a = np.where(
        lo[:, None],
        np.stack([f, np.ones_like(f), np.zeros_like(f)], 1),
        np.stack([np.full_like(f, xc), np.ones_like(f), f - xc], 1),
    )
    (a1, b1, a2), *_ = np.linalg.lstsq(a, u, rcond=None)
    b2 = b1 + xc * (a1 - a2)
    return float(a1), float(b1), float(a2), float(b2), float(((a @ np.array([a1, b1, a2]) - u) ** 2).sum())


def fit_fold_line(clocks: Sequence[float] | np.ndarray, util: Sequence[float] | np.ndarray) -> FoldLine:
    """Least-squares fold line through (clock, utilisation) samples (clocks may repeat): one line
    over all, against every split of the distinct clocks into >= 2 low and >= 2 high ones, two lines
    meeting between the split's clocks (or pinned at its lower clock), the first steeper."""
    f = np.asarray(clocks, float)
    u = np.asarray(util, float)
    levels = np.unique(f)
    if f.shape != u.shape or levels.size < 2:
        raise ValueError("fit_fold_line: need samples at >= 2 distinct clocks, as many clocks as samples")
    a, b, sse = _line(f, u)
    best = FoldLine(a, b, a, b, math.inf, float(levels[0]), sse, f.size)
    for turn in range(2, levels.size - 1):
        lo = f < levels[turn]
        a1, b1, s1 = _line(f[lo], u[lo])
        a2, b2, s2 = _line(f[~lo], u[~lo])
        cross = (b1 - b2) / (a2 - a1) if a2 != a1 else -1.0
        if levels[turn - 1] <= cross <= levels[turn]:
            sse = s1 + s2
        else:
            cross = float(levels[turn - 1])
            a1, b1, a2, b2, sse = _pinned_fold(f, u, lo, cross)
        if a1 > a2 and sse < best.sse - 1e-15:
            best = FoldLine(a1, b1, a2, b2, float(cross), float(levels[0]), sse, f.size)
    return best


def choose_clock(
    line: FoldLine | None,
    budget: float,
    supported: Sequence[int],
    floor_mhz: float,
    probes: Sequence[int],
    power_w: Sequence[float],
    gpu_util: Sequence[float],
) -> tuple[int, dict]:
    """(f_opt, its parts): f_opt = min(max(f_bound, f_eff), f_cap) within [floor, f_max], rounded up
    to a supported clock. `probes` ascending; `power_w`, `gpu_util`: their mean samples. `line`
    None: no usable model (f_bound = f_max, f_eff = the lowest probe)."""
    clocks = np.asarray(sorted(supported), float)
    f_max = float(clocks[-1])
    keep = 1.0 / (1.0 + budget)  # 1 - delta
    probes_f = np.asarray(probes, float)
    if line is None:
        f_bound, f_eff = f_max, float(probes_f[0])
    else:
        thr = keep * float(line.throughput(f_max))
        ok = clocks[np.asarray(line.throughput(clocks)) >= thr - 1e-12]
        f_bound = float(ok[0]) if ok.size else f_max
        eff = np.asarray(line.throughput(probes_f)) / np.maximum(np.asarray(power_w, float), 1e-9)
        f_eff = float(probes_f[int(np.argmax(eff))])
    f_cap = keep * f_max * float(max(gpu_util))
    f_opt = min(max(max(f_bound, f_eff), floor_mhz), f_max)
    f_opt = max(min(f_opt, f_cap), floor_mhz)
    up = clocks[clocks >= f_opt - 1e-9]
    pick = int(up[0]) if up.size else int(f_max)
    return pick, {"f_bound": f_bound, "f_eff": f_eff, "f_cap": f_cap, "model": line is not None}


def probe_clocks(supported: Sequence[int], fractions: Sequence[float]) -> list[int]:
    """Supported clocks nearest to the given fractions of the highest one, ascending."""
    clocks = np.asarray(sorted(supported))
    return sorted({int(clocks[np.abs(clocks - fr * clocks[-1]).argmin()]) for fr in fractions})


def probe_schedule(probes: Sequence[int], samples_per_clock: int) -> list[int]:
    """The probing phase's clocks, one per sample: up the list, down again, ... (the authors' zigzag,
    which spreads each clock's samples over the phase)."""
    up = list(probes)
    return [(up if i % 2 == 0 else up[::-1])[j] for i in range(samples_per_clock) for j in range(len(up))]


def _policy(gpu: str, clocks: dict[int, int]) -> FrequencyPolicy:
    return FrequencyPolicy(gpu=gpu, steps={d: [Step(0.0, int(f))] for d, f in clocks.items()})


def _sampled(device: Device, d: int, kind: str) -> float:
    """NVML's utilisation over one sample interval: the mean of its samples (T2 is about one NVML
    sample period, so on hardware the reading at its end covers it; a run of whole iterations
    always starts at an iteration's start, and its last sample alone would always see the same
    phase of the iteration)."""
    samples = device.utilization_samples(d)[kind]
    if not samples:
        raise ValueError(
            "optimizer.geepafs.sample_ms: a sample interval spans no whole utilisation sample "
            "period of the device; raise it"
        )
    return float(np.mean([v for _, v in samples]))


class _Tally:
    """Adds up the runs of a stretch of the loop into one RunResult (its iterations' own time and
    energy, as a continuous run would measure them)."""

    def __init__(self) -> None:
        self.iterations, self.time_s, self.energy_j = 0, 0.0, 0.0
        self.per_device: dict[int, float] = {}
        self.times: list[float] = []

    def add(self, run: RunResult) -> RunResult:
        self.iterations += run.iterations
        self.time_s += run.time_s
        self.energy_j += run.energy_j
        self.times += list(run.iteration_times_s)
        for d, e in run.energy_per_device_j.items():
            self.per_device[d] = self.per_device.get(d, 0.0) + e
        return run

    def result(self) -> RunResult:
        return RunResult(
            iterations=self.iterations,
            time_s=self.time_s,
            energy_j=self.energy_j,
            iteration_times_s=self.times,
            energy_per_device_j=dict(self.per_device),
        )


def _probe_samples(
    device: Device, workload: Any, devices: Sequence[int], schedule: list[int], k_sample: int, probe: _Tally
) -> dict[int, dict[str, list[float]]]:
    """A period's probing phase: per device, each probe's clock, memory and GPU utilisation and power."""
    samples: dict[int, dict[str, list[float]]] = {
        d: {"mhz": [], "memory": [], "gpu": [], "power_w": []} for d in devices
    }
    for f in schedule:
        device.set_policy(_policy(device.name, {d: f for d in devices}))
        run = probe.add(device.run(workload, k_sample, warmup=0))
        for d in devices:
            s = samples[d]
            s["mhz"].append(f)
            s["memory"].append(_sampled(device, d, "memory"))
            s["gpu"].append(_sampled(device, d, "gpu"))
            s["power_w"].append(run.energy_per_device_j.get(d, 0.0) / max(run.time_s, 1e-12))
    return samples


def _choose(
    samples: dict[str, list[float]],
    probes: list[int],
    budget: float,
    supported: list[int],
    floor: float,
    options: GeepafsOptions,
) -> tuple[int, dict]:
    """One device's clock for the period's holding phase from its probes (the fold line of its memory
    utilisation when memory-bound enough and well fitted), and the period's record of it."""
    arr = {k: np.asarray(v, float) for k, v in samples.items()}
    mean = {k: [float(arr[k][arr["mhz"] == f].mean()) for f in probes] for k in ("power_w", "gpu", "memory")}
    line = None
    if arr["memory"].mean() >= float(options.min_memory_utilization):
        line = fit_fold_line(arr["mhz"], arr["memory"])
        if line.rms > float(options.max_fit_error):
            line = None
    clock, parts = choose_clock(line, budget, supported, floor, probes, mean["power_w"], mean["gpu"])
    fold = (
        None
        if line is None
        else {"a1": line.a1, "b1": line.b1, "a2": line.a2, "b2": line.b2, "f_c": line.f_c, "rms": line.rms}
    )
    return clock, {
        "clock": clock,
        **parts,
        "memory": mean["memory"],
        "gpu": mean["gpu"],
        "power_w": mean["power_w"],
        "fold": fold,
    }


def run_geepafs(
    device: Device,
    workload: Any,
    devices: Sequence[int],
    budget: float,
    options: GeepafsOptions,
    *,
    min_clock_fraction: float,
    iterations: int,
    warmup: int,
) -> OnlineResult:
    """Run the GEEPAFS loop: one period to start, then `options.periods` periods (more until they
    hold `iterations` iterations) measured as its steady state, probing included; no clock below
    `min_clock_fraction` of the max."""
    if not callable(getattr(device, "utilization_samples", None)):
        raise ConfigError(
            f"optimizer=geepafs needs a device with utilization_samples() (NVML's utilisation "
            f"samples); {type(device).__name__} has none"
        )
    supported = device.supported_clocks()
    probes = probe_clocks(supported, options.probe_fractions)
    if len(probes) < 2:
        raise ConfigError("optimizer.geepafs.probe_fractions: need >= 2 distinct clocks")
    schedule = probe_schedule(probes, int(options.samples_per_clock))
    sample_s, period_s = float(options.sample_ms) * 1e-3, float(options.period_ms) * 1e-3
    if period_s <= len(schedule) * sample_s:
        raise ConfigError(
            f"optimizer.geepafs.period_ms: {options.period_ms} does not exceed the probing "
            f"phase ({len(schedule)} samples x sample_ms={options.sample_ms})"
        )
    floor = float(min_clock_fraction) * max(supported)
    name = device.name
    device.set_policy(None)  # one pilot iteration at the max clock times the intervals
    start = _Tally()
    pilot = start.add(device.run(workload, 1, warmup=int(warmup)))
    t_iter = pilot.time_s / max(pilot.iterations, 1)
    k_sample = max(1, math.ceil(sample_s / t_iter))
    k_hold = max(1, math.ceil((period_s - len(schedule) * sample_s) / t_iter))

    history: list[dict] = []
    chosen: dict[int, int] = {}

    def period(index: int, probe: _Tally, hold: _Tally) -> None:
        samples = _probe_samples(device, workload, devices, schedule, k_sample, probe)
        record: dict = {"period": index}
        for d in devices:
            chosen[d], record[str(d)] = _choose(samples[d], probes, budget, supported, floor, options)
        history.append(record)
        device.set_policy(_policy(name, chosen))
        hold.add(device.run(workload, k_hold, warmup=0))

    period(0, start, start)  # the loop's start: its first probing phase has nothing to go on
    probe, hold, steady = _Tally(), _Tally(), _Tally()
    i = 1
    while i <= int(options.periods) or probe.iterations + hold.iterations < int(iterations):
        period(i, probe, hold)
        i += 1
    device.set_policy(None)
    for part in (probe, hold):  # the steady state: whole periods, probing and holding alike
        steady.add(part.result())
    clocks = {str(d): c for d, c in chosen.items()}
    log.info("geepafs: clocks %s (probes %s)", clocks, probes)
    return OnlineResult(
        method="geepafs",
        steady=steady.result(),
        explore=PhaseTotals(time_s=start.time_s, energy_j=start.energy_j),
        setting={
            "clocks": clocks,
            "probes": probes,
            "history": history,
            "sample_iterations": k_sample,
            "hold_iterations": k_hold,
            "measured_periods": i - 1,
            "probe_time_fraction": probe.time_s / max(steady.time_s, 1e-12),
            "probe_energy_fraction": probe.energy_j / max(steady.energy_j, 1e-12),
        },
    )


def run_online(ctx: OnlineContext) -> OnlineResult:
    """optimizer.name=geepafs (emo.methods): its options are the optimizer's `geepafs` section."""
    return run_geepafs(
        ctx.device,
        ctx.workload,
        ctx.devices,
        ctx.budget,
        ctx.optimizer.geepafs,
        min_clock_fraction=ctx.optimizer.min_clock_fraction,
        iterations=ctx.iterations,
        warmup=ctx.warmup,
    )
