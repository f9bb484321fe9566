"""`emo reset-clocks`: put GPUs back to default clocks (and power limits) by hand, the last resort.

A training job's clocks come back by themselves however it dies, SIGKILL and os.abort included: its
clock owner (emo.device.clock_owner) resets them within a second. EMO's own stages restore theirs
on exit, exceptions and SIGINT/SIGTERM/SIGHUP (emo.device.nvml). What needs this command: a node
that crashed, a clock owner killed before it could reset (SIGKILL to it directly), or a SIGKILL to
one of EMO's own stages (calibrate) while it held a clock. It removes the GPUs' lock records
(emo.device.gpu_locks) and says whose they were; a live job whose GPU it reset reports the clock lost.
"""

from __future__ import annotations

import sys


def reset_clocks(gpus: list[int] | None = None, *, power: bool = False, said: list[str] | None = None) -> list[int]:
    """Reset locked SM clocks (and, with power=True, power limits) of `gpus` (default: all), and remove
    their lock records (emo.device.gpu_locks), one line in `said` per record found. Returns the
    indices reset (NVML's on NVIDIA GPUs)."""
    from emo.device import gpu_locks
    from emo.device.control import GpuAccessError, open_control

    control = open_control()
    try:
        count = control.count()
        targets = list(range(count)) if not gpus else gpus
        bad = [g for g in targets if not 0 <= g < count]
        if bad:
            raise GpuAccessError(f"no GPU {bad[0]} (this machine has {count}: 0-{count - 1})")
        for g in targets:
            control.reset_sm_clock(g)
            if power:
                control.reset_power_limit(g)
            rec = gpu_locks.forget(g)
            if rec is not None and said is not None:
                said.append(
                    f"GPU {g} was held by {rec.describe()}: reset anyway (that job reports its clock lost)"
                    if rec.holder.alive()
                    else f"GPU {g} was left locked by {rec.describe()}, now dead: reset"
                )
        return targets
    finally:
        control.close()


def _parse_gpus(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gpus {text!r}: want comma-separated NVML indices, e.g. 0,1") from None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reset-clocks",
        help="restore default GPU clocks by hand (a node crash, a killed clock owner)",
        description=__doc__,
    )
    p.add_argument("--gpus", help="comma-separated NVML indices (default: all GPUs)")
    p.add_argument("--power", action="store_true", help="also reset power limits to their defaults")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    said: list[str] = []
    done = reset_clocks(_parse_gpus(args.gpus), power=args.power, said=said)
    for line in said:
        print(f"emo reset-clocks: {line}", file=sys.stderr)
    what = "clocks and power limits" if args.power else "clocks"
    print(f"reset {what} of GPU {', '.join(map(str, done))}", file=sys.stdout)
    return 0
