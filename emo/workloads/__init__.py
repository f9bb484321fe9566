"""Synthetic workloads: the programs the virtual GPU runs (`emo.device.sim.program` format).

    build_program(cfg, gpu="a100") -> Program

`cfg` is a workload config (OmegaConf node, dict or dataclass) whose `kind` selects:
- "tp": tensor parallelism over 2/4/8 GPUs, Domino-style overlap of all-reduces (emo.workloads.tp);
- "pp": pipeline parallelism over 2/4/8 GPUs, 1F1B, P2P send/recv (emo.workloads.pp);
- "hybrid": TP x PP x DP: TP groups as stages of a 1F1B pipeline, replicated DP times, DDP-bucketed
  gradient all-reduce over the replicas at the end of backward (emo.workloads.hybrid);
- "offload": MoE decode with experts on the CPU, KTransformers style (emo.workloads.offload).
`gpu` (model key or GPU config) picks the kernel names the libraries use on that architecture.
"""
from __future__ import annotations

from typing import Any

from emo.device.sim.program import Program
from emo.workloads.arch import arch_for
from emo.workloads.params import resolve

__all__ = ["build_program"]


def build_program(cfg: Any, gpu: Any = "a100") -> Program:
    """One iteration of the configured workload, per rank. Raises ValueError for bad parameters."""
    w = resolve(cfg)
    arch = arch_for(gpu)
    if w.kind == "tp":
        from emo.workloads import tp
        return tp.build(w, arch)
    if w.kind == "pp":
        from emo.workloads import pp
        return pp.build(w, arch)
    if w.kind == "hybrid":
        from emo.workloads import hybrid
        return hybrid.build(w, arch)
    from emo.workloads import offload
    return offload.build(w, arch)
