"""What a configuration section's schema is made of, for emo.config and every workload kind's module
alike (emo.workloads): the allowed-value metadata of a field, the workload schemas' base, the one
checker of a section against its schema and the one-line error of a value outside its range. A leaf:
emo.config (which checks a workload through its kind) and emo.workloads both build on it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from emo.errors import ConfigError


# --------------------------------------------------------------------------- allowed values
# A field's `metadata["allowed"]` is (test, text): the range a value must lie in, said in words.
def at_least(lo: float) -> dict:
    return {"allowed": (lambda v: v >= lo, f">= {lo:g}")}


def above(lo: float) -> dict:
    return {"allowed": (lambda v: v > lo, f"> {lo:g}")}


def between(lo: float, hi: float, *, hi_open: bool = False) -> dict:
    if hi_open:
        return {"allowed": (lambda v: lo <= v < hi, f"in [{lo:g}, {hi:g})")}
    return {"allowed": (lambda v: lo <= v <= hi, f"in [{lo:g}, {hi:g}]")}


def one_of(*values) -> dict:
    return {"allowed": (lambda v: v in values, "one of " + ", ".join(map(str, values)))}


NON_EMPTY = {"allowed": (lambda v: len(v) > 0, "non-empty")}


# --------------------------------------------------------------------------- workloads
@dataclass
class WorkloadConfig:
    """What every workload's schema derives from; each kind's module declares its own (emo.workloads)."""

    kind: str = MISSING


def check_node(schema: type, node: dict, prefix: str, schema_of: Callable[[str, Any], Any] | None = None) -> None:
    """ConfigError, one line naming the key, for an unknown key or the first value outside its field's
    `allowed` range, in `node` and its sub-sections. `schema_of(name, value)`: the schema of a
    sub-section the type hints cannot say (a workload's: its kind's), None to use the hint."""
    hints = typing.get_type_hints(schema)
    unknown = sorted(set(node) - {f.name for f in dataclasses.fields(schema)})
    if unknown:  # `+key=value` adds a key no stage reads: a typo the typed config would otherwise let through
        raise ConfigError(f"bad configuration: {prefix + unknown[0]} is not a key of the configuration")
    for f in dataclasses.fields(schema):
        if f.name not in node:
            continue
        value, key = node[f.name], prefix + f.name
        if "allowed" in f.metadata:
            test, text = f.metadata["allowed"]
            if value is None and f.metadata.get("nullable"):
                pass
            elif value is None or not test(value):
                bad(key, text, value)
        sub = schema_of(f.name, value) if schema_of is not None else None
        sub = hints[f.name] if sub is None else sub
        if isinstance(value, dict) and isinstance(sub, type) and dataclasses.is_dataclass(sub):
            check_node(sub, value, key + ".", schema_of)


def bad(key: str, allowed: str, value) -> None:
    """The one-line error of a value outside its range (a workload's rules raise it too)."""
    raise ConfigError(f"bad configuration: {key} must be {allowed} (got {value!r})")
