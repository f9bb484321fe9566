"""trace: record the configured workload on the configured device (or take a recorded trace) and
normalise it into the event table every later stage reads."""
from __future__ import annotations

import shutil
from pathlib import Path

from emo.device.backends import open_device
from emo.io import write_json, write_parquet
from emo.trace import read_trace


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    wl = cfg["workload"]
    kineto = out / "kineto"
    kineto.mkdir()
    measured: dict = {}
    if wl["kind"] == "recorded":
        src = Path(wl["path"])
        if not src.exists():
            raise FileNotFoundError(f"{src}: workload.path does not exist")
        for f in sorted(src.iterdir()) if src.is_dir() else [src]:
            shutil.copy2(f, kineto / f.name)
    else:
        device = open_device(cfg["gpu"])
        try:
            res = device.run(wl, cfg["trace"]["iterations"], warmup=cfg["trace"]["warmup"], trace_dir=kineto)
        finally:
            device.close()
        measured = {"iterations": res.iterations, "time_s": res.time_s, "energy_j": res.energy_j,
                    "iteration_times_s": res.iteration_times_s,
                    "energy_per_device_j": {str(k): v for k, v in res.energy_per_device_j.items()}}
    events = read_trace(kineto)
    write_parquet(out / "events.parquet", events)
    write_json(out / "measured.json", measured)
    return {
        "events": len(events),
        "ranks": int(events["rank"].nunique()),
        "kernels": int((events["kind"] == "kernel").sum()) if "kind" in events else 0,
        **({"iteration_time_s": measured["time_s"] / measured["iterations"], "energy_j": measured["energy_j"]} if measured else {}),
    }
