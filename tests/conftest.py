"""Shared test fixtures."""

from __future__ import annotations

import os
import tempfile

import pytest
import snakemake.shell  # noqa: F401  # it keeps sys.stdout of its first import for every job it starts:

# imported here, that is the session's stream, not a test's capfd stream that is closed after the test
from emo.stages import run_in_place

# GPU lock records (emo.device.gpu_locks) of this session's fake GPUs, never the node's real folder:
# every process a test starts inherits it
os.environ["EMO_GPU_LOCK_DIR"] = tempfile.mkdtemp(prefix="emo-test-gpu-locks-")


@pytest.fixture(scope="session")
def run_stage():
    """One pipeline stage in-process (emo.stages.run_in_place)."""
    return run_in_place
