"""The microbenchmark registry: every entry names real CUDA, its work vector follows from the launch."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from emo.microbench import MICROBENCH_DIR, WORK_FIELDS, kernel_signature_re, load_registry, parse_work_annotations

REG = load_registry()


def test_work_fields_match_the_simulator_work_dataclass():
    from emo.device.sim.program import Work

    assert WORK_FIELDS == tuple(f.name for f in dataclasses.fields(Work))
    for entry in REG.values():
        assert set(entry["work"]) == set(WORK_FIELDS)
        Work(**entry["work"])  # constructible


def test_suite_covers_what_ai_kernels_stress():
    stresses = {s for e in REG.values() for s in e["stresses"]}
    assert stresses == {
        "idle",
        "int32",
        "fp32",
        "fp64",
        "sfu",
        "shared",
        "l1",
        "l2",
        "dram_read",
        "dram_write",
        "hmma",
        "imma",
    }
    assert 20 <= len(REG) <= 30
    for s in stresses - {"idle"}:  # every unit at more than one intensity
        assert len({e["intensity"] for e in REG.values() if s in e["stresses"]}) >= 2, s


@pytest.mark.parametrize("name", sorted(REG))
def test_entry_is_real_cuda(name):
    e = REG[name]
    text = Path(e["path"]).read_text()
    assert kernel_signature_re(e["kernel"]).search(text)
    assert "#include" not in text  # NVRTC: builtins only
    assert "int main" not in text and "<<<" not in text  # no host code
    # Balanced braces/parens: a cheap parse check without a compiler.
    code = re.sub(r"//[^\n]*", "", text)
    assert code.count("{") == code.count("}") and code.count("(") == code.count(")")


@pytest.mark.parametrize("name", sorted(REG))
def test_work_is_launch_times_source_counts(name):
    e = REG[name]
    args = {a["name"]: a.get("value", a.get("buffer_bytes")) for a in e["args"]}
    threads = e["grid"][0] * e["block"][0] * e["grid"][1] * e["block"][1]
    per_iter = parse_work_annotations(Path(e["path"]).read_text(), "x")[e["kernel"]].get("per_iter", {})
    for field, value in per_iter.items():
        assert e["work"][field] == threads * args["iters"] * float(value)
    assert e["work"]["active_warps"] == e["occupancy"]
    busy = sum(v for k, v in e["work"].items() if k not in ("active_warps", "min_ns"))
    assert (busy == 0) == (e["stresses"] == ["idle"])


@pytest.mark.parametrize("name", sorted(REG))
def test_buffers_fit_what_the_kernel_touches(name):
    e = REG[name]
    args = {a["name"]: a.get("value", a.get("buffer_bytes")) for a in e["args"]}
    threads = e["grid"][0] * e["block"][0]
    if "n4" in args:
        assert args["n4"] * 16 == args["buf"]
    if "out" in args and e["stresses"] != ["idle"]:
        assert args["out"] >= threads * 4  # out[tid] stays in bounds
    w = e["work"]
    if "dram_read" in e["stresses"]:  # each byte read at most once: all L2 misses
        assert w["dram_read_bytes"] <= args["buf"]
    if "dram_write" in e["stresses"]:
        assert w["dram_write_bytes"] <= args["buf"]
    if "l2" in e["stresses"]:  # fits the smallest L2 of the supported GPUs (RTX 3080 Ti: 6 MiB)
        assert args["buf"] <= 4 << 20 and w["l2_bytes"] >= 4 * args["buf"]
    if "l1" in e["stresses"]:
        assert args["buf"] <= 16 << 10


def test_low_occupancy_variants_limit_resident_blocks():
    for e in REG.values():
        if e["intensity"] == "low":
            assert e["dynamic_smem_bytes"] > 0 and e["occupancy"] < 1


def _write(tmp_path, registry: dict, src: str = "") -> Path:
    (tmp_path / "k.cu").write_text(
        src or 'extern "C" __global__ void k(float* out, int iters) {}\n// @work k per_iter fp32_flop=2\n'
    )
    p = tmp_path / "registry.yaml"
    p.write_text(yaml.safe_dump({"benchmarks": registry}))
    return p


GOOD = {
    "source": "k.cu",
    "kernel": "k",
    "stresses": ["fp32"],
    "intensity": "high",
    "occupancy": 1.0,
    "grid": [2, 1, 1],
    "block": [64, 1, 1],
    "dynamic_smem_bytes": 0,
    "args": [{"name": "out", "type": "float*", "buffer_bytes": 512}, {"name": "iters", "type": "i32", "value": 10}],
}


def test_custom_registry_work(tmp_path):
    reg = load_registry(_write(tmp_path, {"b": GOOD}))
    assert reg["b"]["work"]["fp32_flop"] == 2 * 64 * 10 * 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kernel": "nope"}, "no `extern"),
        ({"block": [100, 1, 1]}, "multiple of 32"),
        ({"grid": [0, 1, 1]}, "3 positive integers"),
        ({"stresses": ["magic"]}, "stresses"),
        ({"source": "missing.cu"}, "does not exist"),
        ({"occupancy": 2}, "occupancy"),
        ({"dynamic_smem_bytes": 1 << 20}, "dynamic_smem_bytes"),
        ({"args": [{"name": "out", "type": "float*"}]}, "buffer_bytes"),
        ({"args": [{"name": "out", "type": "float*", "buffer_bytes": 4}]}, "no 'iters'"),
    ],
)
def test_bad_entries_give_one_line_errors(tmp_path, change, message):
    p = _write(tmp_path, {"b": {**GOOD, **change}})
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        load_registry(p)
    assert "\n" not in str(err.value) and str(p) in str(err.value)


def test_bad_annotation(tmp_path):
    p = _write(tmp_path, {"b": GOOD}, 'extern "C" __global__ void k(int iters) {}\n// @work k per_iter flops=2\n')
    with pytest.raises(ValueError, match="bad item"):
        load_registry(p)


def test_missing_registry(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_registry(tmp_path / "none.yaml")


def test_registry_lives_in_repo():
    assert MICROBENCH_DIR.is_dir() and (MICROBENCH_DIR / "registry.yaml").is_file()


def test_l1_wraps_its_index_with_a_mask_so_n4_is_a_power_of_two():
    """l1.cu indexes with `& (n4 - 1)`: any other n4 would read outside the buffer's wrap."""
    for e in load_registry().values():
        if e["kernel"] != "emo_l1":
            continue
        args = {a["name"]: a for a in e["args"]}
        n4 = args["n4"]["value"]
        assert n4 > 0 and n4 & (n4 - 1) == 0, e["name"]
        assert args["buf"]["buffer_bytes"] == 16 * n4, e["name"]
