"""The program format the virtual GPU executes lives with the workloads that write it
(emo.workloads.program): the simulator reads it, so the dependency runs device.sim -> workloads only."""

from emo.workloads.program import CollectiveSpec, KernelSpec, Op, Program, Work

__all__ = ["CollectiveSpec", "KernelSpec", "Op", "Program", "Work"]
