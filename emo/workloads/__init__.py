"""Workloads: what EMO runs or reads, each kind an object (`WorkloadKind`) its own module declares.

    build_program(cfg, gpu="a100") -> Program      a synthetic workload's program (emo.workloads.program)
    kind_of(cfg) -> WorkloadKind                   the kind of a workload config: its schema and flags
    register_workload(kind, schema, build, ...)    add a kind from outside EMO (a plugin, a test)
    discover()                                     find every kind before Hydra composes the config

A kind is a module `emo.workloads.<kind>` (or an entry point of group `emo.workloads` naming a module)
that declares:
- `SCHEMA`: a dataclass deriving from emo.schema.WorkloadConfig, its keys, defaults and ranges; Hydra
  knows it as `workload/<kind>_schema`, which conf/workload/<kind>.yaml names in its defaults list;
- `build(workload, arch) -> Program`: the program one iteration runs, per rank (a synthetic workload,
  for the virtual GPU); or `SOURCE = "command"` (a program of yours that EMO starts: emo.device) or
  `SOURCE = "trace"` (a trace recorded elsewhere: nothing runs, the stages read `workload.path`);
and may declare `rules(workload: dict)` (what ties its keys together; raise through emo.schema.bad),
`label(params: dict) -> str` (the name `emo compare` gives its cells) and `grid(workload: dict)`
((tp, pp, dp) of its ranks: which ranks are alike for `trace.ranks`, how many GPUs a job takes).

The kinds here: tp, pp, hybrid, offload (synthetic), command, recorded. Every other stage asks the
kind, never its name, so a new kind is its module, conf/workload/<kind>.yaml and its docs.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from emo.errors import ConfigError
from emo.schema import check_node
from emo.workloads.arch import Arch, arch_for
from emo.workloads.params import resolve
from emo.workloads.program import Program

__all__ = [
    "Program",
    "WorkloadKind",
    "build_program",
    "discover",
    "find",
    "grid_of",
    "kind_of",
    "register_workload",
    "workload_kind",
]

SOURCES = ("program", "command", "trace")


def _no_rules(workload: dict) -> None:
    return None


def _no_grid(workload: dict) -> tuple[int, int, int] | None:
    return None


@dataclass(frozen=True)
class WorkloadKind:
    kind: str
    schema: type  # the dataclass its config is checked against (unknown keys, types, ranges)
    build: Callable[[Any, Arch], Program] | None = None  # None: EMO builds no program (SOURCE command, trace)
    rules: Callable[[dict], None] = _no_rules
    label_of: Callable[[dict], str] | None = None  # None: the kind and the keys set away from their defaults
    grid: Callable[[dict], tuple[int, int, int] | None] = _no_grid
    source: str = "program"  # program: built here (virtual GPU); command: a program EMO starts; trace: read
    gpus_of: Callable[[dict], int | None] | None = None  # None: its grid's ranks, else one

    @property
    def synthetic(self) -> bool:
        """A program EMO builds, which only the virtual GPU runs."""
        return self.source == "program"

    @property
    def command(self) -> bool:
        """A program of the user's that EMO starts (on a GPU box, or on the CPU beside the virtual GPU)."""
        return self.source == "command"

    @property
    def recorded(self) -> bool:
        """A trace recorded elsewhere: nothing to run, so no profile run and no validate measurement."""
        return self.source == "trace"

    def label(self, params: dict) -> str:
        """The name of this workload's cells in `emo compare`, from its keys as MLflow holds them
        (flat, `model.layers`, values as strings)."""
        if self.label_of is not None:
            return self.label_of(params)
        defaults = _flat(dataclasses.asdict(self.schema()) if _constructible(self.schema) else {})
        changed = [f"{k}={v}" for k, v in sorted(params.items()) if k != "kind" and defaults.get(k) != v]
        return " ".join([self.kind, *changed])

    def gpus(self, workload: dict) -> int | None:
        """GPUs one job of this workload runs on: what its module's `gpus` says (None: every GPU the
        job can see, a launcher that does not say how many), else its grid's ranks, else one."""
        if self.gpus_of is not None:
            return self.gpus_of(workload)
        g = self.grid(workload)
        return g[0] * g[1] * g[2] if g else 1


_REGISTRY: dict[str, WorkloadKind] = {}


