"""Non-negative least squares of counter vectors on the microbenchmarks' vectors, scaled so that
every counter weighs alike.

Raw counters differ by orders of magnitude (bytes ~1e9, tensor instructions ~1e6), so each counter
k is divided by the highest rate any microbenchmark reached on it, r_k = max_j c_jk / T_j(f0): a
count becomes "seconds the unit would need at the suite's peak rate". A residual then means the
same thing on every row. Counters that no microbenchmark exercises (r_k = 0) carry no information
about the mix and are left out (what they hold shows up in the residual only).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls


def peak_rates(counters: np.ndarray, time_s: np.ndarray) -> np.ndarray:
    """[K] the highest per-second rate of each counter over the benchmarks (rows of `counters`)."""
    return (counters / time_s[:, None]).max(axis=0)


def solve_nnls(
    basis: np.ndarray,
    targets: np.ndarray,
    scale: np.ndarray,
    row_weight: np.ndarray | None = None,
    zero_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Weights x >= 0 with targets[s] ~ x[s] @ basis, one NNLS per target row.

    basis [J, K] (one vector per microbenchmark), targets [S, K], scale [K] (divide each counter
    by it; 0 drops the counter), row_weight [K] optional extra weight per counter.
    zero_rows [S, M, J] optional extra equations per target, zero_rows[s] @ x = 0 (already scaled).
    Returns (x [S, J], relative residual [S]: |A x - b| / |b| over the counter rows, 0 for an
    all-zero target).
    """
    keep = scale > 0
    w = np.ones(basis.shape[1]) if row_weight is None else np.asarray(row_weight, dtype=np.float64)
    f = np.where(keep, w / np.where(keep, scale, 1.0), 0.0)[keep]
    a = (basis[:, keep] * f).T  # [K', J]
    b = targets[:, keep] * f  # [S, K']
    x = np.zeros((targets.shape[0], basis.shape[0]))
    resid = np.zeros(targets.shape[0])
    for s in range(targets.shape[0]):
        norm = float(np.linalg.norm(b[s]))
        if norm == 0.0:
            continue
        if zero_rows is None:
            x[s], _ = nnls(a, b[s], maxiter=50 * max(a.shape[1], 1))
        else:
            x[s], _ = nnls(
                np.vstack([a, zero_rows[s]]),
                np.concatenate([b[s], np.zeros(zero_rows.shape[1])]),
                maxiter=50 * max(a.shape[1], 1),
            )
        resid[s] = float(np.linalg.norm(a @ x[s] - b[s])) / norm
    return x, resid
