"""Policies checked before any clock changes (issue 48 item 4), against the NVML fake (an A100 whose
SM clocks are nvml_fake.GRAPHICS): a number that is not one, a clock the GPU does not support, a
policy for another GPU model or another rank count is one line naming the file, exit 2 under `emo
apply`, and not one clock request made."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import emo
from emo.policy import FrequencyPolicy

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

GOOD = {"gpu": "a100", "steps": {"0": [{"t_ms": 0, "sm_mhz": 1410}, {"t_ms": 2, "sm_mhz": 900}]}, "period_ms": 6}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    yield from nvml_fake.for_loop_api(monkeypatch, tmp_path / "owner-calls.jsonl", gpus=2)


def _write(tmp_path, policy: dict) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))  # Python's json writes Infinity/NaN, as a hand-edited file may hold
    return path


def _with_step(**step) -> dict:
    return {**GOOD, "steps": {"0": [{"t_ms": 0, "sm_mhz": 1410, **step}]}}


NOT_NUMBERS = [
    (_with_step(sm_mhz=-705), "steps.0.sm_mhz"),
    (_with_step(sm_mhz=True), "steps.0.sm_mhz"),
    (_with_step(sm_mhz=float("inf")), "steps.0.sm_mhz"),
    (_with_step(sm_mhz=float("nan")), "steps.0.sm_mhz"),
    (_with_step(sm_mhz="900"), "steps.0.sm_mhz"),
    (_with_step(t_ms=float("inf")), "steps.0.t_ms"),
    (_with_step(t_ms=float("nan")), "steps.0.t_ms"),
    ({**GOOD, "lead_ms": float("inf")}, "lead_ms"),
    ({**GOOD, "period_ms": float("nan")}, "period_ms"),
    ({**GOOD, "meta": {"ranks": {"a": 0}}}, "meta.ranks"),
    ({**GOOD, "meta": {"ranks": {"0": "x"}}}, "meta.ranks"),
    ({**GOOD, "meta": {"ranks": [0, 1]}}, "meta.ranks"),
    ({**GOOD, "meta": {"ranks": {"0": 0, "1": 5}}}, "device 5"),
    ({**GOOD, "steps": {"0": {"t_ms": 0}}}, "steps.0"),
]


@pytest.mark.parametrize("policy, words", NOT_NUMBERS, ids=[w + str(i) for i, (_, w) in enumerate(NOT_NUMBERS)])
def test_a_policy_with_a_number_that_is_not_one_is_not_a_policy(tmp_path, policy, words):
    path = _write(tmp_path, policy)
    with pytest.raises(ValueError) as e:
        FrequencyPolicy.load(path)
    assert str(e.value).startswith(f"{path}: not a frequency policy") and words in str(e.value)
    assert "\n" not in str(e.value)


UNFIT = [
    (_with_step(sm_mhz=5000), "5000 MHz is not a clock this GPU supports"),
    (_with_step(sm_mhz=10**30), "is not a clock this GPU supports"),
    (_with_step(sm_mhz=1000), "1000 MHz is not a clock this GPU supports"),
    ({**GOOD, "gpu": "h100"}, "made for GPU model 'h100', this GPU is 'a100_sxm4_40gb'"),
    ({**GOOD, "steps": {}}, "no clock steps"),
]


@pytest.mark.parametrize("policy, words", UNFIT, ids=[str(i) for i in range(len(UNFIT))])
def test_emo_apply_refuses_a_policy_the_gpu_cannot_follow_before_the_job_starts(fake, tmp_path, capsys, policy, words):
    from emo.cli import main

    marker = tmp_path / "ran"
    path = _write(tmp_path, policy)
    rc = main(["apply", "--policy", str(path), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"emo: error: {path}") and words in err[0], err
    assert not marker.exists() and not [c for c in fake.calls if c[0] == "lock"]


@pytest.mark.parametrize("policy, words", UNFIT[:4], ids=[str(i) for i in range(4)])
def test_emo_apply_in_the_loop_refuses_it_too(fake, tmp_path, policy, words):
    path = _write(tmp_path, policy)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        emo.apply(str(path))
    assert not [c for c in fake.calls if c[0] == "lock"]


def test_a_policy_for_more_ranks_than_the_job_has_is_refused(fake, tmp_path, monkeypatch):
    steps = {str(r): [{"t_ms": 0, "sm_mhz": 1410}] for r in range(8)}
    path = _write(tmp_path, {**GOOD, "steps": steps})
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"covers rank\(s\) 0-7 but this job has WORLD_SIZE=2"):
        emo.apply(str(path))
    assert not [c for c in fake.calls if c[0] == "lock"]


def test_the_clock_owner_refuses_a_clock_the_gpu_does_not_support(fake):
    from emo.device import clock_owner
    from emo.device.control import GpuAccessError

    owner = clock_owner.owner()
    with pytest.raises(GpuAccessError, match="5000 MHz is not a clock this GPU supports") as e:
        owner.set_clock(0, 5000)
    assert e.value.cause == "out of range"
    owner.set_clock(0, 900)  # a supported one lands
    assert [c[:3] for c in fake.calls if c[0] == "lock"] == [("lock", 0, 900)]


@pytest.mark.parametrize(
    "policy_gpu, key, fits",
    [
        ("a100", "a100_sxm4_80gb", True),
        ("h100", "h100_80gb_hbm3", True),
        ("rtx3080ti", "rtx3080_ti", True),
        ("v100", "v100_sxm2_32gb", True),
        ("h200", "h200", True),
        ("auto", "h200", True),
        ("a10", "a100_sxm4_80gb", False),
        ("h100", "h200", False),
        ("a100_sxm4_80gb", "a100_sxm4_40gb", False),
    ],
)
def test_a_policy_fits_the_models_its_name_starts(policy_gpu, key, fits):
    from emo.policy import model_matches

    assert model_matches(policy_gpu, key) is fits
