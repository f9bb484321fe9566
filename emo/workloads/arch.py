"""What a workload needs to know about the GPU it pretends to run on: the kernel-name family the
libraries pick on it (cuBLAS/cutlass/flash-attention differ per architecture), its SM count and L2
size (for grids, waves and L2 reuse). Nothing about speed or power: that is the simulator's physics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    gpu: str  # model key, e.g. "a100"
    family: str  # "volta", "ampere" or "hopper": selects kernel-name templates
    sm: int  # compute capability as in cutlass names, e.g. 80
    sms: int  # streaming multiprocessors
    l2_bytes: int
    warps_per_sm: int = 64
    bf16: bool = True  # Volta has no bf16: the workload runs in fp16 there


ARCHS = {
    "a100": Arch("a100", "ampere", 80, 108, 40 << 20),
    "h100": Arch("h100", "hopper", 90, 132, 50 << 20),
    "rtx3080ti": Arch("rtx3080ti", "ampere", 86, 80, 6 << 20, warps_per_sm=48),
    "v100": Arch("v100", "volta", 70, 80, 6 << 20, bf16=False),
}


def arch_for(gpu) -> Arch:
    """The Arch for a GPU model key, or for a GPU config (anything with a `name`)."""
    name = gpu if isinstance(gpu, str) else (gpu["name"] if isinstance(gpu, dict) else getattr(gpu, "name", None))
    try:
        return ARCHS[str(name).lower()]
    except KeyError:
        raise ValueError(f"gpu: unknown GPU model {name!r} for workloads (known: {', '.join(ARCHS)})") from None


def check_virtual_command(gpu: dict, wl: dict) -> None:
    """A program (`command`) runs on a real GPU, or on the CPU with a virtual GPU standing in for its
    kernels (emo.device.sim.command), which it sizes for a GPU model of ARCHS: another model fails at
    composition, in one line."""
    from emo.workloads import find  # the package imports this module

    kind = find(wl.get("kind")) if isinstance(wl, dict) else None
    if kind is not None and kind.command and gpu.get("backend") == "sim":
        if str(gpu.get("name")).lower() not in ARCHS:
            raise ValueError(
                f"bad configuration: workload=command on the virtual GPU runs your program on the CPU with the "
                f"virtual GPU standing in for its kernels, which it sizes for a GPU model it knows "
                f"({', '.join(ARCHS)}), not gpu.name={gpu.get('name')}: use gpu=a100 (or h100, rtx3080ti, v100), "
                "or gpu=nvml on a GPU box"
            )
