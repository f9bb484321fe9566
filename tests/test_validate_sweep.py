"""Sweeps: re-running a finished sweep does nothing; adding a budget runs only optimize and validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from emo.cli import main as cli_main
from emo.workflow.plan import STAGES

SMALL = [
    "workload=tp",
    "workload.tp=2",
    "workload.model.layers=1",
    "model.clocks_stride=8",
    "model.repeats=1",
    "model.min_seconds=0.2",
    "trace.iterations=2",
    "validate.min_seconds=0.5",
    "tracking.enabled=false",
]


def stage_folders(results: Path) -> dict[str, set[tuple[str, float]]]:
    """stage -> {(hash, mtime of its config.json)} of every finished stage folder."""
    out: dict[str, set[tuple[str, float]]] = {}
    for cfg in results.glob("*/*/config.json"):
        out.setdefault(cfg.parent.parent.name, set()).add((cfg.parent.name, cfg.stat().st_mtime))
    return out


@pytest.mark.slow
@pytest.mark.skipif(
    "optimize" not in STAGES or "validate" not in STAGES, reason="pipeline has no optimize/validate stages"
)
def test_rerun_is_a_no_op_and_a_new_budget_reruns_only_optimize_and_validate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    sweep = ["-m", "optimizer=static,geepafs", f"results={results}", *SMALL]
    assert cli_main(["run", "-c", "2", *sweep, "budget=0.02"]) == 0
    first = stage_folders(results)
    assert len(first["validate"]) == 2 and {"trace", "graph", "optimize"} <= set(first)

    assert cli_main(["run", "-c", "2", *sweep, "budget=0.02"]) == 0
    assert stage_folders(results) == first  # nothing re-ran, nothing was rewritten

    assert cli_main(["run", "-c", "2", *sweep, "budget=0.02,0.05"]) == 0
    after = stage_folders(results)
    changed = {s for s in after if after[s] != first.get(s)}
    assert changed == {"optimize", "validate"}
    assert after["validate"] > first["validate"] and len(after["validate"]) == 4
