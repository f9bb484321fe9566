"""The configuration's sections as dataclasses (Hydra's structured schema, registered by
emo.config.register) and `typed`, which turns a composed section (plain data) into its dataclass.

Every key is typed here and has its one default here: `conf/config.yaml` only picks the groups, and a
group file (`conf/gpu/*.yaml`, ...) holds only what that choice sets. A leaf: the models, the optimizer
and the baselines take these sections, and must not import what emo.config checks a configuration
with (the workload kinds, emo.workloads: pyproject.toml's import contracts).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import MISSING

from emo.errors import ConfigError
from emo.schema import NON_EMPTY, WorkloadConfig, above, at_least, between, one_of

CLOCKS = {
    "allowed": (
        lambda v: all(c > 0 for c in v) and list(v) == sorted(set(v)),
        "an ascending list of clocks > 0 (MHz); empty only on NVML, which reports them",
    )
}
LATENCY_RANGE = {
    "allowed": (lambda v: len(v) == 2 and 0 <= v[0] <= v[1], "[min, max] with 0 <= min <= max (ms)"),
    "nullable": True,
}  # null: what the calibration measured
FRACTIONS = {
    "allowed": (
        lambda v: len(v) > 0 and all(0 < x <= 1 for x in v),
        "a non-empty list of fractions in (0, 1] of the max clock",
    )
}
RANK_SAMPLE = {
    "allowed": (
        lambda v: (
            v in ("all", "replica")
            or (isinstance(v, str) and v != "" and all(p.strip().replace("-", "", 1).isdigit() for p in v.split(",")))
            or (
                isinstance(v, list | tuple)
                and len(v) > 0
                and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in v)
            )
        ),
        'all, replica, or a list of ranks ([0,1,8,9] or "0-7,64-71")',
    )
}
PERCENTILES = {"allowed": (lambda v: len(v) == 2 and 0 <= v[0] <= v[1] <= 100, "[lo, hi] with 0 <= lo <= hi <= 100")}


# --------------------------------------------------------------------------- GPU models
@dataclass
class GpuConfig:
    name: str = MISSING  # model key, e.g. "a100"
    backend: str = field(
        default="sim", metadata=one_of("sim", "nvml")
    )  # "sim" (virtual GPU) or "nvml" (real NVIDIA GPU)
    clocks_mhz: list[int] = field(default_factory=list, metadata=CLOCKS)  # supported SM clocks, ascending
    default_mhz: int = field(
        default=MISSING, metadata=at_least(0)
    )  # clock the GPU runs at when unlocked (the baseline: max clock)
    memory_mhz: int = field(default=0, metadata=at_least(0))
    tdp_w: float = field(default=MISSING, metadata=at_least(0))
    seed: int = field(default=0, metadata=at_least(0))  # virtual GPU: deterministic per seed
    noise: float = field(
        default=1.0, metadata=at_least(0)
    )  # virtual GPU: multiplier of the physics block's noise sizes (noise_* keys; 1 = the published sizes, 0 = off)
    physics: dict[str, Any] = field(default_factory=dict)  # virtual GPU physics (emo.device.sim)
    counters: str = field(
        default="ncu", metadata=one_of("ncu", "dcgm", "none")
    )  # virtual GPU: counters as ncu/CUPTI totals ("ncu") or DCGM activity ratios ("dcgm")
    # seconds of the workload at the max clock before profile and validate measure it, unmeasured: a
    # GPU's leakage follows its die temperature, and a job runs warm, not from a cold start
    settle_s: float = field(default=20.0, metadata=at_least(0))


# --------------------------------------------------------------------------- stages
@dataclass
class TraceConfig:
    iterations: int = field(default=3, metadata=at_least(1))  # iterations recorded (after warmup)
    warmup: int = field(default=1, metadata=at_least(0))
    seed: int = field(default=0, metadata=at_least(0))
    # what records the traced iterations (emo.device.CAPTURES): full (torch.profiler, CPU and CUDA
    # activities) or light (runtime calls, GPU activity and the iteration markers: less host cost)
    capture: str = field(default="full", metadata=one_of("full", "light"))
    # the same workload measured untraced right after, at the default clock: the iteration time the
    # graph's host intervals are corrected to (the trace is not the run: docs/analyze.md)
    untraced_iterations: int = field(default=10, metadata=at_least(0))  # 0: not measured, not corrected
    # which ranks are traced and planned from (emo.sampling): all (every rank, as before); replica
    # (data-parallel replica 0); or a list of ranks ([0,1,8,9] or "0-7,64-71") that covers every
    # pipeline stage and TP position. A sample plans once per (stage, TP position) and maps every rank
    # of the job to its class's schedule (policy meta.ranks); needs a tp, pp or hybrid workload
    ranks: Any = field(default="all", metadata=RANK_SAMPLE)


@dataclass
class PackingConfig:
    delta_max_ms: float = field(default=5.0, metadata=above(0))


@dataclass
class ModelConfig:
    # calibration: every clock, 0.3 s per measurement (3 energy-counter updates), twice
    clocks_stride: int = field(default=1, metadata=at_least(1))  # calibrate every n-th supported clock (1 = all)
    min_seconds: float = field(default=0.3, metadata=above(0))  # each measurement spans at least this much counter time
    repeats: int = field(default=2, metadata=at_least(1))
    # clock-request latency: this many (from, to) clock steps, up and down, of several sizes, each timed
    # by clock reads every clock_poll_ms (what the optimizer plans with: OptimizerConfig.transition_ms);
    # enough of them that the rare long stalls show (a few percent of requests), at seconds in all
    clock_latency_steps: int = field(default=400, metadata=at_least(1))
    clock_poll_ms: float = field(default=0.5, metadata=above(0))
    # profile: whole iterations measured at the supported clocks nearest these fractions of the max clock
    # (and at the default), which the fit's time level (per clock) and energy levels match
    level_fractions: list[float] = field(default_factory=lambda: [0.95, 0.85, 0.7], metadata=FRACTIONS)


@dataclass
class ZeusOptions:
    """Zeus's GlobalPowerLimitOptimizer (online; run by validate against the device)."""

    min_power_limit_w: float = field(
        default=100.0, metadata=above(0)
    )  # lowest settable limit when the device cannot say (the sim)
    pl_step_w: int = field(default=25, metadata=at_least(1))  # stride between the power limits it profiles
    wait_steps: int = field(default=1, metadata=at_least(0))
    warmup_steps: int = field(default=2, metadata=at_least(0))  # iterations before each limit's profiling window
    profile_steps: int = field(
        default=10, metadata=at_least(1)
    )  # iterations in each limit's window (long enough for the energy counter)
    max_steps: int = field(default=5000, metadata=at_least(1))  # give up (error) when it has not settled by then


