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

OFFLINE = ("emo", "static", "perseus")


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    opt = cfg["optimizer"]
    if opt["name"] not in OFFLINE:
        raise ValueError(f"optimizer.name: {opt['name']!r} is not an offline optimiser ({', '.join(OFFLINE)}); "
                         "zeus and geepafs run online in validate")
    tables = load_pack_tables(Path(inputs["packs"]).parent, Path(inputs["model"]).parent)
    policy, summary = solve(tables, opt, float(cfg["budget"]), gpu=cfg["gpu"]["name"])
    base = predict(tables, None)
    pred = predict(tables, policy)
    policy.predicted_time_s, policy.predicted_energy_j = pred.time_s, pred.energy_j
    policy.meta.update({"baseline_time_s": base.time_s, "baseline_energy_j": base.energy_j})
    policy.save(out / "policy.json")
    summary.update({"predicted_time_s": pred.time_s, "predicted_energy_j": pred.energy_j,
                    "baseline_time_s": base.time_s, "baseline_energy_j": base.energy_j,
                    "predicted_es_pct": 100 * (1 - pred.energy_j / base.energy_j),
                    "predicted_pl_pct": 100 * (pred.time_s / base.time_s - 1)})
    write_json(out / "summary.json", summary)
    return {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
