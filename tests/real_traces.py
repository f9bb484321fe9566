"""Where the real traces are: the small ones bundled in tests/data/traces (MIT, see its README),
the rest in ../shared/data/traces. `TRACES / name` finds either; a test on a missing one skips."""

from __future__ import annotations

from pathlib import Path

import pytest

BUNDLED = Path(__file__).resolve().parent / "data" / "traces"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


class _Traces:
    def __truediv__(self, name: str) -> Path:
        return BUNDLED / name if (BUNDLED / name).exists() else SHARED / name

    def exists(self) -> bool:
        return BUNDLED.exists() or SHARED.exists()

    is_dir = exists


TRACES = _Traces()


def real(name: str) -> Path:
    """The trace `name`, or a skip saying it is not here (the large ones live in ../shared only)."""
    p = TRACES / name
    if not p.exists():
        pytest.skip(f"{name}: not bundled and ../shared/data/traces is not present")
    return p
