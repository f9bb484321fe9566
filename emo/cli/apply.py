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


def preflight(policy: Path) -> None:
    """One line, before the job starts, for what would fail in every rank: no file, not a policy, no GPU."""
    from emo.device.control import open_control
    from emo.policy import FrequencyPolicy
    from emo.runtime import refuse_triggered

    if not policy.is_file():
        raise FileNotFoundError(f"{policy}: no such policy file")
    refuse_triggered(FrequencyPolicy.load(policy), str(policy))
    open_control().close()  # GpuAccessError: e.g. "cannot initialise NVML (...): no NVIDIA driver or GPU"


def read_reports(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("rank*.json"))]


def summary(reports: list[dict]) -> list[str]:
    lines = [
        f"rank {r['rank']} ({'every schedule' if r['device'] is None else 'policy device ' + str(r['device'])}): "
        f"{r['landed']} clock requests landed, "
        f"{r['failed']} failed over {r['iterations']} iterations" + (f" ({r['errors'][0]})" if r.get("errors") else "")
        for r in reports
    ]
    landed, failed = sum(r["landed"] for r in reports), sum(r["failed"] for r in reports)
    unreset = sum(r.get("resets_failed", 0) for r in reports)
    return lines + [
        f"{len(reports)} rank(s): {landed} clock requests landed, {failed} failed"
        + (f", {unreset} resets failed: run `emo reset-clocks`" if unreset else "")
    ]


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
    return 1 if any(r["failed"] or r.get("resets_failed") for r in reports) else 0
