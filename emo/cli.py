"""`emo`: one console script; each sub-command lives in the module that does its job."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes `register(subparsers)`, which adds its sub-command(s) with `func=` defaults.
COMMAND_MODULES = ("emo.run", "emo.analyze", "emo.capture", "emo.clocks", "emo.compare")


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
    except (ValueError, OSError) as e:  # bad input, a full disk, a folder we may not write: one line
        from emo.errors import one_line

        print(f"emo: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from emo.errors import exit_status, signal_name

        print(f"emo: interrupted ({signal_name(e)})", file=sys.stderr)
        return exit_status(e)


if __name__ == "__main__":
    sys.exit(main())
