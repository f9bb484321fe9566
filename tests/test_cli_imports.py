"""`emo --help` and `emo analyze` start without loading what they do not use (which modules get
imported is checked, not the time: that depends on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
HEAVY = (
    "pandas",
    "numba",
    "numpy",
    "pyarrow",
    "scipy",
    "mlflow",
    "hydra",
    "omegaconf",
    "snakemake",
    "matplotlib",
    "sqlalchemy",
    "msgspec",
)


def loaded(code: str) -> set[str]:
    """Top-level packages of HEAVY that `code` imports, in a fresh interpreter."""
    probe = (
        f"import sys\n{code}\n"
        f"print('\\n' + __import__('json').dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout.strip().splitlines()[-1]))


def test_help_imports_nothing_heavy():
    assert loaded("from emo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass") == set()


def test_analyze_help_imports_nothing_heavy():
    assert (
        loaded("from emo.cli import main\ntry:\n    main(['analyze', '--help'])\nexcept SystemExit:\n    pass") == set()
    )


@pytest.mark.skipif(not TRACES.exists(), reason="shared real traces not present")
def test_analyze_loads_only_the_analysis_stack():
    trace = TRACES / "hta_event_sync_a100_1stream.json.gz"
    mods = loaded(f"from emo.cli import main\nassert main(['analyze', {str(trace)!r}]) == 0")
    assert {"pandas", "numba", "msgspec"} <= mods  # what the analysis does use
    assert not mods & {"mlflow", "hydra", "omegaconf", "snakemake", "matplotlib", "sqlalchemy"}, mods
