"""The microbenchmark power model (the same mix idea as `emo.model.fit`, for data that has power
per clock and unit utilisations but no counters or time, such as Guerreiro et al.'s Titan X set).

An application's utilisation vector u_a (fraction of peak per unit, read at the default clock) is
a non-negative mix of the microbenchmarks' vectors: x_a = argmin_{x >= 0} |U x - u_a| (NNLS;
utilisations are already fractions of each unit's peak, so no further scaling). Each benchmark adds
its power above idle in that proportion, at every clock:

    P_a(f) = P_idle(f) + sum_j x_aj (P_j(f) - P_idle(f))

The benchmarks' curves carry how each unit's power moves with the clock (voltage, and memory-bound
units losing utilisation as the core slows), so the mix predicts the shape as well as the level.
`anchor_to_default` rescales a predicted curve to a measured power at the default clock (what EMO
does with time: the level is measured, the model supplies how it scales).
"""

from __future__ import annotations

import numpy as np

from emo.model.nnls import solve_nnls


def fit_power_mixture(
    micro_util: np.ndarray, micro_power_w: np.ndarray, idle_power_w: np.ndarray, app_util: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(weights [A, J], predicted power [A, C]) from micro_util [J, U], micro_power_w [J, C],
    idle_power_w [C] and app_util [A, U]."""
    micro_util, app_util = np.asarray(micro_util, float), np.atleast_2d(np.asarray(app_util, float))
    micro_power_w, idle_power_w = np.asarray(micro_power_w, float), np.asarray(idle_power_w, float)
    if micro_util.shape[0] != micro_power_w.shape[0] or micro_util.shape[1] != app_util.shape[1]:
        raise ValueError(
            f"power model: shapes do not agree: micro_util {micro_util.shape}, "
            f"micro_power {micro_power_w.shape}, app_util {app_util.shape}"
        )
    if micro_power_w.shape[1] != idle_power_w.shape[0]:
        raise ValueError(
            f"power model: {micro_power_w.shape[1]} clocks of benchmark power but {idle_power_w.shape[0]} of idle power"
        )
    x, _ = solve_nnls(micro_util, app_util, np.ones(micro_util.shape[1]))
    return x, idle_power_w[None, :] + x @ (micro_power_w - idle_power_w[None, :])


def anchor_to_default(curves: np.ndarray, measured_default: np.ndarray, default_index: int) -> np.ndarray:
    """Scale each row of `curves` [A, C] so that its value at `default_index` equals measured_default [A]."""
    return np.asarray(measured_default, float)[:, None] * curves / curves[:, [default_index]]


def mape(pred: np.ndarray, true: np.ndarray, axis=None) -> np.ndarray:
    """Mean absolute percentage error, %."""
    return 100.0 * np.mean(np.abs(np.asarray(pred) - np.asarray(true)) / np.abs(np.asarray(true)), axis=axis)


def evaluate_power_model(micro, apps, idle_name: str = "Idle"):
    """Per application MAPE (%) over every clock pair of four predictors (micro, apps: PowerCurves
    of one GPU, e.g. from emo.model.gpupowermodel):

      emo            the mix, from utilisations only;
      baseline       the mean power curve of the microbenchmarks (the app ignored);
      emo_anchored   the mix's shape, scaled to the app's measured power at the default clocks;
      baseline_anchored   the mean curve's shape, scaled the same way.
    Idle is the idle power and not part of the mix or the mean.
    """
    import pandas as pd

    if list(micro.clocks.tolist()) != list(apps.clocks.tolist()):
        raise ValueError("power model: benchmarks and applications were measured at different clock pairs")
    if idle_name not in micro.names:
        raise ValueError(f"power model: no {idle_name!r} configuration among the benchmarks")
    i_idle = micro.names.index(idle_name)
    work = [j for j in range(len(micro.names)) if j != i_idle]
    i0 = micro.default_index
    _, emo = fit_power_mixture(micro.util[work], micro.power_w[work], micro.power_w[i_idle], apps.util)
    mean = np.broadcast_to(micro.power_w[work].mean(axis=0), apps.power_w.shape)
    measured0 = apps.power_w[:, i0]
    preds = {
        "emo": emo,
        "baseline": mean,
        "emo_anchored": anchor_to_default(emo, measured0, i0),
        "baseline_anchored": anchor_to_default(np.array(mean), measured0, i0),
    }
    return pd.DataFrame(
        {k: mape(v, apps.power_w, axis=1) for k, v in preds.items()}, index=pd.Index(apps.names, name="application")
    )