@dataclass
class GeepafsOptions:
    """GEEPAFS's control loop (online; run by validate against the device); the paper's T1, T2, M."""

    probe_fractions: list[float] = field(
        default_factory=lambda: [0.79, 0.86, 0.94, 1.0], metadata=FRACTIONS
    )  # of the max clock (the authors' A100 list: 1110-1410 MHz)
    samples_per_clock: int = field(
        default=2, metadata=at_least(1)
    )  # visits of each probe clock per probing phase (M = this x probes)
    sample_ms: float = field(default=200.0, metadata=above(0))  # T2: one probe sample's interval
    period_ms: float = field(default=15000.0, metadata=above(0))  # T1: the control period (probing, then holding f_opt)
    periods: int = field(
        default=2, metadata=at_least(1)
    )  # control periods measured (probing included), after one to start
    min_memory_utilization: float = field(
        default=0.03, metadata=between(0, 1)
    )  # below it: no model (f_bound = max clock)
    max_fit_error: float = field(
        default=0.08, metadata=at_least(0)
    )  # fold-line RMS error (utilisation) above which the model is dropped


@dataclass
class PerseusOptions:
    """Perseus's online profiling and planning (emo.baselines.perseus; its defaults are Perseus's)."""

    warmup_iters: int = field(default=5, metadata=at_least(0))  # iterations before each clock's measurement
    profile_iters: int = field(default=30, metadata=at_least(1))  # measured iterations per clock
    stop_after_rises: int = field(
        default=5, metadata=at_least(1)
    )  # the top-down sweep stops after this many consecutive energy rises
    p_blocking_w: float = field(
        default=70.0, metadata=at_least(0)
    )  # power of a GPU blocked on P2P (W), taken off the instructions' energy
    max_pd_iterations: int = field(
        default=500, metadata=at_least(1)
    )  # sets lowtime's time quantum (at most 2x this many iterations)


