"""Shared test helpers."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest


def _run_stage(stage: str, cfg: dict, inputs: dict, out: Path) -> dict:
    """One pipeline stage in-process, as its Snakemake rule runs it (emo.stages.<stage>.run)."""
    out.mkdir(parents=True, exist_ok=True)
    return importlib.import_module(f"emo.stages.{stage}").run(cfg, {k: Path(v) for k, v in inputs.items()}, out)


@pytest.fixture(scope="session")
def run_stage():
    return _run_stage
