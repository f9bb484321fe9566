"""Structured configuration (Hydra ConfigStore): every key is typed, so a typo or a wrong type in an
override fails at once, and every value is checked against its allowed range when the configuration
is composed (`check`), so a bad value fails before any stage runs.

The sections' dataclasses (emo.sections, re-exported here) are the one source of defaults:
`conf/config.yaml` only picks the groups, and a group file (`conf/gpu/*.yaml`, `conf/workload/*.yaml`,
...) holds only what that choice sets. A workload's keys are its kind's (`SCHEMA` in
emo/workloads/<kind>.py, deriving from WorkloadConfig). The composed configuration travels as plain
data (hashed, handed over by Snakemake); a library takes its sections typed, converted once where a
stage or the CLI calls it by `typed` (emo.sections).
"""

from __future__ import annotations

from typing import Any

from emo.schema import (  # re-exported: the schema's building blocks live in emo.schema
    NON_EMPTY,
    WorkloadConfig,
    above,
    at_least,
    bad,
    between,
    check_node,
    one_of,
)
from emo.sections import (  # re-exported: the sections and their conversion live in emo.sections (a leaf)
    CLOCKS,
    FRACTIONS,
    LATENCY_RANGE,
    PERCENTILES,
    PLAIN,
    RANK_SAMPLE,
    Config,
    GeepafsOptions,
    GpuConfig,
    ModelConfig,
    OptimizerConfig,
    PackingConfig,
    PerseusOptions,
    TraceConfig,
    TrackingConfig,
    ValidateConfig,
    ZeusOptions,
    typed,
)

__all__ = [
    "CLOCKS",
    "FRACTIONS",
    "LATENCY_RANGE",
    "NON_EMPTY",
    "PERCENTILES",
    "PLAIN",
    "RANK_SAMPLE",
    "Config",
    "GeepafsOptions",
    "GpuConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PackingConfig",
    "PerseusOptions",
    "TraceConfig",
    "TrackingConfig",
    "ValidateConfig",
    "WorkloadConfig",
    "ZeusOptions",
    "above",
    "at_least",
    "bad",
    "between",
    "check",
    "check_node",
    "one_of",
    "register",
    "typed",
]


def check(cfg: dict) -> None:
    """ValueError, one line naming the key and its allowed range, for the first value outside it
    (the `allowed` metadata of the schema's fields, then the rules that tie two keys together)."""
    check_node(Config, cfg, "", _workload_schema)
    kind = _kind(cfg.get("workload"))
    if kind is not None:
        kind.rules(cfg["workload"])  # what ties the workload's keys together: its module says
    _gpu_runs_workload(cfg["gpu"], kind)
    ranks = cfg["trace"]["ranks"]
    if ranks != "all" and isinstance(cfg.get("workload"), dict):
        from emo.sampling import sample_of  # the sample covers every stage and TP position, or one line
        from emo.workloads import grid_of

        sample_of(cfg["workload"], ranks, grid_of(cfg["workload"]))
    opt = cfg["optimizer"]
    if "change_interval_ms" in opt and "min_interval_ms" in opt and opt["change_interval_ms"] < opt["min_interval_ms"]:
        bad(
            "optimizer.change_interval_ms",
            f">= optimizer.min_interval_ms ({opt['min_interval_ms']:g})",
            opt["change_interval_ms"],
        )
    gpu = cfg["gpu"]
    if "clocks_mhz" in gpu and not gpu["clocks_mhz"] and gpu.get("backend") != "nvml":
        bad(
            "gpu.clocks_mhz",
            "a non-empty ascending list of clocks > 0 (MHz) (only NVML discovers them)",
            gpu["clocks_mhz"],
        )
    for key in ("default_mhz", "tdp_w"):  # 0 on NVML: what the device reports
        if key in gpu and gpu[key] <= 0 and gpu.get("backend") != "nvml":
            bad(f"gpu.{key}", "> 0 (0 only on NVML, which reports it)", gpu[key])
    if gpu.get("clocks_mhz") and gpu.get("default_mhz") not in gpu["clocks_mhz"]:
        bad(
            "gpu.default_mhz",
            f"one of gpu.clocks_mhz ({gpu['clocks_mhz'][0]}-{gpu['clocks_mhz'][-1]} MHz)",
            gpu.get("default_mhz"),
        )


def _kind(wl):
    """The workload kind (emo.workloads.WorkloadKind) of a workload section, None if it names none."""
    from emo.workloads import find  # the kinds' modules import this one

    return find(wl.get("kind")) if isinstance(wl, dict) else None


def _gpu_runs_workload(gpu: dict, kind) -> None:
    """A workload the GPU config cannot run fails here, not after calibration: a synthetic workload
    runs only on the virtual GPU (a program on the virtual GPU needs a model it can size kernels for:
    emo.workloads.arch.check_virtual_command, which compose calls too)."""
    if kind is not None and kind.synthetic and gpu.get("backend") == "nvml":
        raise ValueError(
            f"bad configuration: workload={kind.kind} is a synthetic workload of the virtual GPU, and gpu.backend=nvml "
            "runs real programs: use workload=command 'workload.command=[python,train.py]' (or workload=recorded), "
            "or a virtual GPU (gpu=a100, h100, rtx3080ti, v100)"
        )


def _workload_schema(name: str, value: Any) -> Any:
    """The schema of the `workload` section: its kind's (None for any other section: its type hint)."""
    return getattr(_kind(value), "schema", None) if name == "workload" and isinstance(value, dict) else None


def register() -> None:
    """Register the schemas; conf/*.yaml name them in their defaults lists. Every workload kind's
    module is found here (emo.workloads.discover), before Hydra composes `workload=<kind>`."""
    from hydra.core.config_store import ConfigStore

    from emo.workloads import discover, workload_kind

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="gpu", name="gpu_schema", node=GpuConfig)
    for kind in discover():
        cs.store(group="workload", name=f"{kind}_schema", node=workload_kind(kind).schema)
