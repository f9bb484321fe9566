"""The microbenchmark registry (microbench/registry.yaml) and the work vector of each benchmark.

`load_registry()` returns one validated entry per benchmark, with `work`: what ONE launch does, as
the fields of `emo.device.sim.program.Work`. It is computed, never written by hand:

    work[f] = threads * iters * per_iter[f] + threads * per_thread[f] + per_launch[f]

where threads = grid x block, `iters` is the kernel's `iters` argument, and per_iter / per_thread /
per_launch come from the `// @work <kernel> <scope> field=value ...` lines of the CUDA source next to
the loop they count (a value `@arg` takes that kernel argument's value). `active_warps` is the
entry's `occupancy`; `min_ns` defaults to Work's floor unless the source sets it.

This module reads files only; it imports nothing from the virtual GPU, so models may use it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from emo.paths import ROOT

MICROBENCH_DIR = ROOT / "microbench"
REGISTRY_PATH = MICROBENCH_DIR / "registry.yaml"

# The fields of emo.device.sim.program.Work, in order (a test keeps the two equal).
WORK_FIELDS = (
    "fp32_flop",
    "fp16_tensor_flop",
    "int8_tensor_op",
    "fp64_flop",
    "int_op",
    "sfu_op",
    "shared_bytes",
    "l1_bytes",
    "l2_bytes",
    "dram_read_bytes",
    "dram_write_bytes",
    "active_warps",
    "min_ns",
)
DEFAULT_MIN_NS = 2000.0  # Work.min_ns
STRESSES = frozenset(
    {"idle", "int32", "fp32", "fp64", "sfu", "shared", "l1", "l2", "dram_read", "dram_write", "hmma", "imma"}
)
ARG_TYPES = frozenset({"i32", "u32", "u64", "f32", "float*", "float4*", "const float4*"})
REQUIRED = ("source", "kernel", "stresses", "intensity", "occupancy", "grid", "block", "dynamic_smem_bytes", "args")
MAX_STATIC_DYNAMIC_SMEM = 48 * 1024  # more needs cudaFuncAttributeMaxDynamicSharedMemorySize
_SCOPES = ("per_iter", "per_thread", "per_launch")
_WORK_LINE = re.compile(r"^\s*//\s*@work\s+(\w+)\s+(\w+)\s+(.*)$", re.MULTILINE)


def kernel_signature_re(kernel: str) -> re.Pattern[str]:
    """Matches the declaration `extern "C" __global__ void <kernel>(` in a CUDA source."""
    return re.compile(r'extern\s+"C"\s+__global__\s+void\s+' + re.escape(kernel) + r"\s*\(")


def parse_work_annotations(text: str, where: str) -> dict[str, dict[str, dict[str, str]]]:
    """{kernel: {scope: {field: value-string}}} from the `// @work` lines of one source."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for kernel, scope, rest in _WORK_LINE.findall(text):
        if scope not in _SCOPES:
            raise ValueError(f"{where}: @work {kernel}: scope {scope!r} is not one of {_SCOPES}")
        for item in rest.split():
            field, sep, value = item.partition("=")
            if not sep or field not in WORK_FIELDS or field == "active_warps":
                raise ValueError(f"{where}: @work {kernel}: bad item {item!r} (want <Work field>=<number or @arg>)")
            out.setdefault(kernel, {}).setdefault(scope, {})[field] = value
    return out


def _dim3(value: Any, where: str) -> tuple[int, int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ValueError(f"{where}: want a list of 3 positive integers, got {value!r}")
    return (value[0], value[1], value[2])


def _check_args(args: Any, where: str) -> dict[str, Any]:
    if not isinstance(args, list) or not args:
        raise ValueError(f"{where}.args: want a non-empty list of {{name, type, value|buffer_bytes}}")
    values: dict[str, Any] = {}
    for i, arg in enumerate(args):
        w = f"{where}.args[{i}]"
        if not isinstance(arg, dict) or "name" not in arg or "type" not in arg:
            raise ValueError(f"{w}: want a mapping with name and type")
        if arg["type"] not in ARG_TYPES:
            raise ValueError(f"{w}: type {arg['type']!r} is not one of {sorted(ARG_TYPES)}")
        if arg["name"] in values:
            raise ValueError(f"{w}: duplicate argument {arg['name']!r}")
        pointer = arg["type"].endswith("*")
        key = "buffer_bytes" if pointer else "value"
        val = arg.get(key)
        if (
            not isinstance(val, (int, float))
            or isinstance(val, bool)
            or (pointer and (not isinstance(val, int) or val <= 0))
        ):
            raise ValueError(f"{w}: {arg['name']} ({arg['type']}) needs a numeric {key}, got {val!r}")
        values[arg["name"]] = val
    return values


def _resolve(value: str, args: dict[str, Any], where: str) -> float:
    if value.startswith("@"):
        if value[1:] not in args:
            raise ValueError(f"{where}: @work refers to unknown argument {value[1:]!r}")
        return float(args[value[1:]])
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where}: @work value {value!r} is not a number") from None


