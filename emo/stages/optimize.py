"""optimize: the frequency policy of the configured method within the budget, from the pack graph
and the fitted model; its predicted time and energy (and the max-clock baseline's) come from the
model's prediction API, with clock transitions as the hardware applies them.

Offline methods only: emo (the DP), static (one clock), perseus (lowtime, pass- or pack-level).
zeus and geepafs tune online inside validate; for them optimize writes nothing to apply."""
from __future__ import annotations

from pathlib import Path

from emo.io import write_json
from emo.model.predict import load_pack_tables, predict
from emo.optimize import solve
from emo.optimize.pipeline.check import expected, latencies


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    opt = cfg["optimizer"]
    tables = load_pack_tables(Path(inputs["packs"]).parent, Path(inputs["model"]).parent)
    policy, summary = solve(tables, opt, float(cfg["budget"]), gpu=cfg["gpu"]["name"])
    base, pred = predict(tables, None), expected(tables, policy, latencies(opt["transition_ms"]))
    policy.predicted_time_s, policy.predicted_energy_j = pred.time_s, pred.energy_j
    policy.meta.update({"baseline_time_s": base.time_s, "baseline_energy_j": base.energy_j})
    policy.save(out / "policy.json")
    # per iteration, by the stage's predictor at the mean configured latency
    summary["predicted"] = {"time_s": pred.time_s, "energy_j": pred.energy_j,
                            "baseline_time_s": base.time_s, "baseline_energy_j": base.energy_j,
                            "es_pct": 100 * (1 - pred.energy_j / base.energy_j),
                            "pl_pct": 100 * (pred.time_s / base.time_s - 1)}
    write_json(out / "summary.json", summary)
    return {f"predicted_{k}": v for k, v in summary["predicted"].items()}
