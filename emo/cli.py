"""`emo`: one console script; each sub-command lives in the module that does its job."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes `register(subparsers)`, which adds its sub-command(s) with `func=` defaults.
COMMAND_MODULES = ("emo.run", "emo.analyze", "emo.capture", "emo.clocks", "emo.compare", "emo.ui")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="emo", description="EMO: energy-minimising GPU clock schedules that keep iteration time. "
                                "Start with `emo run` (the whole pipeline on the default configuration).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:  # bad input: one line, no traceback
        print(f"emo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
