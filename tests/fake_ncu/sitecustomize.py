"""Loaded (chained after EMO's injected sitecustomize) in the processes the fake `ncu` runs: stands in
for the CUDA driver of a CPU-only torch. cudaProfilerStart/Stop (torch.cuda.profiler.start/stop) turn
one process-wide flag on and off, as the real ones do for the whole CUDA context; fake_cuda.launch()
records each kernel launch with its thread and whether the profiler was on."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_cuda  # noqa: E402

from emo.postimport import when_imported  # noqa: E402


def _patch(torch) -> None:
    torch.cuda.profiler.start = fake_cuda.profiler_start
    torch.cuda.profiler.stop = fake_cuda.profiler_stop
    torch.cuda.synchronize = lambda *a, **k: None


when_imported("torch", _patch)