def work_of(entry: dict[str, Any], annotations: dict[str, dict[str, str]], where: str) -> dict[str, float]:
    """The Work vector of one launch of `entry` (see the module docstring)."""
    args = {a["name"]: a.get("value", a.get("buffer_bytes")) for a in entry["args"]}
    threads = float(
        entry["grid"][0]
        * entry["grid"][1]
        * entry["grid"][2]
        * entry["block"][0]
        * entry["block"][1]
        * entry["block"][2]
    )
    if annotations.get("per_iter") and "iters" not in args:
        raise ValueError(f"{where}: the source counts work per_iter but the kernel has no 'iters' argument")
    mult = {"per_iter": threads * float(args.get("iters", 0)), "per_thread": threads, "per_launch": 1.0}
    work = {f: 0.0 for f in WORK_FIELDS}
    work["min_ns"] = 0.0
    for scope, fields in annotations.items():
        for field, value in fields.items():
            work[field] += mult[scope] * _resolve(value, args, where)
    work["min_ns"] = work["min_ns"] or DEFAULT_MIN_NS
    work["active_warps"] = float(entry["occupancy"])
    return work


def validate_entry(name: str, entry: Any, folder: Path, where: str) -> dict[str, Any]:
    """A checked copy of one registry entry, with `name`, `path` and `work` added."""
    w = f"{where}: benchmarks.{name}"
    if not isinstance(entry, dict):
        raise ValueError(f"{w}: want a mapping")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise ValueError(f"{w}: missing {', '.join(missing)}")
    grid, block = _dim3(entry["grid"], f"{w}.grid"), _dim3(entry["block"], f"{w}.block")
    nthreads = block[0] * block[1] * block[2]
    if nthreads > 1024 or nthreads % 32:
        raise ValueError(f"{w}.block: {nthreads} threads per block (want a multiple of 32, at most 1024)")
    smem = entry["dynamic_smem_bytes"]
    if not isinstance(smem, int) or not 0 <= smem <= MAX_STATIC_DYNAMIC_SMEM:
        raise ValueError(f"{w}.dynamic_smem_bytes: want an integer in [0, {MAX_STATIC_DYNAMIC_SMEM}], got {smem!r}")
    occ = entry["occupancy"]
    if not isinstance(occ, (int, float)) or not 0.0 <= occ <= 1.0:
        raise ValueError(f"{w}.occupancy: want a number in [0, 1], got {occ!r}")
    stresses = entry["stresses"]
    if not isinstance(stresses, list) or not stresses or not set(stresses) <= STRESSES:
        raise ValueError(f"{w}.stresses: want a non-empty list drawn from {sorted(STRESSES)}, got {stresses!r}")
    _check_args(entry["args"], w)
    path = folder / str(entry["source"])
    if not path.is_file():
        raise ValueError(f"{w}.source: {path} does not exist")
    text = path.read_text()
    kernel = str(entry["kernel"])
    if not kernel_signature_re(kernel).search(text):
        raise ValueError(f'{w}.kernel: {path.name} has no `extern "C" __global__ void {kernel}(`')
    annotations = parse_work_annotations(text, str(path)).get(kernel)
    if not annotations:
        raise ValueError(f"{w}: {path.name} has no `// @work {kernel} ...` line saying what the kernel does")
    out = dict(entry, name=name, grid=list(grid), block=list(block), path=str(path))
    out["work"] = work_of(out, annotations, w)
    return out


@lru_cache(maxsize=4)
def _load(path: Path, mtime: float) -> dict[str, dict[str, Any]]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), dict) or not doc["benchmarks"]:
        raise ValueError(f"{path}: want a mapping with a non-empty 'benchmarks' mapping")
    return {name: validate_entry(name, e, path.parent, str(path)) for name, e in doc["benchmarks"].items()}


def load_registry(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Every benchmark of the registry (default: the repo's microbench/registry.yaml), validated.

    Each entry: name, source, path (absolute source path), kernel, stresses, intensity, occupancy,
    grid, block, dynamic_smem_bytes, args (ordered kernel arguments) and work (Work field -> float).
    """
    path = Path(path) if path is not None else REGISTRY_PATH
    if not path.is_file():
        raise FileNotFoundError(f"{path}: microbenchmark registry not found")
    entries = _load(path.resolve(), path.stat().st_mtime)
    return {k: {**v, "work": dict(v["work"])} for k, v in entries.items()}  # callers may mutate


def benchmark_names(path: str | Path | None = None) -> list[str]:
    """Benchmark names in registry order."""
    return list(load_registry(path))
