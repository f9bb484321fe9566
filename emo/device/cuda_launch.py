"""Compile `microbench/*.cu` with NVRTC and launch them with the CUDA driver API (cuda-python).

A microbenchmark kernel is found by name in the sources (`extern "C" __global__ void emo_<name>(...)`),
and its arguments are built from its signature by the conventions every source follows:
pointer parameters get device buffers (`out`: one float per thread; `buf`: `buffer_bytes`, with the
following `n`/`n4` parameter its element count), `float sentinel` is NaN (never equal: the store
that keeps the compiler honest is never taken), `int iters` and `duration_ns` are the intensity.
A registry entry (emo.microbench.load_registry) may override `kernel`, `source`, `grid`, `block`,
`buffer_bytes` and any argument by name under `args`.

The pure parts (signature parsing, argument planning) are tested without a GPU; the cuda-python calls
are import-guarded and run only on a GPU box. `python -m emo.device.cuda_launch --range a,b` launches
benchmarks inside one cuProfilerStart/Stop range, for Nsight Compute's range replay.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MICROBENCH_DIR = Path(__file__).resolve().parents[2] / "microbench"
_SIG = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)\s*[{;\\]')

DEFAULT_BLOCK = 256
DEFAULT_ITERS = 4096
DEFAULT_IDLE_NS = 10_000_000  # 10 ms per launch of the idle kernel
DEFAULT_BUFFER_BYTES = {"l1": 64 << 10, "l2": 4 << 20}  # else DRAM_BUFFER_BYTES
DRAM_BUFFER_BYTES = 1 << 30  # far larger than any L2

_CTYPES = {
    "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "float": ctypes.c_float, "double": ctypes.c_double,
    "unsigned long long": ctypes.c_ulonglong, "long long": ctypes.c_longlong, "size_t": ctypes.c_size_t,
}


@dataclass(frozen=True)
class Param:
    ctype: str  # C type without const, e.g. "float*", "unsigned long long"
    name: str

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def elem_bytes(self) -> int:
        base = self.ctype.rstrip("*").strip()
        return {"float4": 16, "double": 8, "float": 4, "int": 4, "char": 1, "int4": 16}.get(base, 4)


def parse_signatures(source: str) -> dict[str, list[Param]]:
    """Kernel name -> parameters, for every extern "C" __global__ kernel (declarations too)."""
    out: dict[str, list[Param]] = {}
    for name, params in _SIG.findall(source):
        plist = []
        for p in (s.strip() for s in params.split(",") if s.strip()):
            p = re.sub(r"\bconst\b|\b__restrict__\b", "", p).strip()
            m = re.match(r"(.+?)\s*(\**)\s*(\w+)$", p)
            if not m:
                raise ValueError(f"kernel {name}: cannot parse parameter {p!r}")
            base, stars, pname = m.groups()
            plist.append(Param(" ".join(base.split()) + stars, pname))
        out.setdefault(name, plist)
    return out


def find_kernel(name: str, directory: Path = MICROBENCH_DIR, entry: dict | None = None) -> tuple[Path, str]:
    """(source file, kernel symbol) for a microbenchmark name such as 'fp32_fma' or 'emo_fp32_fma'."""
    entry = entry or {}
    kernel = entry.get("kernel")
    if entry.get("source"):
        src = Path(entry["source"])
        src = src if src.is_absolute() else directory / src.name
        sigs = parse_signatures(src.read_text())
        kernel = kernel or next((k for k in (name, f"emo_{name}") if k in sigs), None)
        if kernel is None or kernel not in sigs:
            raise ValueError(f"{src}: no kernel {kernel or name!r} (has {sorted(sigs)})")
        return src, kernel
    wanted = [kernel] if kernel else [name, f"emo_{name}"]
    for src in sorted(directory.glob("*.cu")):
        sigs = parse_signatures(src.read_text())
        for k in wanted:
            if k in sigs:
                return src, k
    raise ValueError(f"{directory}: no microbenchmark kernel named {name!r}")


@dataclass
class ArgPlan:
    """What to pass for each kernel parameter: ('buffer', nbytes) or ('scalar', ctype, value)."""

    kinds: list[tuple]
    grid: int
    block: int
    buffers: list[int] = field(default_factory=list)  # bytes of each buffer, in parameter order


def plan_args(params: list[Param], *, kernel: str, sms: int, max_threads_per_sm: int,
              entry: dict | None = None) -> ArgPlan:
    """Arguments and launch geometry for one kernel from its signature and the conventions above."""
    entry = entry or {}
    overrides = dict(entry.get("args") or {})
    block = int(entry.get("block", DEFAULT_BLOCK))
    grid = int(entry.get("grid", sms * max(1, max_threads_per_sm // block)))  # one full wave
    threads = grid * block
    short = kernel.removeprefix("emo_")
    buf_bytes = int(entry.get("buffer_bytes", DEFAULT_BUFFER_BYTES.get(short, DRAM_BUFFER_BYTES)))
    kinds: list[tuple] = []
    last_buffer_elems = 0
    for p in params:
        if p.name in overrides and not p.is_pointer:
            kinds.append(("scalar", p.ctype, overrides[p.name]))
        elif p.is_pointer:
            nbytes = threads * p.elem_bytes if p.name == "out" else buf_bytes
            last_buffer_elems = nbytes // p.elem_bytes
            kinds.append(("buffer", nbytes))
        elif p.name == "sentinel":
            kinds.append(("scalar", p.ctype, math.nan))
        elif p.name in ("n", "n4", "elems", "count"):
            kinds.append(("scalar", p.ctype, last_buffer_elems))
        elif p.name == "iters":
            kinds.append(("scalar", p.ctype, int(entry.get("iters", DEFAULT_ITERS))))
        elif p.name == "duration_ns":
            kinds.append(("scalar", p.ctype, int(entry.get("duration_ns", DEFAULT_IDLE_NS))))
        else:
            raise ValueError(f"kernel {kernel}: no value for parameter {p.ctype} {p.name} "
                             "(give it under args: in microbench/registry.yaml)")
        if kinds[-1][0] == "scalar" and p.ctype not in _CTYPES:
            raise ValueError(f"kernel {kernel}: unsupported scalar type {p.ctype!r}")
    return ArgPlan(kinds=kinds, grid=grid, block=block,
                   buffers=[k[1] for k in kinds if k[0] == "buffer"])


def registry_entry(name: str) -> dict:
    """The registry's entry for `name` (emo.microbench), or {} when there is none."""
    try:
        from emo.microbench import load_registry
    except ImportError:
        return {}
    reg = load_registry()
    items = reg.items() if isinstance(reg, dict) else ((getattr(e, "name", None) or e.get("name"), e) for e in reg)
    for key, e in items:
        d = e if isinstance(e, dict) else getattr(e, "__dict__", {})
        if key in (name, f"emo_{name}") or d.get("kernel") in (name, f"emo_{name}"):
            return dict(d)
    return {}


