"""Compile `microbench/*.cu` with NVRTC and launch them with the CUDA driver API (cuda-python).

The registry (microbench/registry.yaml, read by `emo.microbench.load_registry`) says everything about
a launch: source, kernel, grid, block, dynamic shared memory and the arguments in order (scalars with a
value, pointers with a buffer size). `launch_plan` turns one entry into what cuLaunchKernel needs and
checks it against the kernel's signature in the source, so a registry typo fails before any GPU work.

The pure parts are tested without a GPU; the cuda-python calls are import-guarded and run only on a
GPU box. `python -m emo.device.cuda_launch --range a,b` launches benchmarks inside one
cuProfilerStart/Stop range, for Nsight Compute's range replay (emo.device.nvml.profile_range).
"""

from __future__ import annotations

import argparse
import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emo.errors import DeviceError

_SIG = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)\s*[{;\\]')

# Registry argument types -> (C type in the source, ctypes for cuLaunchKernel; None = device pointer)
ARG_CTYPES: dict[str, tuple[str, Any]] = {
    "i32": ("int", ctypes.c_int),
    "u32": ("unsigned int", ctypes.c_uint),
    "u64": ("unsigned long long", ctypes.c_ulonglong),
    "f32": ("float", ctypes.c_float),
    "float*": ("float*", None),
    "float4*": ("float4*", None),
    "const float4*": ("float4*", None),
}


def parse_signatures(source: str) -> dict[str, list[tuple[str, str]]]:
    """Kernel name -> [(C type without const, parameter name)] for every extern "C" __global__ kernel."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, params in _SIG.findall(source):
        plist = []
        for p in (s.strip() for s in params.split(",") if s.strip()):
            p = re.sub(r"\bconst\b|\b__restrict__\b", "", p).strip()
            m = re.match(r"(.+?)\s*(\**)\s*(\w+)$", p)
            if not m:
                raise ValueError(f"kernel {name}: cannot parse parameter {p!r}")
            base, stars, pname = m.groups()
            plist.append((" ".join(base.split()) + stars, pname))
        out.setdefault(name, plist)
    return out


@dataclass(frozen=True)
class LaunchPlan:
    name: str
    source: Path
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[tuple, ...]  # ("buffer", nbytes) or ("scalar", ctypes type, value), in kernel order

    @property
    def buffer_bytes(self) -> int:
        return sum(a[1] for a in self.args if a[0] == "buffer")


def launch_plan(entry: dict) -> LaunchPlan:
    """What cuLaunchKernel needs for one registry entry, checked against the kernel's signature."""
    name = entry.get("name", "?")
    src = Path(entry.get("path") or entry["source"])
    sigs = parse_signatures(src.read_text())
    kernel = entry["kernel"]
    if kernel not in sigs:
        raise ValueError(f'{src}: no extern "C" kernel {kernel!r} (benchmark {name})')
    params = sigs[kernel]
    args = entry["args"]
    if [a["name"] for a in args] != [p[1] for p in params]:
        raise ValueError(
            f"microbench {name}: registry args {[a['name'] for a in args]} do not match "
            f"{kernel}'s parameters {[p[1] for p in params]}"
        )
    out = []
    for a, (ctype, _) in zip(args, params):
        want, ct = ARG_CTYPES[a["type"]]
        if want != ctype:
            raise ValueError(
                f"microbench {name}: argument {a['name']} is {ctype} in {src.name}, registry says {a['type']}"
            )
        out.append(("buffer", int(a["buffer_bytes"])) if ct is None else ("scalar", ct, a["value"]))
    return LaunchPlan(
        name=name,
        source=src,
        kernel=kernel,
        grid=tuple(entry["grid"]),
        block=tuple(entry["block"]),
        smem=int(entry.get("dynamic_smem_bytes", 0)),
        args=tuple(out),
    )


def registry_plan(name: str) -> LaunchPlan:
    from emo.microbench import load_registry

    reg = load_registry()
    if name not in reg:
        raise ValueError(f"microbench/registry.yaml: no benchmark {name!r} (have {', '.join(reg)})")
    return launch_plan(reg[name])


# --------------------------------------------------------------------------- cuda-python
def import_cuda():
    """(driver, nvrtc) modules of cuda-python, with one clear error when absent."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6
            from cuda import nvrtc
        except ImportError as e:
            raise DeviceError(
                "cuda-python is not installed: pip install 'emo[gpu]' (cupti-python brings cuda-bindings)"
            ) from e
    return driver, nvrtc


def check(result):
    """Unwrap cuda-python's (err, *values) tuples, raising on an error code."""
    err, *vals = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise DeviceError(f"CUDA call failed: {name}")
    return vals[0] if len(vals) == 1 else (tuple(vals) if vals else None)


class CudaContext:
    """The primary context of one device, retained for the life of this object."""

    def __init__(self, device: int = 0):
        self.driver, self.nvrtc = import_cuda()
        d = self.driver
        try:
            check(d.cuInit(0))
        except RuntimeError:
            raise
        except Exception as e:  # cuda-python raises when libcuda itself is missing
            raise DeviceError(f"no CUDA driver on this machine ({e})") from e
        self.dev = check(d.cuDeviceGet(device))
        self.ctx = check(d.cuDevicePrimaryCtxRetain(self.dev))
        check(d.cuCtxSetCurrent(self.ctx))
        attr = d.CUdevice_attribute
        self.cc = (
            check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev)),
            check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev)),
        )
        self.sms = check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev))
        self.max_threads_per_sm = check(
            d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, self.dev)
        )
        self.stream = check(d.cuStreamCreate(0))

    def compile(self, source: str, filename: str) -> bytes:
        """NVRTC: CUDA C++ -> cubin for this device's architecture."""
        n = self.nvrtc
        prog = check(n.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []))
        opts = [
            f"--gpu-architecture=sm_{self.cc[0]}{self.cc[1]}".encode(),
            b"--std=c++17",
        ]  # NVRTC optimises by default; it refuses -O3
        err = n.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if int(err) != 0:
            size = check(n.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            check(n.nvrtcGetProgramLog(prog, log))
            raise DeviceError(f"{filename}: NVRTC failed: {log.decode(errors='replace').strip()[:2000]}")
        size = check(n.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        check(n.nvrtcGetCUBIN(prog, cubin))
        return cubin

    def synchronize(self) -> None:
        check(self.driver.cuStreamSynchronize(self.stream))


class Microbenchmark:
    """One compiled microbenchmark with its buffers allocated; `run(n)` launches it n times."""

    def __init__(self, ctx: CudaContext, plan: LaunchPlan):
        self.ctx, self.plan, self.name = ctx, plan, plan.name
        d = ctx.driver
        self.module = check(d.cuModuleLoadData(ctx.compile(plan.source.read_text(), plan.source.name)))
        self.function = check(d.cuModuleGetFunction(self.module, plan.kernel.encode()))
        self._ptrs = []
        values: list = []
        types: list = []
        for arg in plan.args:
            if arg[0] == "buffer":
                ptr = check(d.cuMemAlloc(arg[1]))
                check(d.cuMemsetD8(ptr, 0, arg[1]))
                self._ptrs.append(ptr)
                values.append(ptr)
                types.append(None)  # cuda-python: None marks a CUdeviceptr
            else:
                values.append(arg[2])
                types.append(arg[1])
        self._args = (tuple(values), tuple(types))

    def launch(self) -> None:
        p = self.plan
        check(self.ctx.driver.cuLaunchKernel(self.function, *p.grid, *p.block, p.smem, self.ctx.stream, self._args, 0))

    def run(self, n: int = 1) -> None:
        for _ in range(n):
            self.launch()
        self.ctx.synchronize()

    def time_one(self, repeats: int = 5) -> float:
        """Seconds per launch (CUDA events around `repeats` back-to-back launches)."""
        d = self.ctx.driver
        start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
        check(d.cuEventRecord(start, self.ctx.stream))
        for _ in range(repeats):
            self.launch()
        check(d.cuEventRecord(end, self.ctx.stream))
        check(d.cuEventSynchronize(end))
        ms = check(d.cuEventElapsedTime(start, end))
        return ms / 1000.0 / repeats

    def free(self) -> None:
        for ptr in self._ptrs:
            self.ctx.driver.cuMemFree(ptr)
        self._ptrs.clear()


_CONTEXTS: dict[int, CudaContext] = {}
_BENCHES: dict[tuple[int, str], Microbenchmark] = {}


def microbenchmark(name: str, device: int = 0) -> Microbenchmark:
    """The registry's benchmark `name`, compiled and ready on CUDA device `device`. Cached: a
    calibration asks for each benchmark at every clock, and compiling or allocating once is enough."""
    if device not in _CONTEXTS:
        _CONTEXTS[device] = CudaContext(device)
    key = (device, name)
    if key not in _BENCHES:
        _BENCHES[key] = Microbenchmark(_CONTEXTS[device], registry_plan(name))
    return _BENCHES[key]


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emo.device.cuda_launch")
    ap.add_argument(
        "--range",
        required=True,
        help="comma-separated microbenchmarks, launched once each "
        "inside one cuProfilerStart/Stop range (for ncu --replay-mode range)",
    )
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    benches = [microbenchmark(n.strip(), args.device) for n in args.range.split(",") if n.strip()]
    for b in benches:
        b.run(1)  # warm-up outside the range
    d = benches[0].ctx.driver
    check(d.cuProfilerStart())
    for b in benches:
        b.launch()
    benches[0].ctx.synchronize()
    check(d.cuProfilerStop())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
