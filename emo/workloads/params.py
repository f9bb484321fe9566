"""Workload configs in, typed dataclasses out, with one-line errors for values that make no sense."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emo.config import OffloadWorkload, PPWorkload, TPWorkload, TransformerShape

SCHEMAS = {"tp": TPWorkload, "pp": PPWorkload, "offload": OffloadWorkload}


def resolve(cfg: Any):
    """A TPWorkload / PPWorkload / OffloadWorkload from a config node, a dict or a dataclass; unknown
    keys and wrong types are errors (the same schema Hydra checks)."""
    if isinstance(cfg, (TPWorkload, PPWorkload, OffloadWorkload)):
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


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_shape(m: TransformerShape, split: int, split_name: str) -> None:
    """The checks every transformer shape needs; `split` is the tensor-parallel degree."""
    for key in ("layers", "hidden", "heads", "ffn_mult", "seq", "batch", "vocab"):
        v = getattr(m, key)
        check(v >= 1, f"workload.model.{key} must be >= 1, got {v}")
    check(m.dtype in ("bf16", "fp16"), f"workload.model.dtype must be bf16 or fp16, got {m.dtype!r}")
    check(m.hidden % m.heads == 0, f"workload.model.hidden ({m.hidden}) must be divisible by workload.model.heads ({m.heads})")
    hd = m.hidden // m.heads
    check(hd % 8 == 0 and hd <= 256, f"workload.model: head dim hidden/heads = {hd} must be a multiple of 8 and <= 256")
    if split > 1:
        check(m.heads % split == 0, f"workload.model.heads ({m.heads}) must be divisible by workload.{split_name} ({split})")
        check(m.vocab % split == 0, f"workload.model.vocab ({m.vocab}) must be divisible by workload.{split_name} ({split})")
