"""Shared test fixtures."""
from __future__ import annotations

import pytest

from emo.stages import run_in_place


@pytest.fixture(scope="session")
def run_stage():
    """One pipeline stage in-process (emo.stages.run_in_place)."""
    return run_in_place
