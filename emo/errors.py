"""Failures as one line a person can read: `emo: error: FILE: problem`.

Bad input raises ValueError / FileNotFoundError / OSError whose message starts with the user's file or
key; the error tree (EmoError: ConfigError, InputError, DeviceError) says by its type which exit status
a failure asks for (exit_code; docs/design.md, "Exit status"); this module turns any exception into that one line, carries a stage's line to `emo run` (a JSON
line appended to the file named by EMO_ERRORS) and turns the signals a terminal, ssh or a scheduler
sends (SIGTERM, SIGHUP) into an exception, so that every `finally` and error path runs as for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import TypeGuard

ERRORS_ENV = "EMO_ERRORS"  # set by `emo run`: where a failing stage appends its line
VERBOSE_ENV = "EMO_VERBOSE"  # set by `emo run --verbose`: stages also log (and trace back) to stderr
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
caught: list[int] = []  # the signals signals_raise turned into Interrupted, in order


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised where the program was (as Python raises KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class EmoError(Exception):
    """A failure EMO knows the meaning of; its class decides the exit status (`exit_code`), never its
    message. The subclasses keep the builtin they replaced as a base, so that callers catching
    ValueError or RuntimeError still catch them."""

    exit_code = 1


class ConfigError(EmoError, ValueError):
    """The configuration (a Hydra key, a flag, a policy's or optimizer's setting) is not one EMO can run:
    exit 2, as argparse exits on a bad command line."""

    exit_code = 2


class InputError(EmoError, ValueError):
    """What a stage or command was given (a trace, a table, a profile) cannot give a trustworthy
    answer: a failure of the input, exit 2 as for bad configuration (fix what you gave, then rerun)."""

    exit_code = 2


class DeviceError(EmoError, RuntimeError):
    """The GPU (or what controls it: NVML, zeusd, the clock owner, a launcher) could not be read or
    controlled as asked: exit 3, a failure of the machine, not of what was asked of it."""

    exit_code = 3


UNTYPED_INPUT_EXIT = 2  # an untyped ValueError or OSError (a full disk, a read-only folder): what it was given


def exit_code(e: BaseException) -> int:
    """The exit status a failure asks for, by its type: an EmoError's own code; 128 + the signal for an
    interrupt; 2 for an untyped ValueError or OSError; 1 for anything else (a bug)."""
    if isinstance(e, EmoError):
        return e.exit_code
    if is_interrupt(e):
        return exit_status(e)
    if isinstance(e, (ValueError, OSError)):
        return UNTYPED_INPUT_EXIT
    return 1


def stage_status(e: BaseException) -> int:
    """The exit status a failed stage asks `emo run` for: an EmoError's code; 1 for anything else
    (a stage given checked configuration that still fails untyped is EMO's failure, not the user's)."""
    return e.exit_code if isinstance(e, EmoError) else 1


def is_interrupt(e: BaseException) -> TypeGuard[KeyboardInterrupt]:
    return isinstance(e, KeyboardInterrupt)


def exit_status(e: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal stopped (130 for Ctrl-C)."""
    return 128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT)


def signal_name(e: KeyboardInterrupt) -> str:
    return signal.Signals(e.signum).name if isinstance(e, Interrupted) else "SIGINT"


def one_line(e: BaseException, replace: dict[str, str] | None = None) -> str:
    """`FILE: problem` for bad input (the file first, as the message says it), `Type: message`
    for anything else; `replace` maps internal paths (a stage's hidden temporary folder) to the
    ones the user knows."""
    if is_interrupt(e):
        text = f"interrupted ({signal_name(e)})"
    elif isinstance(e, OSError) and e.strerror:  # a full disk, a read-only folder: the path and why
        text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    elif isinstance(e, (EmoError, ValueError, FileNotFoundError)):
        text = str(e)
    else:
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    return redact(" ".join(text.split())) or type(e).__name__  # one line, whatever the message held


# scheme://user:password@host: a URI's password (tracking.uri, MLFLOW_TRACKING_URI) is never printed
_URI_PASSWORD = re.compile(r"(\b[A-Za-z][\w+.-]*://[^/@\s:]*):[^/@\s]*@")


def redact(text: str) -> str:
    """`text` with the password of every URI in it replaced by ***."""
    return _URI_PASSWORD.sub(r"\1:***@", text)


def write_stdout(text: str) -> None:
    """A command's output; a reader that went away (`emo ... | head -1`) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


def report(
    stage: str,
    line: str,
    log_file: str | None,
    *,
    killed: bool = False,
    folder: str | None = None,
    status: int = 1,
) -> None:
    """Hand a stage's failure to `emo run` (EMO_ERRORS), or print it when run by plain snakemake;
    `folder`: the stage folder it failed to make (so that no job computed from it shows a result);
    `status`: the exit status it asks for (exit_code of what it raised)."""
    record = {"stage": stage, "error": line, "log": log_file, "killed": killed, "folder": folder, "status": status}
    path = os.environ.get(ERRORS_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    else:
        print(stage_line(record), file=sys.stderr)


def stage_line(record: dict) -> str:
    where = f"stage {record['stage']}" + (f", log {record['log']}" if record.get("log") else "")
    return f"emo: error: {record['error']} ({where})"


def read_reports(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(ln) for ln in lines if ln.strip()]


@contextlib.contextmanager
def signals_raise():
    """SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread while inside (and are noted in
    `caught`, for code that swallows KeyboardInterrupt, as Snakemake's scheduler does); the previous
    handlers come back after. The first signal is also passed on to this process's children (a
    `kill` reaches only the parent; a Ctrl-C, the whole terminal group), so that they stop at once and
    clean up as well; later ones are noted only, so that the error paths they started can finish."""

    def handler(signum, frame):
        caught.append(signum)
        if len(caught) == 1:
            _forward(signum)
            raise Interrupted(signum)

    def unraisable(u) -> None:
        # the signal landed in code whose exceptions Python can only print (a weakref callback of
        # the import system, a __del__): deliver it again, to the code after it (a stage would
        # otherwise run on, its one SIGTERM from a dead run swallowed)
        if isinstance(u.exc_value, Interrupted):
            if caught and caught[-1] == u.exc_value.signum:
                caught.pop()
            # from another thread, a moment later: raised here it would be swallowed with the hook's own error
            threading.Timer(0.01, os.kill, (os.getpid(), u.exc_value.signum)).start()
        else:
            hook(u)

    caught.clear()
    previous = {}
    for sig in SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
            previous[sig] = signal.signal(sig, handler)
    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for sig, prev in previous.items():
            signal.signal(sig, prev)


def _forward(signum: int) -> None:
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(signum)