def register_workload(
    kind: str,
    schema: type,
    build: Callable[[Any, Arch], Program] | None = None,
    *,
    rules: Callable[[dict], None] = _no_rules,
    label: Callable[[dict], str] | None = None,
    grid: Callable[[dict], tuple[int, int, int] | None] = _no_grid,
    source: str = "program",
    gpus: Callable[[dict], int | None] | None = None,
) -> WorkloadKind:
    """Make `kind` a workload: Hydra's ConfigStore knows its schema as `workload/<kind>_schema` (which
    conf/workload/<kind>.yaml names in its defaults list), emo.config checks its ranges and rules when
    the configuration is composed, and build_program builds it."""
    from hydra.core.config_store import ConfigStore

    if source not in SOURCES:
        raise ValueError(f"workload {kind!r}: SOURCE must be one of {', '.join(SOURCES)} (got {source!r})")
    if (build is None) == (source == "program"):
        raise ValueError(f"workload {kind!r}: a synthetic workload has a build, a {source} workload none")
    entry = WorkloadKind(kind, schema, build, rules, label, grid, source, gpus)
    _REGISTRY[kind] = entry
    ConfigStore.instance().store(group="workload", name=f"{kind}_schema", node=schema)
    return entry


def _from_module(kind: str, module) -> WorkloadKind:
    return register_workload(
        kind,
        module.SCHEMA,
        getattr(module, "build", None),
        rules=getattr(module, "rules", _no_rules),
        label=getattr(module, "label", None),
        grid=getattr(module, "grid", _no_grid),
        source=getattr(module, "SOURCE", "program"),
        gpus=getattr(module, "gpus", None),
    )


def discover() -> list[str]:
    """Register every kind there is: each module of this package that declares SCHEMA, then each
    entry point of group `emo.workloads`. Hydra composes `workload=<kind>` only after this (emo.config
    .register calls it); a module added since the last call is found by the next."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            find(info.name)
    for ep in entry_points(group="emo.workloads"):
        find(ep.name)
    return sorted(_REGISTRY)


def find(kind: Any) -> WorkloadKind | None:
    """The kind called `kind`: registered, else its module `emo.workloads.<kind>`, else the entry point
    of group `emo.workloads` of that name (registered on first use); None if there is none."""
    if not isinstance(kind, str):
        return None
    if kind not in _REGISTRY:
        module = _module_for(kind)
        if module is not None:
            _from_module(kind, module)
    return _REGISTRY.get(kind)


def _module_for(kind: str):
    for ep in entry_points(group="emo.workloads"):
        if ep.name == kind:
            return ep.load()
    if not kind.isidentifier():
        return None
    try:
        module = importlib.import_module(f"{__name__}.{kind}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{kind}":
            raise
        return None
    return module if hasattr(module, "SCHEMA") else None


def workload_kind(kind: Any) -> WorkloadKind:
    """The kind called `kind`; ValueError naming workload.kind if there is none."""
    entry = find(kind)
    if entry is None:  # every kind there is, not only those this process has used so far
        raise ConfigError(
            f"workload.kind: unknown synthetic workload {kind!r} (expected one of {', '.join(discover())})"
        )
    return entry


def check_workload(wl: dict) -> None:
    """A workload section alone against its kind's schema (ranges) and rules; what the synthetic
    workloads' builders call (emo.config.check does the same for a whole configuration)."""
    kind = workload_kind(wl["kind"])
    check_node(kind.schema, wl, "workload.")
    kind.rules(wl)


def _name(cfg: Any) -> Any:
    return cfg.get("kind") if hasattr(cfg, "get") else getattr(cfg, "kind", None)


def kind_of(cfg: Any) -> WorkloadKind:
    """The kind of a workload config (dict, OmegaConf node or dataclass); ValueError if it names none."""
    return workload_kind(_name(cfg))


def grid_of(workload: dict) -> tuple[int, int, int] | None:
    """(tp, pp, dp) of a workload whose kind declares its rank grid (tp, pp, hybrid), else None."""
    kind = find(workload.get("kind"))
    return kind.grid(workload) if kind is not None else None


def build_program(cfg: Any, gpu: Any = "a100") -> Program:
    """One iteration of the configured workload, per rank. Raises ValueError for bad parameters."""
    entry = kind_of(cfg)
    if entry.build is None:
        raise ConfigError(f"workload.kind: {entry.kind} is not a synthetic workload (EMO builds no program for it)")
    return entry.build(resolve(cfg, entry.schema), arch_for(gpu))


def _constructible(schema: type) -> bool:
    """Every field has a default (a recorded trace's `path` has none)."""
    return all(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(schema)
    )


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": str(v)})
    return out
