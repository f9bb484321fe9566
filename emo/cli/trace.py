"""`emo trace -- <command>`: record a window of a real program's iterations with torch.profiler.

The command runs as the user gives it (`python train.py`, `torchrun ...`, `deepspeed ...`,
`accelerate launch ...`, a shell script); emo.device.launcher starts it with EMO injected, and the
in-program hooks (emo.capture) record the window in every rank. torch is imported only inside the
launched process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from emo.device.launcher import CaptureSpec, markers_needed, run_capture, run_result
from emo.loop import preflight


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "trace",
        help="record a window of a real PyTorch program's iterations",
        description="Record iterations of a training job, started as you start it "
        "(python, torchrun, deepspeed, accelerate launch, a shell script), with "
        "torch.profiler (Kineto, CUDA activities, cuda_sync events), one trace per "
        "rank; EMO ends the job after the window.",
    )
    p.add_argument("-o", "--out", default="results/capture", help="output folder (default: %(default)s)")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks of a plain `python script.py` (> 1: EMO starts it under torchrun --standalone); "
        "leave at 1 when the command is a launcher",
    )
    p.add_argument("--wait", type=int, default=5, help="iterations skipped before warmup")
    p.add_argument("--warmup", type=int, default=2, help="profiled but discarded iterations")
    p.add_argument("--active", type=int, default=3, help="recorded iterations")
    p.add_argument("--policy", help="a frequency policy JSON to apply while the program runs")
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- the command as you run it: python train.py ..., torchrun ..., deepspeed ..., "
        "accelerate launch ..., bash run.sh",
    )
    p.set_defaults(func=_cmd_trace)


def _cmd_trace(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    spec = CaptureSpec(command=command, nproc=args.nproc, wait=args.wait, warmup=args.warmup, active=args.active)
    if args.policy:  # no file, not a policy, no GPU: one line before the job starts
        preflight(Path(args.policy))
    print(
        f"emo trace: one launch of {' '.join(command)}; EMO ends it after {markers_needed(spec)} iterations "
        f"({spec.active} recorded)",
        file=sys.stderr,
    )
    res = run_capture(spec, Path(args.out), policy=Path(args.policy) if args.policy else None)
    rr = run_result(res, Path(args.out))
    for f in res.trace_files:
        print(f)
    e = "n/a (no NVML)" if rr.energy_j != rr.energy_j else f"{rr.energy_j:.3f} J"
    print(f"{rr.iterations} iterations: {rr.time_s:.4f} s, {e}")
    return 0
