"""Workload configs in, typed dataclasses out, with one-line errors for values that make no sense."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emo.config import HybridWorkload, OffloadWorkload, PPWorkload, TPWorkload

# the synthetic kinds' config schemas; emo.workloads.register_workload adds to it
SCHEMAS = {"tp": TPWorkload, "pp": PPWorkload, "hybrid": HybridWorkload, "offload": OffloadWorkload}


def resolve(cfg: Any):
    """A TPWorkload / PPWorkload / HybridWorkload / OffloadWorkload from a config node, a dict or a dataclass; unknown
    keys and wrong types are errors (the same schema Hydra checks)."""
    if isinstance(cfg, tuple(SCHEMAS.values())):
        node = OmegaConf.structured(cfg)
    else:
        node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    kind = node.get("kind")
    if kind not in SCHEMAS:
        raise ValueError(f"workload.kind: unknown synthetic workload {kind!r} (expected one of {', '.join(SCHEMAS)})")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(SCHEMAS[kind]), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        raise ValueError(f"workload: {msg}") from None
