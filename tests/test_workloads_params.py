"""Workload parameters: bad values fail at once with one clear line; Hydra's conf/workload files build."""

from __future__ import annotations

from pathlib import Path

import pytest

from emo.workloads import build_program

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"kind": "tp", "tp": 3}, "workload.tp must be one of 2, 4, 8 (got 3)"),
        (
            {"kind": "tp", "tp": 8, "model": {"heads": 12, "hidden": 768}},
            "workload.model.heads must be divisible by workload.tp (8) (got 12)",
        ),
        ({"kind": "tp", "chunks": 3}, "workload.chunks must be a divisor of workload.model.batch (4) (got 3)"),
        ({"kind": "tp", "overlap": "ring"}, "workload.overlap must be one of domino, megatron (got 'ring')"),
        ({"kind": "tp", "chunks": 0}, "workload.chunks must be >= 1 (got 0)"),
        (
            {"kind": "tp", "model": {"hidden": 4100}},
            "workload.model.hidden must be divisible by workload.model.heads (32) (got 4100)",
        ),
        ({"kind": "tp", "model": {"dtype": "fp8"}}, "workload.model.dtype must be one of bf16, fp16"),
        (
            {"kind": "tp", "model": {"vocab": 50257}},
            "workload.model.vocab must be divisible by workload.tp (2) (got 50257)",
        ),
        ({"kind": "pp", "pp": 3}, "workload.pp must be one of 2, 4, 8 (got 3)"),
        ({"kind": "pp", "microbatches": 2}, "workload.microbatches must be >= workload.pp (4) (got 2)"),
        ({"kind": "pp", "partition": "time"}, "workload.partition must be one of uniform, parameter (got 'time')"),
        ({"kind": "pp", "pp": 8, "model": {"layers": 4}}, "workload.model.layers must be >= workload.pp (8) (got 4)"),
        ({"kind": "offload", "top_k": 65}, "workload.top_k must be <= workload.experts (64) (got 65)"),
        ({"kind": "offload", "cpu_gflops": 0}, "workload.cpu_gflops must be > 0 (got 0"),
        ({"kind": "offload", "decode_tokens": 0}, "workload.decode_tokens must be >= 1 (got 0)"),
        ({"kind": "moe"}, "workload.kind: unknown synthetic workload 'moe'"),
        ({"kind": "tp", "tpp": 2}, "workload: Key 'tpp' not in 'TPWorkload'"),
        ({"kind": "pp", "pp": "four"}, "workload: Value 'four' of type 'str' could not be converted to Integer"),
    ],
)
def test_bad_parameters_fail_with_one_line(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        build_program(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_kind_names_every_kind_there_is(monkeypatch) -> None:
    """Also in a process that has used no kind yet (the API, not `emo run`, which discovers them)."""
    import emo.workloads

    monkeypatch.setattr(emo.workloads, "_REGISTRY", {})
    with pytest.raises(ValueError) as e:
        build_program({"kind": "moe"})
    for kind in ("command", "hybrid", "offload", "pp", "recorded", "tp"):
        assert kind in str(e.value).split("expected one of ")[1], str(e.value)


def test_unknown_gpu_is_an_error() -> None:
    with pytest.raises(ValueError, match="gpu: unknown GPU model 'mi300x'"):
        build_program({"kind": "tp"}, gpu="mi300x")


def test_gpu_config_objects_are_accepted() -> None:
    p = build_program({"kind": "tp"}, gpu={"name": "h100"})
    assert p.meta["gpu"] == "h100"


def test_dataclass_configs_are_accepted() -> None:
    from emo.workloads.pp import PPWorkload

    p = build_program(PPWorkload(pp=2, microbatches=2))
    assert p.ranks == 2


@pytest.mark.parametrize(
    "overrides,ranks",
    [
        (["workload=tp"], 2),
        (["workload=tp", "workload.tp=4"], 4),
        (["workload=tp", "workload.tp=8", "workload.overlap=megatron"], 8),
        (["workload=pp", "workload.pp=8", "workload.partition=parameter"], 8),
        (["workload=offload"], 1),
        (["workload=hybrid"], 8),
        (["workload=hybrid", "workload.tp=4", "workload.pp=2", "workload.dp=1"], 8),
    ],
)
def test_hydra_workload_files_build(overrides: list[str], ranks: int) -> None:
    from hydra import compose, initialize_config_dir

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides)
    p = build_program(cfg.workload, gpu=cfg.gpu.name)
    assert p.ranks == ranks and p.kernel_launches() > 0
