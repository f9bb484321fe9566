"""The model's input vocabulary: named features, and how each real counter source maps onto them.

A feature says what a unit of the GPU did over a range (a kernel, a pack, a profiled window):
  role "work"      work that adds up when a range holds more of it (instructions of a pipe, bytes
                   through a memory level): busy time of that unit;
  role "presence"  an average that does not add up when units overlap (SM active, occupancy);
  resource         the hardware the work queues on (sm, sram, l2, dram, link): work on the same
                   resource adds, work on different resources overlaps.

A source column is one of three forms:
  "total"  a count per range (Nsight Compute / CUPTI range-profiler metrics such as
           dram__bytes_read.sum): the model divides by the suite's highest rate, so a total
           becomes "seconds the unit would need at the peak rate the microbenchmarks reached";
  "ratio"  a fraction of the range's time the unit was busy (DCGM profiling fields such as
           DCGM_FI_PROF_DRAM_ACTIVE, time-averaged): times the range's duration, busy seconds;
  "rate"   per second over the range (DCGM_FI_PROF_PCIE_TX_BYTES): times the duration, a total.
`scale` turns the source's unit into the form's (percent -> fraction).

Nothing here is shaped around one device's counter list: a column that no source names is still
used (as its source's default form, a work feature on a resource of its own) and reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from emo.errors import ConfigError

ROLES = ("work", "presence")
FORMS = ("total", "ratio", "rate")


@dataclass(frozen=True)
class Feature:
    name: str
    role: str
    resource: str
    doc: str


@dataclass(frozen=True)
class Column:
    """How one source column maps onto a feature."""

    feature: str
    form: str
    scale: float = 1.0


_F = [
    Feature("sm_active", "presence", "sm", "share of time (or cycles) an SM had at least one warp resident"),
    Feature("sm_occupancy", "presence", "sm", "resident warps over the SM's maximum, averaged over time"),
    Feature("gr_active", "presence", "sm", "share of time the graphics/compute engine was busy"),
    Feature("fp32", "work", "sm", "FP32 (FMA) pipe"),
    Feature("fp16", "work", "sm", "FP16 pipe (non-tensor)"),
    Feature("fp64", "work", "sm", "FP64 pipe"),
    Feature("tensor", "work", "sm", "tensor pipe (all precisions)"),
    Feature("tensor_hmma", "work", "sm", "tensor pipe, half-precision MMA"),
    Feature("tensor_imma", "work", "sm", "tensor pipe, integer MMA"),
    Feature("tensor_dfma", "work", "sm", "tensor pipe, FP64 MMA"),
    Feature("int", "work", "sm", "integer/ALU pipe"),
    Feature("sfu", "work", "sm", "special-function unit"),
    Feature("cf", "work", "sm", "control-flow unit"),
    Feature("ldst", "work", "sm", "load/store unit (memory instructions issued)"),
    Feature("l1", "work", "sram", "L1/texture cache traffic"),
    Feature("shared", "work", "sram", "shared-memory traffic"),
    Feature("l2", "work", "l2", "L2 traffic"),
    Feature("dram", "work", "dram", "device-memory traffic (read + write)"),
    Feature("dram_read", "work", "dram", "device-memory reads"),
    Feature("dram_write", "work", "dram", "device-memory writes"),
    Feature("pcie_tx", "work", "link", "PCIe bytes sent"),
    Feature("pcie_rx", "work", "link", "PCIe bytes received"),
    Feature("nvlink_tx", "work", "link", "NVLink bytes sent"),
    Feature("nvlink_rx", "work", "link", "NVLink bytes received"),
]
FEATURES: dict[str, Feature] = {f.name: f for f in _F}

# Source column -> feature. DCGM: the profiling fields (dcgmi dmon -e 1002,...), activity ratios.
DCGM = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Column("gr_active", "ratio"),
    "DCGM_FI_PROF_SM_ACTIVE": Column("sm_active", "ratio"),
    "DCGM_FI_PROF_SM_OCCUPANCY": Column("sm_occupancy", "ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Column("tensor", "ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": Column("tensor_hmma", "ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": Column("tensor_imma", "ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": Column("tensor_dfma", "ratio"),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": Column("fp64", "ratio"),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": Column("fp32", "ratio"),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": Column("fp16", "ratio"),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": Column("int", "ratio"),
    "DCGM_FI_PROF_DRAM_ACTIVE": Column("dram", "ratio"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": Column("pcie_tx", "rate"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": Column("pcie_rx", "rate"),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": Column("nvlink_tx", "rate"),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": Column("nvlink_rx", "rate"),
}
# Nsight Compute / CUPTI range profiler (Perfworks metric names), totals per range.
NCU = {
    "sm__cycles_active.sum": Column("sm_active", "total"),
    "sm__cycles_active.avg": Column("sm_active", "total"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": Column("sm_occupancy", "ratio", 0.01),
    "dram__bytes.sum": Column("dram", "total"),
    "dram__bytes_read.sum": Column("dram_read", "total"),
    "dram__bytes_write.sum": Column("dram_write", "total"),
    "l1tex__t_bytes.sum": Column("l1", "total"),
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": Column("shared", "total"),
    "lts__t_bytes.sum": Column("l2", "total"),
    "sm__inst_executed_pipe_alu.sum": Column("int", "total"),
    "smsp__inst_executed_pipe_alu.sum": Column("int", "total"),
    "sm__inst_executed_pipe_fma.sum": Column("fp32", "total"),
    "smsp__inst_executed_pipe_fma.sum": Column("fp32", "total"),
    "sm__inst_executed_pipe_fp16.sum": Column("fp16", "total"),
    "sm__inst_executed_pipe_fp64.sum": Column("fp64", "total"),
    "smsp__inst_executed_pipe_fp64.sum": Column("fp64", "total"),
    "sm__inst_executed_pipe_lsu.sum": Column("ldst", "total"),
    "smsp__inst_executed_pipe_lsu.sum": Column("ldst", "total"),
    "sm__inst_executed_pipe_xu.sum": Column("sfu", "total"),
    "sm__inst_executed_pipe_tensor.sum": Column("tensor", "total"),
    "sm__inst_executed_pipe_tensor_op_hmma.sum": Column("tensor_hmma", "total"),
    "sm__inst_executed_pipe_tensor_op_imma.sum": Column("tensor_imma", "total"),
    "sm__pipe_tensor_cycles_active.sum": Column("tensor", "total"),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": Column("dram", "ratio", 0.01),
}
# EMO's own counter vector (what calibrate/profile store, emo.device.COUNTERS): ncu-style totals.
EMO = {
    "sm_active_cycles": Column("sm_active", "total"),
    "active_warps": Column("sm_occupancy", "ratio"),
    "dram_read_bytes": Column("dram_read", "total"),
    "dram_write_bytes": Column("dram_write", "total"),
    "l1_bytes": Column("l1", "total"),
    "l2_bytes": Column("l2", "total"),
    "alu_inst": Column("int", "total"),
    "fma_inst": Column("fp32", "total"),
    "fp64_inst": Column("fp64", "total"),
    "mem_inst": Column("ldst", "total"),
    "tensor_inst": Column("tensor", "total"),
}
# The unit utilisations of Guerreiro et al.'s Titan X/Xp/K40c data (hpc-ulisboa/gpupowermodel).
GPUPOWERMODEL = {
    "SP": Column("fp32", "ratio"),
    "INT": Column("int", "ratio"),
    "DP": Column("fp64", "ratio"),
    "SFU": Column("sfu", "ratio"),
    "CF": Column("cf", "ratio"),
    "L2": Column("l2", "ratio"),
    "Shared": Column("shared", "ratio"),
    "DRAM": Column("dram", "ratio"),
}
# EMO's counter vector from ncu / CUPTI metric values (first name present wins: names differ by
# architecture; absent -> NaN, never a made-up zero). What the NVML backend and trace readers use.
EMO_FROM_NCU: dict[str, tuple[str, ...]] = {
    "sm_active_cycles": ("sm__cycles_active.sum",),
    "active_warps": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "dram_read_bytes": ("dram__bytes_read.sum",),
    "dram_write_bytes": ("dram__bytes_write.sum",),
    "l1_bytes": ("l1tex__t_bytes.sum",),
    "l2_bytes": ("lts__t_bytes.sum",),
    "alu_inst": ("sm__inst_executed_pipe_alu.sum",),
    "fma_inst": ("sm__inst_executed_pipe_fma.sum",),
    "fp64_inst": ("sm__inst_executed_pipe_fp64.sum",),
    "mem_inst": ("sm__inst_executed_pipe_lsu.sum",),
    "tensor_inst": ("sm__inst_executed_pipe_tensor.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum"),
}


def emo_counters(metrics: dict[str, float]) -> dict[str, float]:
    """EMO's counter vector from one result's ncu/CUPTI metric values."""
    return {
        c: next((float(metrics[n]) for n in names if n in metrics), float("nan")) for c, names in EMO_FROM_NCU.items()
    }


def sum_counters(kernels: list[dict[str, float]]) -> dict[str, float]:
    """One range's counter vector from its kernels': sums, except active_warps (an occupancy share),
    which is the mean weighted by each kernel's active cycles."""
    out = {c: float(sum(k[c] for k in kernels)) for c in EMO if c != "active_warps"}
    cyc = [k["sm_active_cycles"] for k in kernels]
    w = sum(cyc)
    out["active_warps"] = (
        sum(k["active_warps"] * c for k, c in zip(kernels, cyc)) / w
        if w > 0
        else float(sum(k["active_warps"] for k in kernels) / max(len(kernels), 1))
    )
    return {c: out[c] for c in EMO}