# --------------------------------------------------------------------------- cuda-python
def import_cuda():
    """(driver, nvrtc) modules of cuda-python, with one clear error when absent."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        try:
            from cuda import cuda as driver, nvrtc  # cuda-python < 12.6
        except ImportError as e:
            raise RuntimeError("cuda-python is not installed: pip install 'emo[gpu]' "
                               "(cupti-python brings cuda-bindings)") from e
    return driver, nvrtc


def check(result):
    """Unwrap cuda-python's (err, *values) tuples, raising on an error code."""
    err, *vals = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise RuntimeError(f"CUDA call failed: {name}")
    return vals[0] if len(vals) == 1 else (tuple(vals) if vals else None)


class CudaContext:
    """The primary context of one device, retained for the life of this object."""

    def __init__(self, device: int = 0):
        self.driver, self.nvrtc = import_cuda()
        d = self.driver
        check(d.cuInit(0))
        self.dev = check(d.cuDeviceGet(device))
        self.ctx = check(d.cuDevicePrimaryCtxRetain(self.dev))
        check(d.cuCtxSetCurrent(self.ctx))
        attr = d.CUdevice_attribute
        self.cc = (check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev)),
                   check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev)))
        self.sms = check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev))
        self.max_threads_per_sm = check(d.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, self.dev))
        self.stream = check(d.cuStreamCreate(0))

    def compile(self, source: str, filename: str) -> bytes:
        """NVRTC: CUDA C++ -> cubin for this device's architecture."""
        n = self.nvrtc
        prog = check(n.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []))
        opts = [f"--gpu-architecture=sm_{self.cc[0]}{self.cc[1]}".encode(), b"-O3", b"--std=c++17"]
        err = n.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if int(err) != 0:
            size = check(n.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            check(n.nvrtcGetProgramLog(prog, log))
            raise RuntimeError(f"{filename}: NVRTC failed: {log.decode(errors='replace').strip()[:2000]}")
        size = check(n.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        check(n.nvrtcGetCUBIN(prog, cubin))
        return cubin

    def synchronize(self) -> None:
        check(self.driver.cuStreamSynchronize(self.stream))


class Microbenchmark:
    """One compiled microbenchmark with its buffers allocated; `run(n)` launches it n times."""

    def __init__(self, ctx: CudaContext, name: str, entry: dict | None = None):
        entry = entry if entry is not None else registry_entry(name)
        src, kernel = find_kernel(name, entry=entry)
        self.ctx, self.name, self.kernel_name = ctx, name, kernel
        d = ctx.driver
        self.module = check(d.cuModuleLoadData(ctx.compile(src.read_text(), src.name)))
        self.function = check(d.cuModuleGetFunction(self.module, kernel.encode()))
        params = parse_signatures(src.read_text())[kernel]
        self.plan = plan_args(params, kernel=kernel, sms=ctx.sms,
                              max_threads_per_sm=ctx.max_threads_per_sm, entry=entry)
        self._ptrs = []
        values, types = [], []
        for kind in self.plan.kinds:
            if kind[0] == "buffer":
                ptr = check(d.cuMemAlloc(kind[1]))
                check(d.cuMemsetD8(ptr, 0, kind[1]))
                self._ptrs.append(ptr)
                values.append(ptr)
                types.append(None)  # cuda-python: None marks a CUdeviceptr
            else:
                values.append(kind[2])
                types.append(_CTYPES[kind[1]])
        self._args = (tuple(values), tuple(types))

    def run(self, n: int = 1) -> None:
        d, p = self.ctx.driver, self.plan
        for _ in range(n):
            check(d.cuLaunchKernel(self.function, p.grid, 1, 1, p.block, 1, 1, 0,
                                   self.ctx.stream, self._args, 0))
        self.ctx.synchronize()

    def time_one(self, repeats: int = 5) -> float:
        """Seconds per launch (CUDA events around `repeats` back-to-back launches)."""
        d = self.ctx.driver
        start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
        check(d.cuEventRecord(start, self.ctx.stream))
        for _ in range(repeats):
            check(d.cuLaunchKernel(self.function, self.plan.grid, 1, 1, self.plan.block, 1, 1, 0,
                                   self.ctx.stream, self._args, 0))
        check(d.cuEventRecord(end, self.ctx.stream))
        check(d.cuEventSynchronize(end))
        ms = check(d.cuEventElapsedTime(start, end))
        return ms / 1000.0 / repeats

    def free(self) -> None:
        for ptr in self._ptrs:
            self.ctx.driver.cuMemFree(ptr)
        self._ptrs.clear()


_CONTEXTS: dict[int, CudaContext] = {}


def microbenchmark(name: str, device: int = 0, entry: dict | None = None) -> Microbenchmark:
    if device not in _CONTEXTS:
        _CONTEXTS[device] = CudaContext(device)
    return Microbenchmark(_CONTEXTS[device], name, entry)


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emo.device.cuda_launch")
    ap.add_argument("--range", required=True, help="comma-separated microbenchmarks, launched once each "
                    "inside one cuProfilerStart/Stop range (for ncu --replay-mode range)")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    benches = [microbenchmark(n.strip(), args.device) for n in args.range.split(",") if n.strip()]
    for b in benches:
        b.run(1)  # warm-up outside the range
    d = benches[0].ctx.driver
    check(d.cuProfilerStart())
    for b in benches:
        check(d.cuLaunchKernel(b.function, b.plan.grid, 1, 1, b.plan.block, 1, 1, 0, b.ctx.stream, b._args, 0))
    benches[0].ctx.synchronize()
    check(d.cuProfilerStop())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
