"""Numba's cache of compiled kernels lives under the user's cache folder, not in the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_numba_cache_goes_under_the_user_cache_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "kern.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef inc(x):\n    return x + 1\n")
    code = "import emo, kern; assert kern.inc(1) == 2"  # importing emo first, as every emo entry point does
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=f"{src}{os.pathsep}{ROOT}")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    cached = list((tmp_path / "cache" / "emo" / "numba").rglob("*.nbi"))
    assert cached, "no numba index under $XDG_CACHE_HOME/emo/numba"
    assert not list(src.rglob("*.nbi")), "numba wrote its cache beside the source"
