"""Writing one rank's host program: launches with the framework overhead that precedes them, events,
collectives and copies, in the op format of `emo.device.sim.program`.

Host overhead is what makes CPU–GPU asynchrony real: Python and the dispatcher spend 10–40 µs per
op before the launch (more for modules that reshape and check arguments, e.g. attention), so the
host runs ahead of long kernels and falls behind short ones. Each overhead is a named CPU interval,
named after the cheap view/shape ops a profiler shows in front of the launching op, with a
deterministic per-rank jitter.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

from emo.workloads.program import CollectiveSpec, KernelSpec, Op, Program

COMPUTE = 7  # PyTorch's default stream id in Kineto traces
NCCL = 20  # the process group's NCCL stream

# op_name -> (mean host µs of Python/module overhead before the op, the name of that host interval).
# The simulator adds the dispatcher (cpu_op) and cudaLaunchKernel time itself (~12 µs together), so
# these plus that make the 10–40 µs per op eager PyTorch shows.
HOST_US = {
    "aten::mm": (16.0, "aten::t"),
    "aten::addmm": (18.0, "aten::t"),
    "aten::_flash_attention_forward": (26.0, "aten::transpose"),
    "aten::_flash_attention_backward": (20.0, "aten::transpose"),
    "aten::_efficient_attention_forward": (26.0, "aten::transpose"),
    "aten::_efficient_attention_backward": (20.0, "aten::transpose"),
    "aten::native_layer_norm": (9.0, "aten::empty_like"),
    "aten::native_layer_norm_backward": (8.0, "aten::empty_like"),
    "aten::native_dropout": (8.0, "aten::empty_like"),
    "aten::_fused_adamw_": (2.0, "aten::_foreach_add_"),
    "aten::_foreach_norm": (3.0, "aten::stack"),
}
DEFAULT_HOST = (6.0, "aten::view")
COLLECTIVE_HOST = (8.0, "aten::empty")  # the output buffer; c10d's own overhead is the simulator's


class Builder:
    """The program under construction, shared by all ranks: deduplicated kernel and collective tables
    and globally unique event ids (unique across ranks too, so no rank can wait on another's event)."""

    def __init__(self, name: str, ranks: int, streams: dict[int, str], meta: dict | None = None):
        self.program = Program(
            name=name, ranks=ranks, ops=[[] for _ in range(ranks)], streams=dict(streams), meta=dict(meta or {})
        )
        self._kernel_ids: dict[int, int] = {}  # id(spec) -> index (specs are cached objects)
        self._colls: dict[tuple, int] = {}
        self._events = 0

    def kernel_id(self, spec: KernelSpec) -> int:
        idx = self._kernel_ids.get(id(spec))
        if idx is None:
            idx = self._kernel_ids[id(spec)] = self.program.kernel(spec)
        return idx

    def collective_id(self, key: tuple, spec: CollectiveSpec) -> int:
        """The collective named `key`, created by its first participant; every other participant must
        describe it identically."""
        idx = self._colls.get(key)
        if idx is None:
            idx = self._colls[key] = self.program.collective(spec)
        elif self.program.collectives[idx] != spec:
            raise AssertionError(f"collective {key} described differently by two ranks")
        return idx

    def new_event(self) -> int:
        self._events += 1
        return self._events - 1

    def rank(self, r: int, seed: int = 0) -> RankEmitter:
        return RankEmitter(self, r, seed)


class RankEmitter:
    """Appends one rank's host ops."""

    def __init__(self, builder: Builder, rank: int, seed: int = 0):
        self.b = builder
        self.rank = rank
        self.ops = builder.program.ops[rank]
        self._rng = random.Random(seed * 1_000_003 + rank)

    # ---------------------------------------------------------------- host
    def cpu(self, us: float, name: str, jitter: float = 0.25) -> None:
        """A host interval of about `us` microseconds (± jitter, deterministic per rank)."""
        f = 1.0 + jitter * (2.0 * self._rng.random() - 1.0)
        self.ops.append((Op.CPU, max(1, int(us * f * 1000)), name))

    @contextmanager
    def scope(self, name: str):
        self.ops.append((Op.BEGIN, name))
        try:
            yield
        finally:
            self.ops.append((Op.END,))

    def iteration(self) -> None:
        self.ops.append((Op.ITER,))

    # ---------------------------------------------------------------- device work
    def launch(self, spec: KernelSpec, stream: int = COMPUTE) -> None:
        us, name = HOST_US.get(spec.op_name, DEFAULT_HOST)
        self.cpu(us, name)
        self.ops.append((Op.LAUNCH, stream, self.b.kernel_id(spec)))

    def launch_all(self, specs, stream: int = COMPUTE) -> None:
        for s in specs:
            self.launch(s, stream)

    def record(self, stream: int) -> int:
        ev = self.b.new_event()
        self.ops.append((Op.RECORD, ev, stream))
        return ev

    def wait(self, stream: int, event: int) -> None:
        self.ops.append((Op.WAIT, stream, event))

    def join(self, src: int, dst: int) -> int:
        """Later work on `dst` waits for everything issued so far on `src` (record + stream wait)."""
        ev = self.record(src)
        self.wait(dst, ev)
        return ev

    def collective(self, stream: int, key: tuple, spec: CollectiveSpec) -> None:
        us, name = COLLECTIVE_HOST
        self.cpu(us, name)
        self.ops.append((Op.COLLECTIVE, stream, self.b.collective_id(key, spec)))

    def memcpy(self, kind: str, nbytes: int, blocking: bool, stream: int = COMPUTE) -> None:
        self.cpu(9.0, "aten::to" if kind != "DtoH" else "aten::_local_scalar_dense" if nbytes <= 8 else "aten::to")
        self.ops.append((Op.MEMCPY, stream, kind, int(nbytes), bool(blocking)))

    def stream_sync(self, stream: int) -> None:
        self.ops.append((Op.STREAM_SYNC, stream))
