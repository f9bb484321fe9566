"""EMO: energy-minimising SM-clock schedules for GPU AI workloads."""

__version__ = "0.1.0"
