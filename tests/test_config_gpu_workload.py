"""A workload the GPU config cannot run, and a real-GPU config on a machine without a GPU, fail when the
configuration is composed, in one line saying what to use, before any stage runs (issue 47: it ran the
whole virtual calibration first, or printed one error per stage)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emo.workflow.plan import compose

ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).resolve().parent / "fake_pynvml"


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["gpu.name=mygpu", "workload=command", "workload.command=[python,t.py]"], "use gpu=a100"),
        (["gpu=nvml"], "use workload=command"),
        (["workload=pp", "gpu.backend=nvml"], "use workload=command"),
    ],
)
def test_a_workload_the_gpu_cannot_run_is_one_line_at_composition(overrides, says):
    with pytest.raises(ValueError) as e:
        compose(overrides)
    assert "\n" not in str(e.value) and str(e.value).startswith("bad configuration: ") and says in str(e.value)


def test_what_each_gpu_runs_composes():
    compose(["gpu=nvml", "workload=command"])
    compose(["gpu=h100", "workload=command", "workload.command=[python,t.py]"])  # the virtual GPU stands in
    compose(["gpu=nvml", "workload=recorded", "workload.path=t.json"])
    compose(["workload=recorded", "workload.path=t.json"])


def _emo_run(tmp_path, *overrides, env=None):
    return subprocess.run(
        [sys.executable, "-m", "emo.cli", "run", f"results={tmp_path / 'results'}", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_emo_run_of_a_command_on_a_virtual_gpu_it_cannot_size_fails_before_calibrating(tmp_path):
    t0 = time.monotonic()
    r = _emo_run(tmp_path, "gpu.name=mygpu", "workload=command", "workload.command=[python,train.py]")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "emo: error: bad configuration: workload=command on the virtual GPU" in r.stderr and "gpu=a100" in r.stderr
    assert not (tmp_path / "results" / "calibrate").exists() and time.monotonic() - t0 < 60


def test_emo_run_on_nvml_without_a_gpu_is_one_line_before_any_stage(tmp_path):
    # NVML that finds no driver (the NVML fake's nvmlInit fails as the real one does without one)
    env = {"PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT)]), "EMO_FAKE_NVML_INIT_ERROR": "12"}
    r = _emo_run(tmp_path, "gpu=nvml", "workload=command", "workload.command=[python,train.py]", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "gpu.backend=nvml needs an NVIDIA GPU: cannot initialise NVML" in r.stderr and "gpu=a100" in r.stderr
    assert not [p for p in (tmp_path / "results").glob("*/*") if p.name != "mlflow.db"]


def test_emo_run_against_fake_gpus_says_what_they_can_run(tmp_path):
    r = _emo_run(
        tmp_path, "gpu=nvml", "workload=command", "workload.command=[python,train.py]", env={"EMO_FAKE_GPU": "2"}
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "with EMO_FAKE_GPU=2: the fake GPUs answer NVML's calls only (emo apply, emo.apply, emo.measure)" in r.stderr
    assert not (tmp_path / "results" / "calibrate").exists()
