"""`emo`: one console script; each sub-command is a module of emo/cli/ (its command line), which calls
the library that does its job."""

from __future__ import annotations

import argparse
import importlib
import sys

from emo.errors import EmoError

# Each module exposes `register(subparsers)`, which adds its sub-command(s) with `func=` defaults.
COMMAND_MODULES = (
    "emo.cli.run",
    "emo.cli.analyze",
    "emo.cli.trace",
    "emo.cli.apply",
    "emo.cli.reset_clocks",
    "emo.cli.compare",
    "emo.cli.model",
    "emo.cli.gpu_config",
    "emo.cli.calibration",
    "emo.cli.ui",
    "emo.cli.perseus_plan",
)
# What `emo --help` lists, so that only the module of the command being run is imported (the
# others pull in pandas, numba, Hydra, MLflow, Snakemake). A module of COMMAND_MODULES missing
# here is simply imported up front.
COMMANDS = {
    "run": ("emo.cli.run", "run the pipeline (Snakemake) on a Hydra-composed configuration"),
    "analyze": ("emo.cli.analyze", "critical path, slack and replay error of a trace"),
    "trace": ("emo.cli.trace", "record a window of a real PyTorch program's iterations"),
    "apply": ("emo.cli.apply", "run a job with a frequency policy applied (no profiler)"),
    "reset-clocks": ("emo.cli.reset_clocks", "restore default GPU clocks after a crashed run"),
    "compare": ("emo.cli.compare", "table (and plots) of ES/PL per workload x method x budget from MLflow"),
    "model": ("emo.cli.model", "the energy-latency model on tables from any source"),
    "gpu-config": ("emo.cli.gpu_config", "write conf/gpu/<model>.yaml for this machine's NVIDIA GPU"),
    "calibration": ("emo.cli.calibration", "show, export or import a calibration (one file per GPU model)"),
    "ui": ("emo.cli.ui", "MLflow's web UI on the runs `emo run` logged (needs the `ui` extra)"),
    "perseus-plan": ("emo.cli.perseus_plan", "plan a Perseus stage profile with EMO; write Perseus's schedule files"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, with only the named sub-command's module imported."""
    parser = argparse.ArgumentParser(
        prog="emo",
        description="EMO: energy-minimising GPU clock schedules that keep iteration time. "
        "Start with `emo run` (the whole pipeline on the default configuration).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = next((a for a in argv if a in COMMANDS), None) if argv is not None else None
    lazy = {m for m, _ in COMMANDS.values()}
    load = [m for m in COMMAND_MODULES if m not in lazy or argv is None or (wanted and COMMANDS[wanted][0] == m)]
    for name in load:
        importlib.import_module(name).register(sub)
    for name, (module, text) in COMMANDS.items():
        if module not in load:
            sub.add_parser(name, help=text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (EmoError, ValueError, OSError) as e:  # bad input, a full disk, the GPU: one line
        from emo.errors import exit_code, one_line

        print(f"emo: error: {one_line(e)}", file=sys.stderr)
        return exit_code(e)  # by its type: docs/design.md, "Exit status"
    except KeyboardInterrupt as e:
        from emo.errors import exit_status, signal_name

        print(f"emo: interrupted ({signal_name(e)})", file=sys.stderr)
        return exit_status(e)
