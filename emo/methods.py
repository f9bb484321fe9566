"""The one registry of methods: what `optimizer.name` may be, where each runs, and what the stages
may ask of it.

A method is one object (Method): its name, its `run`, and flags the stages read instead of its name:
`online` (it tunes while validate runs the workload; else it plans a policy in optimize),
`measures_static_curve` (validate measures the static curve and reports the best measured clock),
`lead` (the method the tables judge: "EMO ahead"), `ablation_of` (a labelled variant, never a rival)
and `label` (what tables and plots call it). A method is found, in this order: registered in this
process (register_method); an entry point of group `emo.methods` (a plugin package; it registers
itself when loaded); a module named by convention, `emo.optimize.solvers.<name>` (offline) or
`emo.baselines.<name>` (online) with a callable `run`. So a new method is its module plus
conf/optimizer/<name>.yaml (`name: <name>`).

The contract, the same for built-ins and new methods (`run` takes one context object):
- offline: run(PlanContext) -> (FrequencyPolicy, summary). The built-ins are planners
  (emo.optimize.pipeline.planner.Planner): `frontier` yields candidates along the time-energy
  frontier, `pick` chooses the budget point, as lowtime does; the policy carries its prediction
  (predicted_time_s, predicted_energy_j), summary[name] holds at least "transition_ms" ([lo, mean,
  hi]) and "transition_source".
- online: run(OnlineContext) -> emo.baselines.OnlineResult.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the protocol, for annotations only: emo.methods stays free of the device package
    from emo.device import Device
    from emo.sections import GpuConfig, OptimizerConfig


@dataclass(frozen=True)
class PlanContext:
    """What an offline method plans from (the optimize stage): the model's tables (PackTables), the
    optimizer section, the user's budget, the GPU's name, the calibration's measured clock-request
    latency (None: not measured), one iteration's measured spread in seconds (None: unknown) and the
    untraced run's measured iteration time over the model's prediction at the default clock (fit's
    check; None: no untraced measurement)."""

    tables: Any
    opt: OptimizerConfig
    budget: float
    gpu: str
    clock_latency: dict | None = None
    iteration_sd_s: float | None = None
    baseline_ratio: float | None = None

    @property
    def name(self) -> str:
        return self.opt.name


@dataclass(frozen=True)
class OnlineContext:
    """What an online method runs with (the validate stage): the open device, the workload section,
    the job's GPUs, the budget, the optimizer and gpu sections, and how many measured (and warm-up)
    iterations its steady state runs."""

    device: Device
    workload: Any
    devices: Sequence[int]
    budget: float
    optimizer: OptimizerConfig
    gpu: GpuConfig
    iterations: int
    warmup: int

    @property
    def name(self) -> str:
        return self.optimizer.name


@dataclass(frozen=True)
class Method:
    name: str
    online: bool
    run: Callable[..., Any] | None = None  # run(PlanContext) or run(OnlineContext); None until loaded
    measures_static_curve: bool = False  # validate measures the static curve and keeps its best clock
    lead: bool = False  # the method the tables judge against every rival
    ablation_of: str | None = None  # a labelled variant of that method: a row, never a rival
    label: str = ""  # what tables and plots call it (the name when empty)

    @property
    def rival(self) -> bool:
        """Scored against the lead (an ablation is not)."""
        return self.ablation_of is None

    @property
    def title(self) -> str:
        return self.label or self.name


_REGISTRY: dict[str, Method] = {}
_LAZY: dict[str, str] = {}  # name -> "module:attribute" of a method's run, imported on first use


def register_method(
    name: str,
    *,
    online: bool,
    run: Callable[..., Any] | str | None = None,
    measures_static_curve: bool = False,
    lead: bool = False,
    ablation_of: str | None = None,
    label: str = "",
) -> Method:
    """Make `name` a value of optimizer.name (tables and plots list methods in registration order);
    `run` may be "module:attribute", imported when the method is first asked for."""
    _LAZY.pop(name, None)
    if isinstance(run, str):
        _LAZY[name], run = run, None
    _REGISTRY[name] = m = Method(name, online, run, measures_static_curve, lead, ablation_of, label)
    return m


_PLANNERS = "emo.optimize.pipeline.planner"
register_method("emo", online=False, run=f"{_PLANNERS}:EMO", lead=True, label="EMO")
register_method("static", online=False, run="emo.optimize.pipeline.static:STATIC", measures_static_curve=True)
register_method("zeus", online=True, run="emo.baselines.zeus:run_online")
register_method("perseus", online=True, run="emo.baselines.perseus:run_online")  # profiles, then plans, in validate
register_method("geepafs", online=True, run="emo.baselines.geepafs:run_online")
# Ablations (offline, docs/baselines.md): EMO's planner with options (emo.optimize.pipeline.planner);
# each conf/optimizer/<name>.yaml sets the rest.
register_method("perseus+emo-search", online=False, run=f"{_PLANNERS}:PERSEUS_EMO_SEARCH", ablation_of="emo")
register_method("emo-dp", online=False, run=f"{_PLANNERS}:EMO_DP", ablation_of="emo")
register_method("emo-pass", online=False, run=f"{_PLANNERS}:EMO", ablation_of="emo")  # change_points=pass
register_method("emo-grid", online=False, run=f"{_PLANNERS}:EMO", ablation_of="emo")  # change_points=grid


def describe(name: str) -> Method | None:
    """The registry's entry for `name` (its flags), without loading its run; None when unknown
    (a run recorded by a plugin not installed here)."""
    if name not in _REGISTRY:
        _discover(name)
    return _REGISTRY.get(name)


def lead() -> str:
    """The name of the method the tables judge (the first registered with lead=True)."""
    return next(m.name for m in _REGISTRY.values() if m.lead)


def method(name: str) -> Method:
    """The method called `name`, loading a plugin or a conventional module on first use; ValueError
    naming optimizer.name when there is none."""
    if name not in _REGISTRY:
        _discover(name)
    if name not in _REGISTRY:
        raise ValueError(f"optimizer.name: unknown method {name!r} (expected one of {', '.join(METHODS)})")
    if name in _LAZY:
        module, attr = _LAZY.pop(name).split(":")
        _REGISTRY[name] = replace(_REGISTRY[name], run=getattr(importlib.import_module(module), attr))
    return _REGISTRY[name]


def _discover(name: str) -> None:
    for ep in entry_points(group="emo.methods"):
        if ep.name == name:
            ep.load()  # the plugin's module calls register_method
            return
    if not str(name).isidentifier():
        return
    for package, online in (("emo.optimize.solvers", False), ("emo.baselines", True)):
        try:
            module = importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            continue
        if callable(getattr(module, "run", None)) and name not in _REGISTRY:
            register_method(name, online=online, run=module.run)
            return


class _Names(Sequence):
    """The registered methods' names, live (a plugin registered later is in it); `x in` also finds a
    method not yet loaded."""

    def __init__(self, keep: Callable[[Method], bool]):
        self.keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(m.name for m in _REGISTRY.values() if self.keep(m))

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in _REGISTRY:
            _discover(name)
        return name in self._names()

    def __repr__(self) -> str:
        return repr(self._names())


OFFLINE = _Names(lambda m: not m.online)  # optimize plans their policy from the trace and the model
ONLINE = _Names(lambda m: m.online)  # they tune while validate runs the workload
METHODS = _Names(lambda m: True)  # the order tables and plots show them in
ABLATIONS = _Names(lambda m: not m.rival)  # labelled variants (Method.ablation_of), never rivals

# The table's rule: a method keeps the budget when its measured PL <= budget + PL_TOLERANCE_PCT points
# (validate's within_budget and its measured static pick use it; so should the tables' scoring).
PL_TOLERANCE_PCT = 0.5
