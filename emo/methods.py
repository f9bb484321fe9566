"""The one registry of methods: what `optimizer.name` may be, and where each runs.

An offline method plans a policy in the optimize stage from the trace and the model; an online one
tunes while the validate stage runs the workload. A method is found, in this order: registered in
this process (register_method); an entry point of group `emo.methods` (a plugin package; it
registers itself when loaded); a module named by convention, `emo.optimize.solvers.<name>` with
`solve` (offline) or `emo.baselines.<name>` with `run_online` (online). So a new method is its
module plus conf/optimizer/<name>.yaml (`name: <name>`).

Contracts (`run`):
- offline: run(tables, opt, budget, *, gpu, clock_latency, iteration_sd_s) -> (FrequencyPolicy, summary),
  as emo.optimize.solve; the policy carries its prediction (predicted_time_s, predicted_energy_j:
  emo.model.predict), summary[name] holds at least "transition_ms" ([lo, mean, hi]) and "transition_source". The built-in ones (run None) share emo.optimize.pipeline.solve's search.
- online: run(device, workload, devices, budget, optimizer_cfg, gpu_cfg, *, iterations, warmup)
  -> emo.baselines.OnlineResult.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any


@dataclass(frozen=True)
class Method:
    name: str
    online: bool
    run: Callable[..., Any] | None = None  # None: a built-in planned by emo.optimize.pipeline.solve


_REGISTRY: dict[str, Method] = {}
_LAZY: dict[str, str] = {}  # name -> "module:function" of a method's run, imported on first use


def register_method(name: str, *, online: bool, run: Callable[..., Any] | str | None = None) -> Method:
    """Make `name` a value of optimizer.name (tables and plots list methods in registration order);
    `run` may be "module:function", imported when the method is first asked for."""
    _LAZY.pop(name, None)
    if isinstance(run, str):
        _LAZY[name], run = run, None
    _REGISTRY[name] = m = Method(name, online, run)
    return m


for _name in ("emo", "static"):
    register_method(_name, online=False)
register_method("zeus", online=True, run="emo.baselines.zeus:run_online")
register_method("perseus", online=True, run="emo.baselines.perseus:run_online")  # profiles, then plans, in validate
register_method("geepafs", online=True, run="emo.baselines.geepafs:run_online")
# Ablations (offline, docs/baselines.md): a labelled variant of a method, never the method itself.
# Each names the planner emo.optimize.pipeline.solve runs for it; its conf/optimizer/<name>.yaml sets the rest.
ABLATIONS = {
    "perseus+emo-search": "perseus",  # Perseus's lowtime walk inside EMO's budget search, polish and lead
    "emo-dp": "emo",  # EMO's DP alone: no budget search, repair, uniform start, polish or single clock
    "emo-pass": "emo",  # EMO with one window per pass (change_points=pass)
    "emo-grid": "emo",  # EMO on the paper's 20 ms grid (change_points=grid)
}
for _name in ABLATIONS:
    register_method(_name, online=False)


def method(name: str) -> Method:
    """The method called `name`, loading a plugin or a conventional module on first use; ValueError
    naming optimizer.name when there is none."""
    if name not in _REGISTRY:
        _discover(name)
    if name not in _REGISTRY:
        raise ValueError(f"optimizer.name: unknown method {name!r} (expected one of {', '.join(METHODS)})")
    if name in _LAZY:
        module, attr = _LAZY.pop(name).split(":")
        _REGISTRY[name] = Method(name, _REGISTRY[name].online, getattr(importlib.import_module(module), attr))
    return _REGISTRY[name]


def _discover(name: str) -> None:
    for ep in entry_points(group="emo.methods"):
        if ep.name == name:
            ep.load()  # the plugin's module calls register_method
            return
    if not str(name).isidentifier():
        return
    for package, attr, online in (("emo.optimize.solvers", "solve", False), ("emo.baselines", "run_online", True)):
        try:
            module = importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            continue
        if callable(getattr(module, attr, None)) and name not in _REGISTRY:
            register_method(name, online=online, run=getattr(module, attr))
            return


class _Names(Sequence):
    """The registered methods' names, live (a plugin registered later is in it); `x in` also finds a
    method not yet loaded."""

    def __init__(self, online: bool | None):
        self.online = online

    def _names(self) -> tuple[str, ...]:
        return tuple(m.name for m in _REGISTRY.values() if self.online is None or m.online == self.online)

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


OFFLINE = _Names(online=False)  # optimize plans their policy from the trace and the model
ONLINE = _Names(online=True)  # they tune while validate runs the workload
METHODS = _Names(online=None)  # the order tables and plots show them in

# The table's rule: a method keeps the budget when its measured PL <= budget + PL_TOLERANCE_PCT points
# (validate's within_budget and its measured static pick use it; so should the tables' scoring).
PL_TOLERANCE_PCT = 0.5
