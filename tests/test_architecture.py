"""The models never see the virtual GPU's internals: an import-linter contract (pyproject.toml)."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_models_do_not_import_the_virtual_gpu():
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert cmd, "import-linter is not installed (pip install -e '.[test]')"
    r = subprocess.run([cmd, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
