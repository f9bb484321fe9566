"""`emo perseus-plan`: EMO's planner on a Perseus stage profile, written as Perseus's own plan.

    emo perseus-plan PROFILE.csv --stages N --microbatches M (--budget 0.05 | --target-time S)
                     [--gpu a100 | a40 | --blocking-power W] [--unit-time 0] -o DIR

PROFILE.csv is Perseus's stage profile (stage, instruction, frequency, time, energy). EMO plans the
1F1B pipeline Perseus's planner plans (Merak's order, P2P blocking power while a stage waits;
docs/perseus.md) for the least energy within the time budget (a fraction over the iteration at the
maximum clocks) or the target iteration time, and writes DIR/freqs_pipeline.py (for Perseus's
PointSolution scheduler: `solution_path`) and DIR/sched.json (per rank, `power_states` in Merak's
command order, what Perseus's client applies), and DIR/plan.json (what it expects).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "perseus-plan",
        help="plan a Perseus stage profile with EMO and write Perseus's schedule files",
        description=__doc__,
    )
    p.add_argument("profile", help="Perseus stage profile CSV (stage, instruction, frequency, time, energy)")
    p.add_argument("--stages", type=int, required=True, help="pipeline stages (the profile's first N)")
    p.add_argument("--microbatches", type=int, required=True, help="microbatches per iteration")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--budget", type=float, help="allowed slowdown over the max-clock iteration, e.g. 0.05")
    when.add_argument("--target-time", type=float, help="iteration time to plan for, in seconds")
    power = p.add_mutually_exclusive_group()
    power.add_argument("--gpu", choices=("a100", "a40"), default="a100", help="Perseus's blocking power for this GPU")
    power.add_argument("--blocking-power", type=float, help="P2P blocking power in W (instead of --gpu)")
    p.add_argument(
        "--unit-time",
        type=float,
        default=0.0,
        help="quantise instruction times down to this many seconds, as Perseus's planner does (0.001); 0: as measured",
    )
    p.add_argument("-o", "--output", required=True, help="folder to write the schedule files into")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    import numpy as np

    from emo.perseus import schedule
    from emo.perseus.dag import BLOCKING_POWER_W, pipeline, plan
    from emo.perseus.profile import read_profile

    if args.budget is not None and not 0 <= args.budget < 10:
        raise ValueError(f"--budget must be in [0, 10) (got {args.budget})")
    if args.target_time is not None and not args.target_time > 0:
        raise ValueError(f"--target-time must be > 0 s (got {args.target_time})")
    watts = args.blocking_power if args.blocking_power is not None else BLOCKING_POWER_W[args.gpu]
    prof = read_profile(args.profile)
    dag = pipeline(prof, args.stages, args.microbatches, watts, args.unit_time)
    t0 = dag.problem.makespan0_ns * 1e-9
    target = args.target_time if args.target_time is not None else t0 * (1 + args.budget)
    try:
        cols = plan(dag, target)
    except ValueError as err:
        raise ValueError(f"--target-time: {err}") from None
    t, e = dag.accounting(cols)
    t_max, e_max = dag.accounting(np.full_like(cols, dag.problem.ref))
    clocks = schedule.stage_clocks(dag.stage, dag.knob_mhz[dag.stage, dag.kind, cols])
    summary = {
        "profile": str(args.profile),
        "stages": args.stages,
        "microbatches": args.microbatches,
        "blocking_power_w": watts,
        "unit_time_s": args.unit_time,
        "target_time_s": target,
        "iteration_time_s": t,
        "energy_j": e,
        "max_clock_time_s": t_max,
        "max_clock_energy_j": e_max,
    }
    comment = f"emo perseus-plan: iteration {t:.6g} s, energy {e:.6g} J (max clocks: {t_max:.6g} s, {e_max:.6g} J)"
    paths = schedule.write(args.output, clocks, args.microbatches, comment)
    (Path(args.output) / "plan.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"emo perseus-plan: {args.stages} stages x {args.microbatches} microbatches: iteration {t:.4g} s "
        f"(max clocks {t_max:.4g} s, target {target:.4g} s), energy {e:.6g} J ({100 * (e / e_max - 1):+.2f} % "
        f"vs max clocks); {', '.join(map(str, paths))}",
        file=sys.stdout,
    )
    return 0