SOURCES: dict[str, dict[str, Column]] = {"dcgm": DCGM, "ncu": NCU, "emo": EMO, "gpupowermodel": GPUPOWERMODEL}
DEFAULT_FORM = {"dcgm": "ratio", "ncu": "total", "emo": "total", "gpupowermodel": "ratio"}


class FeatureSet(tuple):
    """An ordered tuple of source column names that also knows each one's feature and form
    (a tuple, so code that indexes a counter vector by name keeps working)."""

    columns: dict[str, Column]
    features: dict[str, Feature]

    def __new__(cls, columns: dict[str, Column], extra: dict[str, Feature] | None = None):
        self = super().__new__(cls, tuple(columns))
        self.columns = dict(columns)
        self.features = {**FEATURES, **(extra or {})}
        return self

    def feature(self, column: str) -> Feature:
        return self.features[self.columns[column].feature]


def resolve_columns(names, source: str | None = None) -> tuple[FeatureSet, list[str]]:
    """The counter columns among `names` and how each maps, plus notes for the user.

    source None: every known source's names are recognised; "dcgm" / "ncu" / ...: only that
    source's (the others' columns are ignored, with a note). A column no source names is used as
    a work feature of its own in the source's default form (ratio when unknown)."""
    if source is not None and source not in SOURCES:
        raise ConfigError(f"counters: {source!r} is not one of {', '.join(SOURCES)}")
    known = SOURCES[source] if source else {k: v for s in SOURCES.values() for k, v in s.items()}
    others = {k for s, m in SOURCES.items() if s != source for k in m} if source else set()
    cols: dict[str, Column] = {}
    extra: dict[str, Feature] = {}
    notes: list[str] = []
    for n in names:
        if n in known:
            cols[n] = known[n]
        elif n in others:
            notes.append(f"column {n} belongs to another counter source than {source}: ignored")
        else:
            form = DEFAULT_FORM.get(source or "", "ratio")
            extra[n] = Feature(n, "work", n, "a column no known source names")
            cols[n] = Column(n, form)
            notes.append(f"column {n} is not a known {source or 'counter'} name: used as a {form} work feature")
    return FeatureSet(cols, extra), notes
