"""A stage opens only what it declared: while `only(...)` holds, an audit hook (sys.addaudithook,
installed once per process) refuses to open or list a path inside a guarded folder (an upstream
stage's folder, the folder of a declared outside file) that is not a declared outside file or
under one. The stage's own output folder is always open to it.

Python's own file access raises the audited events (open, os.listdir, os.scandir); a library
reading in C (pyarrow) does not, which is why run_in_place also hands a stage its inputs as links
in a folder that holds nothing else. The hook costs one function call per audited event and
returns at once when no stage runs.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

EVENTS = frozenset({"open", "os.listdir", "os.scandir"})


@dataclass(frozen=True)
class Rule:
    stage: str
    guarded: tuple[str, ...]  # folders whose undeclared files the stage may not open
    allowed: tuple[str, ...]  # declared paths (a folder: everything under it)
    out: str

    def refuses(self, path: str) -> bool:
        return (_under(path, self.guarded) and not _under(path, self.allowed) and not _under(path, (self.out,)))


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


_rule: Rule | None = None
_installed = False


def _hook(event: str, args: tuple) -> None:
    rule = _rule
    if rule is None or event not in EVENTS or not args:
        return
    path = args[0]
    if path is None or isinstance(path, int):  # a file descriptor: opened through a path checked before
        return
    p = os.path.abspath(os.fsdecode(path))
    if rule.refuses(p):
        raise PermissionError(f"{p}: stage {rule.stage} did not declare it (emo.stages.{rule.stage}.STAGE: "
                              "inputs or outside)")


@contextlib.contextmanager
def only(stage: str, upstream: Iterable[Path], outside: Iterable[str], out: Path) -> Iterator[None]:
    """While the block runs, `stage` may open in `upstream` folders and beside `outside` paths only
    the `outside` paths themselves (its inputs reach it as links elsewhere)."""
    global _rule, _installed
    outside = [os.path.abspath(p) for p in outside]
    guarded = [os.path.abspath(p) for p in upstream] + [os.path.dirname(p) for p in outside]
    if not _installed:
        sys.addaudithook(_hook)  # for the life of the process (hooks cannot be removed)
        _installed = True
    before, _rule = _rule, Rule(stage, tuple(guarded), tuple(outside), os.path.abspath(out))
    try:
        yield
    finally:
        _rule = before
