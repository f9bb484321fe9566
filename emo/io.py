"""Artifact I/O at the edges: every file is written to a temporary name and renamed into place,
so an interrupted run never leaves a half-written artifact that a later run would trust."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it to `path`, on error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # not mkstemp: its files are 0600, where a results folder is read by whoever the umask lets
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_output(
    path: str | Path, option: str, *, inputs: dict[str, str | Path] | None = None, force: bool = False
) -> Path:
    """A file the user asked a command to write, checked before anything is computed (one line each):
    never one of the command's own inputs (`inputs`: option -> path) nor anything but a regular
    file (a device, a pipe, a folder), not over an existing file or a symbolic link unless `force`,
    and only into a folder that exists (a typo in the folder is not made into a new tree)."""
    path = Path(path)

    def refuse(why: str):
        raise ValueError(f"{option} {path}: cannot write ({why})")

    for opt, src in (inputs or {}).items():
        try:
            if Path(src).exists() and os.path.exists(path) and os.path.samefile(src, path):
                refuse(f"it is the {opt} input")
        except OSError:
            pass
    parent = path.parent
    if not parent.is_dir():
        refuse(f"no folder {parent}")
    if path.is_symlink():
        if not force:
            refuse("a symbolic link; pass --force to replace the link by a file")
    elif path.exists():
        if not path.is_file():
            refuse("not a regular file")
        if not force:
            refuse("it exists; pass --force to replace it")
    return path


def write_json(path: str | Path, obj, *, gz: bool = False) -> None:
    data = json.dumps(obj, indent=None if gz else 2, sort_keys=not gz, default=_jsonable).encode()
    with atomic_path(path) as tmp:
        if gz:
            with gzip.open(tmp, "wb", compresslevel=3) as f:
                f.write(data)
        else:
            tmp.write_bytes(data + b"\n")


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_parquet(path: str | Path, df: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def _jsonable(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
