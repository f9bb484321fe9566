"""docs/results.md as the benchmark scripts write it: one marked section per script, its own output,
stamped once (the command, the commit, the machine, the date).

A section is the text between `<!-- results:NAME -->` and `<!-- /results:NAME -->`; everything outside
the markers (headings, how to read a table) is left as it is. A script declares the flag and wraps its
run:

    ap = argparse.ArgumentParser(...)
    benchreport.add_flag(ap)                         # --write-results (default off)
    ...
    if __name__ == "__main__":
        with benchreport.recording("sim-speed"):     # tees stdout; on success, writes the section
            sys.exit(main())

Only what the script prints to `sys.stdout` is recorded (not its stderr, nor a child process writing
to the terminal itself), and only a run that ends with status 0 writes. The file is a checkout's
(`docs/results.md` beside the `emo` package): the benchmarks run from one.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

FLAG = "--write-results"
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def markers(name: str) -> tuple[str, str]:
    if not _NAME.fullmatch(name):
        raise ValueError(f"results section {name!r}: a name is lower-case letters, digits and dashes")
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def replace_section(text: str, name: str, body: str, *, where: str = "results.md") -> str:
    """`text` with the section NAME's content replaced by `body` (markers kept, on lines of their own)."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(
            f"{where}: section {name!r} needs one {begin} and one {end} "
            f"(found {text.count(begin)} and {text.count(end)})"
        )
    i, j = text.index(begin) + len(begin), text.index(end)
    if j < i:
        raise ValueError(f"{where}: section {name!r} ends before it begins")
    return text[:i] + "\n" + body.strip("\n") + "\n" + text[j:]


def section(text: str, name: str) -> str:
    """The content of section NAME (without its markers)."""
    begin, end = markers(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"section {name!r} not found")
    return text[i + len(begin) : j].strip("\n")


def _git(*args: str) -> str:
    try:
        r = subprocess.run(["git", *args], cwd=RESULTS.parent, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def commit() -> str:
    """The checkout's commit, `-dirty` when its tracked files differ from it; `unknown` outside git."""
    head = _git("rev-parse", "--short=10", "HEAD")
    if not head:
        return "unknown"
    return head + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (
        f"{platform.node() or 'unknown host'} ({platform.system()} {platform.machine()}, {os.cpu_count()} cores{load})"
    )


def stamp(command: str, *, at: str | None = None, on: str | None = None, date: str | None = None) -> str:
    """One line saying how the section below it was measured."""
    date = date or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"Written by `{command}` at commit {at or commit()} on {on or machine()}, {date}."


def write_section(name: str, body: str, *, command: str, path: Path = RESULTS, **stamp_args: str) -> Path:
    """Replace section NAME of `path` with the stamp and `body` (a script's table, verbatim)."""
    text = path.read_text()
    new = replace_section(text, name, stamp(command, **stamp_args) + "\n\n" + body.strip("\n"), where=str(path))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new)
    tmp.replace(path)
    return path


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        FLAG,
        action="store_true",
        help="replace this script's section of docs/results.md with its output, stamped (command, commit, machine, date)",
    )


class _Tee(io.TextIOBase):
    def __init__(self, out: TextIO):
        self.out, self.kept = out, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


def _command(argv: list[str]) -> str:
    script = Path(argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(RESULTS.parents[1])
    return shlex.join(["python", str(script), *(a for a in argv[1:] if a != FLAG)])


@contextlib.contextmanager
def recording(
    name: str | Callable[[list[str]], str], *, argv: list[str] | None = None, path: Path = RESULTS
) -> Iterator[None]:
    """With FLAG in `argv` (default sys.argv), record stdout and, if the block ends with status 0
    (normally or by sys.exit(0 / None)), write it as section NAME (a name, or a function of argv)."""
    argv = sys.argv if argv is None else argv
    if FLAG not in argv or {"-h", "--help"} & set(argv):
        yield
        return
    tee = _Tee(sys.stdout)
    ok = False
    try:
        with contextlib.redirect_stdout(tee):
            try:
                yield
                ok = True
            except SystemExit as e:
                ok = e.code in (None, 0)
                raise
    finally:
        if ok:
            label = name(argv) if callable(name) else name
            out = write_section(
                label, "```\n" + tee.kept.getvalue().rstrip("\n") + "\n```", command=_command(argv), path=path
            )
            print(f"results: wrote section {label!r} of {out}", file=sys.stderr)
