"""Open the device for a GPU config. Backends are imported by name on demand, and live in their
own module so that code which only needs the device protocol (emo.device) does not depend on them.
"""
from __future__ import annotations

from typing import Any

from emo.device import Device

# Backends by name, imported on demand: a model that holds a Device sees only this protocol.
BACKENDS = {"sim": "emo.device.sim:SimDevice", "nvml": "emo.device.nvml:NvmlDevice"}


def open_device(gpu_cfg: Any) -> Device:
    """The device for a GPU config: the virtual GPU for backend 'sim', NVML for 'nvml'."""
    import importlib

    backend = gpu_cfg["backend"] if isinstance(gpu_cfg, dict) else gpu_cfg.backend
    if backend not in BACKENDS:
        raise ValueError(f"gpu.backend: unknown backend {backend!r} (expected one of {sorted(BACKENDS)})")
    module, cls = BACKENDS[backend].split(":")
    return getattr(importlib.import_module(module), cls)(gpu_cfg)
