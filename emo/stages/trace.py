"""trace: record the configured workload on the configured device (or take a recorded trace) and
normalise it into the event table every later stage reads.

A recorded trace (`workload.path`) is a Kineto file, an nsys SQLite export, or a folder of per-rank
Kineto files; only those trace files are copied (sub-folders and other files are left alone, and a
symbolic link is followed only when it points inside the folder), and an error names the user's file,
not the copy.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from emo.errors import InputError
from emo.stages import Stage

log = logging.getLogger("emo")


def recorded_path(cfg: dict) -> dict[str, str]:
    """The outside file of a recorded trace (its kind's flag, emo.workloads): read, never run."""
    from emo.workloads import kind_of

    wl = cfg["workload"]
    return {"workload.path": wl["path"]} if kind_of(wl).recorded else {}


STAGE = Stage(
    reads=("gpu", "workload", "trace"),
    outputs=("events.parquet", "measured.json"),
    outside=recorded_path,
    discovers=("emo.workloads",),  # the workload's kind builds or starts what is traced
)


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    from emo.io import write_json, write_parquet
    from emo.sampling import canonical_events, sample_of
    from emo.workloads import grid_of, kind_of

    wl = cfg["workload"]
    sample = sample_of(wl, cfg["trace"]["ranks"], grid_of(wl))  # None: every rank, as before
    kineto = out / "kineto"
    kineto.mkdir()
    if kind_of(wl).recorded:
        events, measured, plain = _recorded(Path(wl["path"]), kineto), {}, None
    else:
        events, measured, plain = _traced(cfg, kineto, sample)
    if sample is not None:  # one rank per class, its collectives joined through their classes (emo.sampling)
        measured["sample"] = sample.to_dict()
        log.info("trace: %s", measured["sample"]["assumption"])
        events = canonical_events(events, sample)
    write_parquet(out / "events.parquet", events)
    write_json(out / "measured.json", measured)
    return {
        **({"sampled_ranks": len(sample.sampled), "planned_ranks": len(sample.reps)} if sample else {}),
        "events": len(events),
        "ranks": int(events["rank"].nunique()),
        "kernels": int((events["kind"] == "kernel").sum()) if "kind" in events else 0,
        **(
            {
                "iteration_time_s": measured["time_s"] / measured["iterations"],
                **({"untraced_iteration_time_s": sum(plain.iteration_times_s) / plain.iterations} if plain else {}),
                "energy_j": measured["energy_j"],
            }
            if measured
            else {}
        ),
    }


def _recorded(src: Path, kineto: Path):
    """A recorded workload's events: its files copied into the stage's `kineto` folder and read there
    (a single file as itself, a Kineto file or an nsys export; a folder as ranks)."""
    from emo.trace import read_trace
    from emo.trace.read import TRACE_SUFFIXES

    if not src.exists():
        raise FileNotFoundError(f"{src}: workload.path does not exist")
    files = recorded_files(src)
    if not files:
        raise InputError(f"{src}: folder holds no trace files ({', '.join('*' + s for s in TRACE_SUFFIXES)})")
    for f in files:
        shutil.copy2(f, kineto / f.name)
    try:
        return read_trace(kineto if src.is_dir() else kineto / src.name)
    except (ValueError, OSError) as e:  # name the user's file, not the copy
        copy = kineto if src.is_dir() else kineto / src.name
        raise InputError(str(e).replace(str(copy), str(src))) from None


def _traced(cfg: dict, kineto: Path, sample):
    """(events, measured.json, the untraced run or None) of a workload run on the device: the traced
    iterations, then (trace.untraced_iterations) the run as it is when nothing records it, which the
    graph's timing is corrected to."""
    from emo.device.backends import open_device
    from emo.trace import read_trace
    from emo.workloads import kind_of

    wl, tc = cfg["workload"], cfg["trace"]
    device = open_device(cfg["gpu"])
    if kind_of(wl).command:
        log.info(
            "trace: one launch of %s: %d iterations (%d recorded), then EMO ends it; one more, untraced",
            " ".join(wl["command"]),
            1 + int(wl["wait"]) + max(int(wl["warmup"]), int(tc["warmup"])) + int(tc["iterations"]),
            int(tc["iterations"]),
        )
    # a sample: the whole job runs, only the sampled ranks' traces are kept (the profiler on those ranks)
    some = {} if sample is None else {"trace_ranks": list(sample.sampled)}
    try:
        res = device.run(wl, tc["iterations"], warmup=tc["warmup"], trace_dir=kineto, capture=tc["capture"], **some)
        plain = device.run(wl, tc["untraced_iterations"], warmup=tc["warmup"]) if tc["untraced_iterations"] else None
    finally:
        device.close()
    measured = {
        "iterations": res.iterations,
        "time_s": res.time_s,
        "energy_j": res.energy_j,
        "iteration_times_s": res.iteration_times_s,
        "energy_per_device_j": {str(k): v for k, v in res.energy_per_device_j.items()},
        "capture": tc["capture"],
        **(
            {"untraced": {"iterations": plain.iterations, "iteration_times_s": plain.iteration_times_s}}
            if plain
            else {}
        ),
    }
    return read_trace(kineto), measured, plain


def recorded_files(src: Path) -> list[Path]:
    """The trace files a recorded `workload.path` names: the file itself, or the folder's regular
    *.json / *.json.gz files whose real path stays inside the folder."""
    from emo.trace.read import TRACE_SUFFIXES

    if not src.is_dir():
        return [src]
    root = src.resolve()
    return [
        f
        for f in sorted(src.iterdir())
        if f.name.endswith(TRACE_SUFFIXES) and f.is_file() and f.resolve().is_relative_to(root)
    ]
