"""The pipeline with a real job's shape (issue 45, item 5): conf/workload/pp-gpt3xl.yaml's instructions
against Perseus's gpt3-xl run at plan 0 (every instruction at the max clock, A100)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "instruction_lengths.py"


def _lengths():
    spec = importlib.util.spec_from_file_location("instruction_lengths", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["instruction_lengths"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_stages_of_plain_and_hybrid_pipelines():
    il = _lengths()
    assert il.stage_of_ranks({"kind": "pp", "pp": 4}) == {0: 0, 1: 1, 2: 2, 3: 3}
    hybrid = il.stage_of_ranks({"kind": "hybrid", "tp": 2, "pp": 2, "dp": 2})
    assert hybrid == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_gpt3xl_cell_has_the_measured_job_instruction_lengths():
    """Each stage's forward + backward (what a stage spends per micro-batch) within 25 % of the run's,
    their mean within 5 %. The virtual forwards are longer and the backwards shorter than Merak's (its
    backward / forward is 2.7, the virtual GPT's 1.9), and the LM head makes the last stage the longest
    where Merak's partition made the third: docs/baselines.md."""
    il = _lengths()
    if not il.GPT3XL_RUN.exists():
        pytest.skip(f"{il.GPT3XL_RUN}: Perseus's gpt3-xl run is not here")
    real = il.measured_gpt3xl()
    assert len(real) == 8 and 100 < real[(0, "forward")] < 110  # the run at plan 0: ms per instruction
    virt = il.virtual(["workload=pp-gpt3xl"], seed=0, iterations=1, warmup=1)
    assert sorted(virt) == sorted(real)
    pairs = [(il.pair_ms(virt, s), il.pair_ms(real, s)) for s in range(4)]
    for v, r in pairs:
        assert v == pytest.approx(r, rel=0.25)
    assert sum(v for v, _ in pairs) == pytest.approx(sum(r for _, r in pairs), rel=0.05)
