"""How the busy times of a pack's hardware resources combine into its duration.

The NNLS weights say how much of each microbenchmark's work a pack holds; x_j T_j(f) is the time
that share of work keeps its resource busy at clock f. Work on the same resource queues (adds);
work on different resources (SM pipes, on-chip SRAM, L2, DRAM) overlaps, within a kernel. A pack's
time is therefore between the largest resource's busy time (perfect overlap) and their sum (none,
e.g. a compute-bound kernel followed by a memory-bound one). We take the p-norm of the per-resource
busy times, a smooth maximum (p = 1: the sum; p -> inf: the max), and pick p per pack from the one
point we know exactly: its measured time at the default clock. The curve is then anchored there.
"""

from __future__ import annotations

import numpy as np

# Which resource a microbenchmark's stressed unit occupies. The compute pipes share the warp
# schedulers' issue slots; shared memory and L1 are one SRAM array; DRAM reads and writes share the bus.
STRESS_RESOURCE = {
    "int32": "sm",
    "fp32": "sm",
    "fp64": "sm",
    "sfu": "sm",
    "hmma": "sm",
    "imma": "sm",
    "shared": "sram",
    "l1": "sram",
    "l2": "l2",
    "dram_read": "dram",
    "dram_write": "dram",
}
P_MAX = 6.0  # the smoothest max a pack may get: real GPUs never overlap units perfectly


def pnorm(v: np.ndarray, p: np.ndarray | float, axis: int = 1) -> np.ndarray:
    """(sum v^p)^(1/p) along `axis`, scaled by the max so that large p cannot overflow; p broadcasts
    against v with `axis` removed."""
    m = v.max(axis=axis)
    safe = np.where(m > 0, m, 1.0)
    ratio = v / np.expand_dims(safe, axis)
    p = np.asarray(p, dtype=np.float64)
    p_b = np.expand_dims(p, axis) if p.ndim else p
    return np.where(m > 0, safe * (ratio**p_b).sum(axis=axis) ** (1.0 / p), 0.0)


def calibrate_p(busy0: np.ndarray, t0: np.ndarray, p_max: float = P_MAX, iters: int = 40) -> np.ndarray:
    """[S] p in [1, p_max] with pnorm(busy0[s], p) = t0[s] where one exists; 1 when the busy times
    add up to no more than t0, p_max when even that smooth max exceeds t0. busy0 [S, R]."""
    n1 = busy0.sum(axis=1)
    n_max = pnorm(busy0, p_max)
    lo = np.zeros(len(t0))
    hi = np.full(len(t0), np.log(p_max))
    for _ in range(iters):  # pnorm falls as p grows: bisect on log p, all packs at once
        mid = 0.5 * (lo + hi)
        above = pnorm(busy0, np.exp(mid)) > t0
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    p = np.exp(0.5 * (lo + hi))
    return np.where(n1 <= t0 * (1 + 1e-9), 1.0, np.where(n_max >= t0, p_max, p))


def time_curves(busy: np.ndarray, t0: np.ndarray, default_index: int, p: np.ndarray) -> np.ndarray:
    """[S, C] predicted time: t0 x pnorm(busy(f)) / pnorm(busy(f0)); flat where nothing is busy.
    busy [S, R, C], p [S]."""
    norm = pnorm(busy, p[:, None], axis=1)  # [S, C]
    ref = norm[:, [default_index]]
    shape = np.where(ref > 0, norm / np.where(ref > 0, ref, 1.0), 1.0)
    return t0[:, None] * shape
