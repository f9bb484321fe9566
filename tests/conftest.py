"""Shared test fixtures."""

from __future__ import annotations

import itertools
import os
import tempfile

import pytest
import snakemake.shell  # noqa: F401  # it keeps sys.stdout of its first import for every job it starts:

# imported here, that is the session's stream, not a test's capfd stream that is closed after the test
from emo.stages import run_in_place

# GPU lock records (emo.device.gpu_locks) of this session's fake GPUs, never the node's real folder:
# every process a test starts inherits it
os.environ["EMO_GPU_LOCK_DIR"] = tempfile.mkdtemp(prefix="emo-test-gpu-locks-")
_LOCKS, _TESTS = os.environ["EMO_GPU_LOCK_DIR"], itertools.count()


@pytest.fixture(autouse=True)
def gpu_lock_dir(monkeypatch):
    """A lock folder of each test's own (made on first use): a clock a test's process locked in-process and
    left to its quiet restore guard is recorded as held by pytest itself, which lives on into the next test."""
    monkeypatch.setenv("EMO_GPU_LOCK_DIR", os.path.join(_LOCKS, f"test{next(_TESTS)}"))


@pytest.fixture(scope="session")
def run_stage():
    """One pipeline stage in-process (emo.stages.run_in_place)."""
    return run_in_place
