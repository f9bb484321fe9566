"""Each microbenchmark source compiles to PTX for sm_80 (where nvcc is installed; no GPU needed)
and exports its kernels unmangled, warning-free."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from emo.microbench import MICROBENCH_DIR, load_registry

NVCC = shutil.which("nvcc")
SOURCES = sorted(MICROBENCH_DIR.glob("*.cu"))


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_source_compiles_to_ptx(source: Path, tmp_path: Path):
    ptx = tmp_path / "out.ptx"
    run = subprocess.run(
        [NVCC, "-arch=sm_80", "--ptx", "-Werror", "all-warnings", "-o", str(ptx), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    text = ptx.read_text()
    for e in load_registry().values():
        if Path(e["path"]) == source:
            assert f".entry {e['kernel']}(" in text  # extern "C": the name NVRTC/cuModuleGetFunction looks up


def test_every_source_is_registered():
    used = {Path(e["path"]).name for e in load_registry().values()}
    assert used == {p.name for p in SOURCES}
