"""Idle power per clock when the benchmark table has no idle row.

The lowest benchmark power at each clock (the envelope) is idle power plus that benchmark's own
dynamic power, and the dynamic part shrinks faster than idle power as the clock falls (V^2 f
against V). So idle is not a fixed share of the envelope: on the virtual A100 it is 79 % of it at
the top clock and 91 % at 330 MHz. The candidates here remove a share of the envelope that follows
the benchmarks' common dynamic shape (the first principal component of their power curves), so
only one number, how much of the envelope is dynamic, is left to choose (emo.model.kernels, by
leaving each benchmark out in turn).
"""
from __future__ import annotations

import numpy as np

SHARES = np.linspace(0.0, 1.0, 11)  # candidate idle share of the envelope at the reference clock


def dynamic_shape(power: np.ndarray, r: int) -> np.ndarray:
    """[C] how the benchmarks' power above their common floor changes with the clock, 1 at column r:
    the first right singular vector of their power curves [J, C] about the mean curve."""
    centred = power - power.mean(axis=0)
    if len(power) < 2 or not np.any(centred):
        return np.ones(power.shape[1])
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    g = vt[0]
    if abs(g[r]) < 1e-12:
        return np.ones(power.shape[1])
    return np.clip(g / g[r], 0.0, None)


def idle_candidates(power: np.ndarray, r: int, shares: np.ndarray = SHARES) -> np.ndarray:
    """[K, C] candidate idle curves: the envelope less (1 - share) of its value at r, shaped like the
    benchmarks' dynamic power; share 1 is the envelope itself. Never below 0 nor above the envelope."""
    env = np.nanmin(power, axis=0)
    g = dynamic_shape(power, r)
    cand = env[None, :] - (1.0 - shares[:, None]) * env[r] * g[None, :]
    return np.clip(cand, 0.0, env[None, :])
