"""The energy-latency model: each pack signature as a non-negative mix of microbenchmarks.

Inputs (plain tables; the model never sees a device, only what calibrate and profile measured):
  bench    per microbenchmark j x SM clock f: T_j(f), E_j(f) of one launch, and its counter vector
           c_j (emo.device.COUNTERS) read at the default clock f0;
  counters per signature s: c_s, one execution, default clock (range profiler);
  T_s(f0)  the signature's measured time at the default clock (exact, from the trace).

1. Mix. x_s = argmin_{x >= 0} |D (sum_j x_j c_j - c_s)|  (scipy NNLS) over the work counters
   (bytes, instructions). D scales counter k by 1 / r_k, r_k = max_j c_jk / T_j(f0) the suite's
   peak rate, so every row is "seconds at peak rate". The time-like counters (sm_active_cycles,
   active_warps) do not add up when a pack's units overlap, so they enter as averages instead:
   0.1 * sum_j x_j T_j(f0) (a_j - a_s) / max a = 0, the mix's time-weighted occupancy (and fraction
   of active SM cycles) equal to the pack's; this tells the high/low-occupancy variants apart.
   The idle benchmark is not in the basis, nor is a benchmark the profiler cannot tell from an
   earlier one (same counter proportions and averages: IMMA vs HMMA, SFU vs INT32 share counters).
2. Time. Resource r (SM pipes, SRAM = shared+L1, L2, DRAM) is busy b_r(f) = sum_{j on r} x_j T_j(f).
   T_s(f) = T_s(f0) * N_p(b(f)) / N_p(b(f0)), N_p the p-norm over resources (p = 1: busy times
   add; large p: they overlap). p in [1, 6] is chosen per signature so that N_p(b(f0)) = T_s(f0)
   where possible: the measured time says how much the resources overlapped.
   `overlap="sum"` fixes p = 1, i.e. the plain shape sum_j x_j T_j(f) / sum_j x_j T_j(f0).
3. Energy. P_idle(f) from the idle benchmark; P_run(f), the power of a GPU running a kernel
   that does nothing, from pairs of benchmarks with the same work at two occupancies (dE/dT);
   W_j(f) = E_j(f) - P_run(f) T_j(f), the work energy of benchmark j (see emo.model.calibration).
      E_s(f) = P_idle(f) T_s(f) + k [ (P_run(f) - P_idle(f)) T_s(f) + sum_j x_j W_j(f) ]
   The first term is idle energy (columns idle_energy_j); the bracket is the dynamic energy
   (dynamic_energy_j), what the pack adds on top of an idle GPU. For a pack that is a sequence of
   benchmark launches this is exact: E_s = sum_j x_j E_j.
4. Level. A pack's energy at f0 cannot be measured (sensors are far slower than 5 ms), so the level
   k is one factor per GPU model and workload, set by `calibrate_energy_level` from a measured
   iteration at the default clock: E_iter = devices * P_idle(f0) * makespan + E_other
   + k * sum_s n_s D_s(f0), with n_s the executions of signature s per iteration.
   The what-if predictor sums dynamic_energy_j of the packs at their clocks plus idle power of
   every GPU over the makespan, so idle energy is never counted twice.

Counters are a named feature set (emo.device.features): EMO's own vector keeps the equations above
exactly; any other source's columns (DCGM ratios, ncu metrics) enter through emo.model.features as
busy seconds and averages. `fit_predict` (emo.model.kernels) is the open interface: the same mix on
long tables from any source, for standalone kernels, scored against two references.
"""

from emo.model.calibration import BenchTables, bench_tables, idle_power, idle_power_w, running_power_w
from emo.model.fit import (
    MODEL_COLUMNS,
    Fit,
    ModelArrays,
    calibrate_energy_level,
    fit_arrays,
    fit_signatures,
    fit_table,
    model_arrays,
)
from emo.model.kernels import fit_predict
from emo.model.power import fit_power_mixture

__all__ = [
    "BenchTables",
    "Fit",
    "MODEL_COLUMNS",
    "ModelArrays",
    "bench_tables",
    "calibrate_energy_level",
    "fit_arrays",
    "fit_power_mixture",
    "fit_predict",
    "fit_signatures",
    "fit_table",
    "idle_power",
    "idle_power_w",
    "model_arrays",
    "running_power_w",
]
