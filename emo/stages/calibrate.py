"""calibrate: every microbenchmark at every calibrated SM clock and the clock-request latency, on
the configured GPU (the protocol: emo.model.bench), into bench.parquet and calibration.json (which
GPU model and driver measured it: what `emo calibration export` packs). The folder's hash covers the
GPU configuration and the model section only: no workload ever re-runs it."""

from __future__ import annotations

from pathlib import Path

from emo.stages import Stage

STAGE = Stage(reads=("gpu", "model"), outputs=("bench.parquet", "calibration.json"), code=("microbench",))


def run(cfg: dict, inputs: dict[str, Path], out: Path) -> dict:
    import hashlib

    from emo.device.backends import open_device
    from emo.io import write_json, write_parquet
    from emo.microbench import benchmark_names
    from emo.model.bench import calibrate, measure_clock_latency

    m = cfg["model"]
    bench, metrics = calibrate(
        lambda: open_device(cfg["gpu"]),
        benchmark_names(),
        float(m["min_seconds"]),
        int(m["repeats"]),
        int(m["clocks_stride"]),
    )
    lat = measure_clock_latency(
        lambda: open_device(cfg["gpu"]), int(m["clock_latency_steps"]), float(m["clock_poll_ms"])
    )
    write_parquet(out / "bench.parquet", bench)
    write_json(
        out / "calibration.json",
        {
            "gpu": metrics["gpu"],
            "gpu_model": metrics["gpu_model"],
            "driver": metrics["driver"],
            "clocks_mhz": sorted(int(c) for c in bench["sm_mhz"].unique()),
            "benchmarks": metrics["benchmarks"],
            "bench_sha256": hashlib.sha256((out / "bench.parquet").read_bytes()).hexdigest(),
            "clock_latency_ms": lat,
        },
    )
    if lat is not None:
        metrics.update({f"clock_latency_{k}_ms": lat[k] for k in ("p10", "p50", "p90", "p99", "mean")})
    return metrics
