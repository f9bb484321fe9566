"""Synthetic workloads: the programs the virtual GPU runs (`emo.workloads.program` format).

    build_program(cfg, gpu="a100") -> Program
    register_workload(kind, schema, build)   add a kind (a plugin, a test)

`cfg` is a workload config (OmegaConf node, dict or dataclass) whose `kind` selects the builder:
- "tp": tensor parallelism over 2/4/8 GPUs, Domino-style overlap of all-reduces (emo.workloads.tp);
- "pp": pipeline parallelism over 2/4/8 GPUs, 1F1B, P2P send/recv (emo.workloads.pp);
- "hybrid": TP x PP x DP: TP groups as stages of a 1F1B pipeline, replicated DP times, DDP-bucketed
  gradient all-reduce over the replicas at the end of backward (emo.workloads.hybrid);
- "offload": MoE decode with experts on the CPU, KTransformers style (emo.workloads.offload).
`gpu` (model key or GPU config) picks the kernel names the libraries use on that architecture.

A kind is found, in this order: registered in this process; a module `emo.workloads.<kind>` with
`SCHEMA` (a dataclass, its config) and `build(workload, arch) -> Program`; an entry point of group
`emo.workloads` naming such a module. So a new workload is its module plus conf/workload/<kind>.yaml.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from emo.workloads.arch import Arch, arch_for
from emo.workloads.params import SCHEMAS, resolve
from emo.workloads.program import Program

__all__ = ["Program", "build_program", "register_workload", "workload_kind"]


@dataclass(frozen=True)
class WorkloadKind:
    kind: str
    schema: type  # the dataclass its config is checked against (unknown keys, types, ranges)
    build: Callable[[Any, Arch], Program]


_REGISTRY: dict[str, WorkloadKind] = {}
BUILTIN = ("tp", "pp", "hybrid", "offload")  # modules emo.workloads.<kind>


def register_workload(kind: str, schema: type, build: Callable[[Any, Arch], Program]) -> WorkloadKind:
    """Make `kind` a workload: its config schema joins the config's (emo.config.WORKLOADS, checked when
    `emo run` composes; Hydra's ConfigStore as `<kind>_schema`, which conf/workload/<kind>.yaml names in
    its defaults list) and build_program builds it."""
    from hydra.core.config_store import ConfigStore

    from emo import config

    entry = WorkloadKind(kind, schema, build)
    _REGISTRY[kind] = entry
    SCHEMAS[kind] = schema
    config.WORKLOADS.setdefault(kind, schema)
    ConfigStore.instance().store(group="workload", name=f"{kind}_schema", node=schema)
    return entry


def workload_kind(kind: str) -> WorkloadKind:
    """The registered kind, loading its module on first use; ValueError naming workload.kind if none."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    module = _module_for(kind)
    if module is None:
        known = sorted(set(_REGISTRY) | set(BUILTIN) | {e.name for e in entry_points(group="emo.workloads")})
        raise ValueError(f"workload.kind: unknown synthetic workload {kind!r} (expected one of {', '.join(known)})")
    return register_workload(kind, module.SCHEMA, module.build)


def _module_for(kind: str):
    for ep in entry_points(group="emo.workloads"):
        if ep.name == kind:
            return ep.load()
    if not str(kind).isidentifier():
        return None
    try:
        module = importlib.import_module(f"emo.workloads.{kind}")
    except ModuleNotFoundError as e:
        if e.name != f"emo.workloads.{kind}":
            raise
        return None
    return module if hasattr(module, "SCHEMA") and hasattr(module, "build") else None


def build_program(cfg: Any, gpu: Any = "a100") -> Program:
    """One iteration of the configured workload, per rank. Raises ValueError for bad parameters."""
    kind = cfg.kind if hasattr(cfg, "kind") else cfg["kind"]
    entry = workload_kind(kind)
    return entry.build(resolve(cfg), arch_for(gpu))
