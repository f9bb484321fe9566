"""The programs the virtual GPU runs: per rank, one host thread's ops for ONE iteration.

`emo.workloads` builds them; `emo.device.sim` executes them (repeating the iteration N times) and
writes what `torch.profiler` would have recorded. Ops are plain tuples, first field an `Op`, so that
a million-kernel program is cheap to build and fast to execute.

    (Op.CPU, dur_ns, name)                 host computes (a cpu_op interval of fixed duration)
    (Op.LAUNCH, stream, kernel_id)         cudaLaunchKernel; the kernel is queued on `stream`
    (Op.MEMCPY, stream, kind, nbytes, blocking)   cudaMemcpyAsync (+ sync if blocking); kind "HtoD", "DtoH", "DtoD"
    (Op.RECORD, event_id, stream)          cudaEventRecord
    (Op.WAIT, stream, event_id)            cudaStreamWaitEvent: later work on `stream` waits for the event
    (Op.STREAM_SYNC, stream)               cudaStreamSynchronize: host blocks until `stream` drains
    (Op.EVENT_SYNC, event_id)              cudaEventSynchronize
    (Op.DEVICE_SYNC,)                      cudaDeviceSynchronize
    (Op.COLLECTIVE, stream, coll_id)       NCCL kernel on `stream`; completes only when every
                                           participant of collectives[coll_id] has arrived, + transfer time
    (Op.ITER,)                             iteration marker (ProfilerStep#i); the policy's t=0
    (Op.BEGIN, name) / (Op.END,)           a named host scope (user_annotation), properly nested

Event ids and collective ids are per iteration: the simulator keys collectives by (iteration, coll_id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Op(IntEnum):
    CPU = 0
    LAUNCH = 1
    MEMCPY = 2
    RECORD = 3
    WAIT = 4
    STREAM_SYNC = 5
    EVENT_SYNC = 6
    DEVICE_SYNC = 7
    COLLECTIVE = 8
    ITER = 9
    BEGIN = 10
    END = 11


@dataclass(frozen=True)
class Work:
    """What one kernel launch does: operations, bytes moved, and how full it keeps the SMs."""

    fp32_flop: float = 0.0
    fp16_tensor_flop: float = 0.0  # fp16/bf16 tensor-core (HMMA)
    int8_tensor_op: float = 0.0  # int8 tensor-core (IMMA)
    fp64_flop: float = 0.0
    int_op: float = 0.0
    sfu_op: float = 0.0
    shared_bytes: float = 0.0
    l1_bytes: float = 0.0
    l2_bytes: float = 0.0
    dram_read_bytes: float = 0.0
    dram_write_bytes: float = 0.0
    active_warps: float = 1.0  # achieved occupancy, 0..1 of the GPU's warp slots
    min_ns: float = 2000.0  # fixed launch-to-finish floor (tiny kernels)


@dataclass(frozen=True)
class KernelSpec:
    name: str  # the mangled/demangled kernel name the profiler would show
    work: Work
    op_name: str = ""  # the framework op launching it (cpu_op around the launch), e.g. "aten::mm"
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (256, 1, 1)


@dataclass(frozen=True)
class CollectiveSpec:
    kind: str  # "allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"
    ranks: tuple[int, ...]  # participants (global ranks)
    nbytes: int  # message size per rank
    group: str = "0"  # process group / communicator name
    dtype: str = "bf16"


@dataclass
class Program:
    """One iteration of a workload: per-rank host ops plus the tables they index."""

    name: str
    ranks: int
    ops: list[list[tuple]]  # ops[rank] in host program order
    kernels: list[KernelSpec] = field(default_factory=list)
    collectives: list[CollectiveSpec] = field(default_factory=list)
    streams: dict[int, str] = field(default_factory=lambda: {7: "compute"})  # stream id -> role
    meta: dict = field(default_factory=dict)

    def kernel(self, spec: KernelSpec) -> int:
        """Index of `spec` in the kernel table, adding it the first time (specs are deduplicated)."""
        idx = self._kernel_index.get(spec)
        if idx is None:
            idx = self._kernel_index[spec] = len(self.kernels)
            self.kernels.append(spec)
        return idx

    def collective(self, spec: CollectiveSpec) -> int:
        self.collectives.append(spec)
        return len(self.collectives) - 1

    def __post_init__(self) -> None:
        self._kernel_index = {k: i for i, k in enumerate(self.kernels)}

    def kernel_launches(self) -> int:
        return sum(1 for ops in self.ops for op in ops if op[0] == Op.LAUNCH)
