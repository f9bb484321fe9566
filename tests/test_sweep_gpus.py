"""A job's GPU count on a real backend when its launcher does not say one (review of issue 46)."""

from __future__ import annotations

from emo.workflow import sweep


def test_a_launcher_without_a_count_holds_at_least_one_gpu_where_none_is_visible(monkeypatch):
    # a cluster's login node sees no GPU (no driver, no CUDA_VISIBLE_DEVICES): the job still asks
    # its scheduler for a GPU, as it did before launcher counts were read
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(sweep, "visible_gpus", lambda: [])
    cfg = {"gpu": {"backend": "nvml"}, "workload": {"kind": "command", "command": ["deepspeed", "t.py"], "nproc": 1}}
    assert sweep.gpus_needed(cfg) == 1
    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["0", "1"])
    assert sweep.gpus_needed(cfg) == 2
