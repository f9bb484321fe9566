"""validate: measure what a method saves on the device (the protocol: emo.validate) and write
result.json (and, for optimizer=static, pareto.parquet: the static clocks it measured)."""

from __future__ import annotations

from pathlib import Path

from emo.methods import ONLINE
from emo.stages import Stage

STAGE = Stage(
    reads=("gpu", "workload", "optimizer", "budget", "validate"),
    # offline methods bring optimize's policy; online ones tune while validate runs them
    inputs=lambda cfg: {} if cfg["optimizer"]["name"] in ONLINE else {"policy": ("optimize", "policy.json")},
    outputs=("result.json",),
    discovers=("emo.workloads", "emo.baselines"),  # the workload's kind; an online method's module
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    from emo.device.backends import open_device
    from emo.io import write_json, write_parquet
    from emo.sections import Config, typed
    from emo.validate import validate

    result, metrics, curve = validate(typed(Config, cfg), inputs.get("policy"), lambda: open_device(cfg["gpu"]))
    if curve is not None:
        write_parquet(out / "pareto.parquet", curve)
    write_json(out / "result.json", result)
    return metrics
