"""Workload configs in, typed dataclasses out, with one-line errors for values that make no sense."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def resolve(cfg: Any, schema: type):
    """An instance of `schema` (the kind's dataclass) from a config node, a dict or a dataclass;
    unknown keys and wrong types are errors (the same schema Hydra checks)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        node = OmegaConf.structured(cfg)
    else:
        node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        raise ValueError(f"workload: {msg}") from None
