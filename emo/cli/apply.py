"""`emo apply --policy P -- <command>`: run the job with the runtime applier and nothing else (no
profiler, no window), then say how many clock requests landed on each rank.

The command runs as given (python, torchrun, deepspeed, accelerate launch, a shell script); every
rank arms the applier through the injected sitecustomize (emo.capture) at its first iteration
marker, follows the policy's schedule for its rank on its own GPU, and reports at exit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from emo.device.launcher import ENV_POLICY, ENV_REPORT, CaptureSpec, build_command, inject_env
from emo.loop import preflight, recover_left


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "apply",
        help="run a job with a frequency policy applied (no profiler)",
        description="Run the command with the policy's clock schedule applied on every "
        "rank, and report the clock requests that landed.",
    )
    p.add_argument("--policy", required=True, help="policy.json (emo run's optimize stage writes it)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command as you run it")
    p.set_defaults(func=_cmd_apply)


def read_reports(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("rank*.json"))]


COUNTS = ("landed", "failed", "dropped", "lost", "late", "skipped", "resets_failed")
NOT_APPLIED = ("failed", "dropped", "lost", "resets_failed")  # any of these: exit 1


def summary(reports: list[dict]) -> list[str]:
    from emo.runtime import counts_text

    lines = [
        f"rank {r['rank']} ({'every schedule' if r['device'] is None else 'policy device ' + str(r['device'])}): "
        f"{counts_text(r, 'clock requests ')} over {r['iterations']} iterations"
        + (f" ({r['errors'][0]})" if r.get("errors") else "")
        for r in reports
    ]
    total = {k: sum(int(r.get(k, 0)) for r in reports) for k in COUNTS}
    return lines + [f"{len(reports)} rank(s): {counts_text(total, 'clock requests ')}"]


def _cmd_apply(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    policy = Path(args.policy)
    spec = CaptureSpec(command=command)  # validates the command
    preflight(policy)
    with tempfile.TemporaryDirectory(prefix="emo-apply-") as tmp:
        env = inject_env()
        env[ENV_POLICY], env[ENV_REPORT] = str(policy.resolve()), tmp
        rc = subprocess.run(build_command(spec), env=env).returncode
        reports = read_reports(Path(tmp))
    for line in summary(reports):
        print(f"emo apply: {line}", file=sys.stderr)
    for line in recover_left():
        print(f"emo apply: {line}", file=sys.stderr)
    if rc != 0:
        print(f"emo apply: {' '.join(command)} exited with status {rc}", file=sys.stderr)
        return rc if rc > 0 else 128 - rc  # killed by signal -rc: the shell's convention
    if not reports:
        print(
            "emo apply: no rank marked an iteration (no optimizer step, emo.step() or clocks.step()): "
            "nothing was applied",
            file=sys.stderr,
        )
        return 1
    return 1 if any(r.get(k) for r in reports for k in NOT_APPLIED) else 0
