"""Open the device for a GPU config by its `gpu.backend`. Backends are imported by name on demand,
and live in their own module so that code which only needs the device protocol (emo.device) does
not depend on them. Plugins add a backend with register_backend() or the entry-point group
`emo.backends` ("name = module:factory", the factory taking the GPU config)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from emo.device import Device
from emo.errors import ConfigError

# Backends by name, "module:factory" imported on demand: a model that holds a Device sees only the protocol.
BACKENDS: dict[str, str | Callable[[Any], Device]] = {
    "sim": "emo.device.sim.command:CommandSimDevice",  # the virtual GPU; it also runs `command` workloads
    "nvml": "emo.device.nvml:NvmlDevice",
}


def register_backend(name: str, factory: Callable[[Any], Device]) -> None:
    """Make `name` a value of gpu.backend: open_device calls factory(gpu_cfg)."""
    BACKENDS[name] = factory


def backend_factory(name: str) -> Callable[[Any], Device]:
    factory = BACKENDS.get(name)
    if factory is None:
        found = [e for e in entry_points(group="emo.backends") if e.name == name]
        if not found:
            known = sorted(set(BACKENDS) | {e.name for e in entry_points(group="emo.backends")})
            raise ConfigError(f"gpu.backend: unknown backend {name!r} (expected one of {known})")
        return found[0].load()
    if isinstance(factory, str):
        module, attr = factory.split(":")
        return getattr(importlib.import_module(module), attr)
    return factory


def open_device(gpu_cfg: Any) -> Device:
    """The device for a GPU config: the virtual GPU for backend 'sim', NVML for 'nvml', or a registered one."""
    backend = gpu_cfg["backend"] if isinstance(gpu_cfg, dict) else gpu_cfg.backend
    return backend_factory(backend)(gpu_cfg)
