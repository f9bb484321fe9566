"""The training-loop API against the NVML fake: `with emo.apply(policy) as clocks: ... clocks.step()`
drives this rank's own GPU with its rank's schedule, a rank the policy does not cover is an error,
and `emo.measure()` reads the energy counter over a window without any policy."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import emo
from emo import loop
from emo.policy import FrequencyPolicy, Step

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402


@pytest.fixture
def fake(monkeypatch, tmp_path):
    yield from nvml_fake.for_loop_api(monkeypatch, tmp_path / "owner-calls.jsonl", gpus=4)


def _policy(ranks, meta=None) -> FrequencyPolicy:
    return FrequencyPolicy(
        gpu="a100",
        steps={r: [Step(0.0, 1410), Step(2.0, 900 - 195 * (r % 2))] for r in ranks},
        period_ms=6.0,
        meta=meta or {},
    )


def _loop(clocks, n=6):
    for _ in range(n):
        clocks.step()
        time.sleep(0.006)


def test_each_rank_drives_its_own_gpu_with_its_own_schedule(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    path = tmp_path / "policy.json"
    _policy([0, 1]).save(path)
    with emo.apply(str(path), lead_ms=0) as clocks:
        _loop(clocks)
    locks = [c for c in fake.calls if c[0] == "lock"]
    assert {c[1] for c in locks} == {1} and {c[2] for c in locks} == {1410, 705}  # rank 1's schedule, GPU 1
    assert clocks.landed == len(locks) and clocks.failed == 0 and clocks.iterations == 6
    assert [c[0] for c in fake.calls if c[0] in ("lock", "reset")][-1] == "reset"
    assert loop.active() is None


def test_a_rank_the_policy_does_not_cover_is_an_error_not_silence(fake, monkeypatch):
    monkeypatch.setenv("RANK", "2")  # node 2 of a job, on a 2-GPU policy
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"no schedule for rank 2 \(it covers rank\(s\) 0, 1; WORLD_SIZE=4\)"):
        emo.apply(_policy([0, 1]))
    assert not [c for c in fake.calls if c[0] == "lock"]


def test_ranks_of_one_group_share_a_schedule_through_meta_ranks(fake, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    pol = _policy([0, 1], {"ranks": {"0": 0, "1": 0, "2": 1, "3": 1}})  # TP pairs: ranks 2, 3 follow device 1
    with emo.apply(pol, lead_ms=0) as clocks:
        _loop(clocks)
    assert clocks.device == 1 and {c[2] for c in fake.calls if c[0] == "lock"} == {1410, 705}
    assert loop.policy_device(pol, 0) == 0
    with pytest.raises(ValueError, match=r"no schedule for rank 4 \(it covers rank\(s\) 0-3"):
        loop.policy_device(pol, 4)


def test_bad_input_is_one_clear_error(fake, monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json: no such policy file"):
        emo.apply(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json: not a frequency policy"):
        emo.apply(str(tmp_path / "bad.json"))
    monkeypatch.setenv("LOCAL_RANK", "7")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="LOCAL_RANK=7 but this process sees 4 GPU"):
        emo.apply(_policy([0]))
    monkeypatch.setenv("LOCAL_RANK", "0")
    with emo.apply(_policy([0])):
        with pytest.raises(ValueError, match="is already applied in this process"):
            emo.apply(_policy([0]))


def test_measure_reads_the_energy_counter_over_a_window(fake, monkeypatch):
    with emo.measure() as w:  # a plain process: every visible GPU
        time.sleep(0.01)
    assert w.result.per_gpu_j == {i: pytest.approx(12.345) for i in range(4)}
    assert w.result.energy_j == pytest.approx(4 * 12.345) and w.result.time_s >= 0.01
    monkeypatch.setenv("LOCAL_RANK", "2")  # a rank: its own GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2,1")
    win = emo.measure()
    win.begin()
    e = win.end()
    assert list(e.per_gpu_j) == [1] and e.energy_j == pytest.approx(12.345)
    with pytest.raises(ValueError, match="end\\(\\) before begin\\(\\)"):
        win.end()
    assert not [c for c in fake.calls if c[0] in ("lock", "reset", "power")]  # measuring changes nothing


def test_apply_and_measure_without_a_gpu_are_one_line(monkeypatch):
    from emo.device.nvml import GpuAccessError

    nvml_fake.install(monkeypatch, init_error=nvml_fake._real.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setattr(loop, "_ACTIVE", None)
    monkeypatch.delenv("RANK", raising=False)
    for call in (lambda: emo.apply(_policy([0])), lambda: emo.measure()):
        with pytest.raises(GpuAccessError, match="cannot initialise NVML .*: no NVIDIA driver or GPU"):
            call()


def test_a_process_without_a_launcher_applies_every_schedule_on_its_gpu(fake):
    with emo.apply(_policy([0, 1]), lead_ms=0) as clocks:  # one process, two GPUs (model parallel)
        _loop(clocks)
    assert clocks.device is None
    assert {(c[1], c[2]) for c in fake.calls if c[0] == "lock"} == {(0, 1410), (0, 900), (1, 1410), (1, 705)}
    with pytest.raises(ValueError, match=r"schedules for GPUs \[0, 5\] but this process sees 4"):
        emo.apply(_policy([0, 5]))


def test_strict_clocks_raise_at_the_end_of_their_block_after_a_late_failure():
    """A request that fails after the last step() still stops a strict job when the block ends."""
    from emo.runtime import ClockRequestFailed, PolicyApplier

    class Refusing:
        def set_clock(self, device, mhz):
            raise PermissionError("no permission")

        def reset_clock(self, device):
            pass

    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0.0, 900)]}, period_ms=5.0)
    clocks = loop.Clocks(PolicyApplier(pol, Refusing(), strict=True), rank=0, device=0, source="p")
    with pytest.raises(ClockRequestFailed, match="could not lock the SM clock at 900 MHz"):
        with clocks:
            clocks.step()
            deadline = time.monotonic() + 5
            while clocks.failed == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
    assert clocks.closed


def test_emo_apply_says_failed_resets_and_exits_by_the_shells_convention():
    from emo.cli import apply as apply_cli

    reports = [{"rank": 0, "device": 0, "landed": 4, "failed": 0, "iterations": 3, "resets_failed": 1}]
    assert apply_cli.summary(reports)[-1] == (
        "1 rank(s): 4 clock requests landed, 0 failed, 1 resets failed (run `emo reset-clocks`)"
    )


def test_a_rank_bound_to_its_own_gpu_uses_the_one_it_sees(fake, monkeypatch):
    """SLURM's --gpu-bind (a CUDA_VISIBLE_DEVICES per task): rank 3 sees one GPU, NVML's 2; it follows
    rank 3's schedule there and measures that GPU, whatever its LOCAL_RANK says."""
    for k, v in (("RANK", "3"), ("LOCAL_RANK", "3"), ("WORLD_SIZE", "4"), ("CUDA_VISIBLE_DEVICES", "2")):
        monkeypatch.setenv(k, v)
    with emo.apply(_policy(range(4)), lead_ms=0) as clocks:
        _loop(clocks, 3)
    locks = [c for c in fake.calls if c[0] == "lock"]
    assert {c[1] for c in locks} == {2} and {c[2] for c in locks} == {1410, 705}  # rank 3's schedule
    with emo.measure() as window:
        pass
    assert set(window.result.per_gpu_j) == {2}