@dataclass
class OptimizerConfig:
    name: str = "emo"  # emo | static (offline: optimize writes a policy) | zeus | geepafs | perseus (online) | an ablation (emo.methods.ABLATIONS)
    change_interval_ms: float = field(default=20.0, metadata=above(0))  # >= min_interval_ms
    change_points: str = field(
        default="passes", metadata=one_of("passes", "grid", "pass")
    )  # "passes": at pass starts, >= change_interval_ms apart; "grid": every change_interval_ms; "pass": at every pass start (one window per pass)
    budget_step_ms: float = field(default=1.0, metadata=above(0))
    min_clock_fraction: float = field(default=0.5, metadata=between(0, 1))
    min_interval_ms: float = field(
        default=10.0, metadata=at_least(0)
    )  # ε: the least time between two clock changes of a GPU
    # a clock request lands [min, max] ms after it is issued: by default the calibration's measured
    # distribution, its transition_percentiles (p10-p90); a [min, max] here overrides the measurement
    transition_ms: list[float] | None = field(default=None, metadata=LATENCY_RANGE)
    transition_percentiles: list[float] = field(default_factory=lambda: [10.0, 90.0], metadata=PERCENTILES)
    budget_solves: int = field(
        default=6, metadata=at_least(1)
    )  # emo: DP solves of the budget search (counts, never seconds: same inputs, same policy)
    predictor_evaluations: int = field(
        default=400, metadata=at_least(0)
    )  # emo: candidate policies the predictor judges in its local search
    perseus_level: str = field(
        default="pass", metadata=one_of("pass", "pack")
    )  # perseus+emo-search: lowtime's unit, a "pass" or a "pack"
    zeus: ZeusOptions = field(default_factory=ZeusOptions)
    geepafs: GeepafsOptions = field(default_factory=GeepafsOptions)
    perseus: PerseusOptions = field(default_factory=PerseusOptions)


@dataclass
class ValidateConfig:
    iterations: int = field(default=5, metadata=at_least(5))  # measured iterations per run, after `warmup`
    min_seconds: float = field(
        default=2.0, metadata=above(0)
    )  # ... and more when needed for the run to span this long (energy-counter resolution)
    warmup: int = field(default=1, metadata=at_least(0))
    pareto_points: int = field(
        default=8, metadata=at_least(0)
    )  # optimizer=static: static clocks measured for the energy-time curve (0: none)


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///${results}/mlflow.db"
    experiment: str = field(default="emo", metadata=NON_EMPTY)


PLAIN = {"plain": True}  # a section typed() leaves a dict: the workload's schema is its kind's (emo.workloads)


@dataclass
class Config:
    gpu: GpuConfig = MISSING
    workload: WorkloadConfig = field(default=MISSING, metadata=PLAIN)
    trace: TraceConfig = field(default_factory=TraceConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    budget: float = field(
        default=0.02, metadata=between(0, 1, hi_open=True)
    )  # allowed slowdown, fraction of the max-clock iteration time (0 = none)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    results: str = field(default="results", metadata=NON_EMPTY)  # artifacts: results/<stage>/<hash>/


T = TypeVar("T")


def typed(cls: type[T], node: Any, where: str | None = None) -> T:
    """The dataclass `cls` of a composed section `node` (a plain dict), its sub-sections typed too:
    what a library takes, converted once where a stage or the CLI calls it. A key missing from
    `node` takes the schema's default; a key the schema lacks, or a required one missing, is a
    ConfigError naming it; but a section of Config (the whole configuration) that `node` lacks is
    None: a stage is handed only the sections it reads. A field marked PLAIN (the workload) keeps
    its dict; an instance of `cls` is returned as it is. `where`: the section's name in messages (by default Config's name for it)."""
    if isinstance(node, cls):
        return node
    prefix = _SECTION.get(cls, "") if where is None else where
    fields, hints = _schema(cls)
    unknown = sorted(set(node) - set(fields))
    if unknown:
        raise ConfigError(f"bad configuration: {prefix + unknown[0]} is not a key of the configuration")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in node and cls is Config:  # a section the stage was not handed (emo.stages): None,
            values[name] = None  # so reading it fails instead of reading a default its hash does not cover
            continue
        if name not in node:
            if f.default is MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"bad configuration: {prefix + name} is required")
            continue
        value, sub = node[name], hints[name]
        if isinstance(value, dict) and _is_schema(sub) and not f.metadata.get("plain"):
            value = typed(sub, value, f"{prefix}{name}.")
        values[name] = value
    return cls(**values)


_SCHEMAS: dict[type, tuple[dict[str, dataclasses.Field], dict[str, Any]]] = {}


def _schema(cls: type) -> tuple[dict[str, dataclasses.Field], dict[str, Any]]:
    """A dataclass's fields by name and their resolved type hints (this module postpones annotations),
    worked out once per class: typed() runs at every library boundary."""
    if cls not in _SCHEMAS:
        _SCHEMAS[cls] = {f.name: f for f in dataclasses.fields(cls)}, typing.get_type_hints(cls)
    return _SCHEMAS[cls]


def _is_schema(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


# a section's name in the composed configuration, for typed()'s messages
_SECTION: dict[type, str] = {t: f"{name}." for name, t in typing.get_type_hints(Config).items() if _is_schema(t)}
