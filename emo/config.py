"""Structured configuration (Hydra ConfigStore): every key is typed, so a typo or a wrong type in an
override fails at once. `conf/*.yaml` hold the values; these dataclasses hold the schema."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


# --------------------------------------------------------------------------- GPU models
@dataclass
class GpuConfig:
    name: str = MISSING  # model key, e.g. "a100"
    backend: str = "sim"  # "sim" (virtual GPU) or "nvml" (real NVIDIA GPU)
    clocks_mhz: list[int] = field(default_factory=list)  # supported SM clocks, ascending
    default_mhz: int = MISSING  # clock the GPU runs at when unlocked (the baseline: max clock)
    memory_mhz: int = 0
    tdp_w: float = MISSING
    seed: int = 0  # virtual GPU: deterministic per seed
    noise: float = 0.0  # virtual GPU: relative std of measurement noise
    physics: dict[str, Any] = field(default_factory=dict)  # virtual GPU physics (emo.device.sim)
    counters: str = "ncu"  # virtual GPU: counters as ncu/CUPTI totals ("ncu") or DCGM activity ratios ("dcgm")


# --------------------------------------------------------------------------- workloads
@dataclass
class WorkloadConfig:
    kind: str = MISSING


@dataclass
class TransformerShape:
    layers: int = 4  # transformer layers per model replica
    hidden: int = 4096
    heads: int = 32
    ffn_mult: int = 4
    seq: int = 2048
    batch: int = 4  # micro-batch size (sequences)
    vocab: int = 50304
    dtype: str = "bf16"


@dataclass
class TPWorkload(WorkloadConfig):
    kind: str = "tp"
    tp: int = 2  # tensor-parallel degree (GPUs)
    chunks: int = 2  # Domino-style split of the batch: all-reduce of chunk i overlaps compute of i+1
    training: bool = True
    model: TransformerShape = field(default_factory=TransformerShape)


@dataclass
class PPWorkload(WorkloadConfig):
    kind: str = "pp"
    pp: int = 4  # pipeline stages (GPUs)
    microbatches: int = 8
    partition: str = "uniform"  # "uniform" or "parameter" (embedding and LM head make stages uneven)
    # a 1.3B GPT (GPT-3 XL shape) with 1-sequence micro-batches: ~0.15 s per step on 4 A100s
    model: TransformerShape = field(default_factory=lambda: TransformerShape(layers=16, hidden=2048, heads=16, batch=1))


@dataclass
class OffloadWorkload(WorkloadConfig):
    kind: str = "offload"
    experts: int = 64  # routed MoE experts, on the CPU (DeepSeek-V2-Lite-like)
    top_k: int = 6
    expert_hidden: int = 1408
    shared_experts: int = 2  # always-on experts, kept on the GPU
    cpu_gflops: float = 800.0  # host compute rate for expert GEMMs
    pcie_gbps: float = 25.0  # host <-> device copy bandwidth (a hint in Program.meta; the simulator's link model decides)
    decode_tokens: int = 8  # tokens generated per iteration
    # seq: tokens already in the KV cache; batch: sequences decoded together
    model: TransformerShape = field(default_factory=lambda: TransformerShape(layers=8, hidden=2048, heads=16, seq=1024,
                                                                             batch=8, vocab=102400))


@dataclass
class RecordedWorkload(WorkloadConfig):
    kind: str = "recorded"
    path: str = MISSING  # a Kineto JSON trace (file or folder of per-rank files) or an nsys SQLite export


@dataclass
class CommandWorkload(WorkloadConfig):
    kind: str = "command"
    command: list[str] = field(default_factory=list)  # e.g. ["python", "train.py"]
    nproc: int = 1  # > 1: launched under torchrun
    wait: int = 5  # profiler schedule: iterations skipped before warmup
    warmup: int = 2
    active: int = 3


# --------------------------------------------------------------------------- stages
@dataclass
class TraceConfig:
    iterations: int = 3  # iterations recorded (after warmup)
    warmup: int = 1
    seed: int = 0


@dataclass
class PackingConfig:
    delta_max_ms: float = 5.0


@dataclass
class ModelConfig:
    clocks_stride: int = 1  # calibrate every n-th supported clock (1 = all)
    min_seconds: float = 1.0  # each microbenchmark measurement spans at least this much counter time
    repeats: int = 3


@dataclass
class ZeusOptions:
    """Zeus's GlobalPowerLimitOptimizer (online; run by validate against the device)."""

    min_power_limit_w: float = 100.0  # lowest settable limit when the device cannot say (the sim)
    pl_step_w: int = 25  # stride between the power limits it profiles
    wait_steps: int = 1
    warmup_steps: int = 2  # iterations before each limit's profiling window
    profile_steps: int = 10  # iterations in each limit's window (long enough for the energy counter)
    max_steps: int = 5000  # give up (error) when it has not settled by then


