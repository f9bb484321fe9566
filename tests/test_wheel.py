"""A built wheel (`pip install .`, not `-e`) runs the pipeline: it carries the Snakefile, the rules,
conf/, profiles/ and microbench/ (setup.py), and finds them away from any checkout (emo.paths)."""

import ast
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import emo.paths

REPO = Path(__file__).resolve().parents[1]


def test_setup_copies_what_emo_paths_expects():
    tree = ast.parse((REPO / "setup.py").read_text())
    copied = next(
        ast.literal_eval(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PROJECT_FILES"
    )
    assert tuple(copied) == emo.paths.PROJECT_FILES
    assert all((REPO / name).exists() for name in copied)


@pytest.mark.slow
def test_built_wheel_runs_emo_run(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("emo-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)  # the dependencies come from this Python
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what is installed
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
        env=env,
        check=True,
        capture_output=True,
    )
    work = tmp_path / "work"
    work.mkdir()
    where = subprocess.run(
        [str(py), "-c", "import emo.paths as p; print(p.PACKAGE); print(p.ROOT)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    where = where.stdout.split()
    assert Path(where[0]).is_relative_to(env_dir) and Path(where[1]) == Path(where[0]) / "_project"
    run = subprocess.run(
        [str(env_dir / "bin" / "emo"), "run", "--until", "graph"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert list((work / "results" / "graph").glob("*/nodes.parquet"))
