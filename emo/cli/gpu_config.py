"""`emo gpu-config`: write conf/gpu/<model>.yaml for the NVIDIA GPU on this machine, from NVML.

Reads the model, the supported SM clocks, the default clock and the power limits (no permission
needed); the file is what `gpu=<model>` then composes, and what a team commits so that every
stage hash, and every shared calibration, names the GPU model and driver it was made on.
"""

from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "gpu-config", help="write conf/gpu/<model>.yaml for this machine's NVIDIA GPU", description=__doc__
    )
    p.add_argument("--index", type=int, default=0, help="NVML index of the GPU to describe (default 0)")
    p.add_argument("--out", help="file to write (default: conf/gpu/<model>.yaml of this checkout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    from emo.device.control import open_control
    from emo.device.nvml import gpu_config_yaml  # formatting only: no NVML call
    from emo.io import atomic_path, check_output
    from emo.sections import GpuConfig, typed
    from emo.workflow.plan import ROOT

    control = open_control()
    try:
        found = control.describe(args.index)
    finally:
        control.close()
    cfg = typed(GpuConfig, found)
    out = Path(args.out) if args.out else ROOT / "conf" / "gpu" / f"{cfg.name}.yaml"
    check_output(out, "--out", force=args.force)  # not over a file without --force, nor a device or into no folder
    with atomic_path(out) as tmp:
        tmp.write_text(gpu_config_yaml(cfg, found))
    print(
        f"wrote {out}: {cfg.physics['device_name']}, {len(cfg.clocks_mhz)} SM clocks "
        f"{cfg.clocks_mhz[0]}-{cfg.default_mhz} MHz, TDP {cfg.tdp_w:g} W; use it with gpu={cfg.name}",
        file=sys.stdout,
    )
    return 0
