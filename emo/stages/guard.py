"""A stage opens only what it declared: while `only(...)` holds, an audit hook (sys.addaudithook,
installed once per process) refuses to open for reading a file under an upstream stage's folder, or
a file beside a declared outside file (in the same folder), that the stage did not declare.

Python's own file access raises the audited `open` event; a library reading in C (pyarrow) does
not, which is why run_in_place also hands a stage its inputs as links in a folder that holds nothing
else. Beside an outside file only its folder's own entries are checked, and code (.py, .pyc, .so)
and dotfiles are let through: a recorded trace may sit in the folder a stage imports its code from
or in /tmp. The hook costs one function call per audited event and returns at once when no stage
runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

CODE = (".py", ".pyc", ".so")


@dataclass(frozen=True)
class Rule:
    stage: str
    upstream: tuple[str, ...]  # folders whose files it may not open (its inputs reach it as links)
    beside: tuple[str, ...]  # folders of its outside files: their other entries are closed to it
    allowed: tuple[str, ...]  # its outside files (a folder: everything under it)
    out: str

    def refuses(self, path: str) -> bool:
        if _under(path, self.allowed) or _under(path, (self.out,)):
            return False
        if _under(path, self.upstream):
            return True
        name = os.path.basename(path)
        return os.path.dirname(path) in self.beside and not name.startswith(".") and not name.endswith(CODE)


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


_rule: Rule | None = None
_installed = False


def _hook(event: str, args: tuple) -> None:
    rule = _rule
    if rule is None or event != "open":
        return
    path, flags = args[0], args[2] if len(args) > 2 else None
    if path is None or isinstance(path, int):  # a file descriptor: opened through a path checked before
        return
    if isinstance(flags, int) and flags & os.O_ACCMODE != os.O_RDONLY:  # it writes: not what it reads
        return
    p = os.path.abspath(os.fsdecode(path))
    if rule.refuses(p):
        raise undeclared(rule.stage, p)


def undeclared(stage: str, path: str) -> PermissionError:
    return PermissionError(f"{path}: stage {stage} did not declare it (emo.stages.{stage}.STAGE: inputs or outside)")


@contextlib.contextmanager
def only(stage: str, upstream: Iterable[Path], outside: Iterable[str], out: Path) -> Iterator[None]:
    """While the block runs, `stage` may open in `upstream` folders and beside `outside` paths only
    the `outside` paths themselves (its inputs reach it as links elsewhere)."""
    global _rule, _installed
    outside = [os.path.abspath(p) for p in outside]
    rule = Rule(
        stage,
        tuple(os.path.abspath(p) for p in upstream),
        tuple({os.path.dirname(p) for p in outside}),
        tuple(outside),
        os.path.abspath(out),
    )
    if not _installed:
        sys.addaudithook(_hook)  # for the life of the process (hooks cannot be removed)
        _installed = True
    before, _rule = _rule, rule
    try:
        yield
    finally:
        _rule = before