@dataclass
class GeepafsOptions:
    """GEEPAFS's probing loop (online; run by validate against the device)."""

    probe_fractions: list[float] = field(default_factory=lambda: [1.0, 0.85, 0.7, 0.55])  # of the max clock
    hold_iterations: int = 8  # iterations at the chosen clock before probing again
    periods: int = 2  # control periods measured


@dataclass
class OptimizerConfig:
    name: str = "emo"  # emo | static | perseus (offline: optimize writes a policy) | zeus | geepafs (online)
    change_interval_ms: float = 20.0
    change_points: str = "passes"  # "passes": at pass starts, >= change_interval_ms apart; "grid": every change_interval_ms
    budget_step_ms: float = 1.0
    min_clock_fraction: float = 0.5
    min_interval_ms: float = 10.0  # ε: the least time between two clock changes of a GPU
    transition_ms: list[float] = field(default_factory=lambda: [5.0, 15.0])  # a clock request lands after [min, max]
    time_limit_s: float = 30.0  # soft limit of emo's local search (the DP itself always completes)
    predictor_polish_s: float = 10.0  # emo: time for single-window moves judged by the stage's predictor
    perseus_level: str = "pass"  # perseus: one clock per "pass" (as in Perseus) or per "pack"
    zeus: ZeusOptions = field(default_factory=ZeusOptions)
    geepafs: GeepafsOptions = field(default_factory=GeepafsOptions)


@dataclass
class ValidateConfig:
    iterations: int = 5  # measured iterations per run (>= 5), after `warmup`
    min_seconds: float = 2.0  # ... and more when needed for the run to span this long (energy-counter resolution)
    warmup: int = 1
    pareto_points: int = 8  # optimizer=static: static clocks measured for the energy-time curve


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///${results}/mlflow.db"
    experiment: str = "emo"


@dataclass
class Config:
    gpu: GpuConfig = MISSING
    workload: WorkloadConfig = MISSING
    trace: TraceConfig = field(default_factory=TraceConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    budget: float = 0.02  # allowed slowdown, fraction of the max-clock iteration time
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    results: str = "results"


WORKLOADS = {"tp": TPWorkload, "pp": PPWorkload, "offload": OffloadWorkload,
             "recorded": RecordedWorkload, "command": CommandWorkload}


# string options with a fixed set of values: checked when the configuration is composed, so a typo
# fails at once rather than in the stage that reads it
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("optimizer", "change_points"): ("passes", "grid"),
    ("optimizer", "perseus_level"): ("pass", "pack"),
}


def check_choices(cfg: dict) -> None:
    """ValueError (one line, naming the key) for a value outside CHOICES."""
    for (group, key), allowed in CHOICES.items():
        value = cfg.get(group, {}).get(key)
        if value is not None and value not in allowed:
            raise ValueError(f"bad configuration: {group}.{key} must be one of {', '.join(allowed)} (got {value!r})")


def register() -> None:
    """Register the schemas; conf/*.yaml name them in their defaults lists."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="gpu", name="gpu_schema", node=GpuConfig)
    for name, node in WORKLOADS.items():
        cs.store(group="workload", name=f"{name}_schema", node=node)
