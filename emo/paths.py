"""Where EMO's own files are.

`PACKAGE_PARENT` holds the `emo` package (the repository in a checkout or an editable install,
site-packages for a built wheel): module sources are named relative to it, so the same code has the
same digest however it was installed. `ROOT` holds the pipeline's files (Snakefile, workflow/, conf/,
profiles/, microbench/): the repository, or the copy a built wheel carries in emo/_project
(setup.py)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PACKAGE_PARENT = PACKAGE.parent
PROJECT_FILES = ("Snakefile", "workflow", "conf", "profiles", "microbench")


def _root() -> Path:
    checkout = PACKAGE_PARENT
    if (checkout / "Snakefile").is_file() and (checkout / "conf").is_dir():
        return checkout
    return PACKAGE / "_project"


ROOT = _root()
