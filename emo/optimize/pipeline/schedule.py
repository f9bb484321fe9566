"""From a solution to a FrequencyPolicy: per GPU, clock steps relative to the iteration start.

Windows become steps at their start on the iteration timeline; runs of equal clocks collapse to one
step. A clock request lands `transition_ms` = (min, max) after it is issued (check.Latencies: per
direction and, when measured so, per target clock), and the applier issues each step its own lead
= max ahead, so an undelayed step would land up to (max - min) early. That is what we want when
the clock goes UP (the faster clock is in place when the critical work starts) but not when it
goes DOWN (the slower clock would eat into the end of the previous window), so a down-step is
placed (max - min) later: it lands between its window's start and (max - min) after. The schedule
repeats every iteration, so the first step is a down-step too when its clock is below the last
step's. Steps closer than `min_interval_ms` to the previous one, or issued no later than it, are
merged into it, keeping the faster clock.
"""

from __future__ import annotations

import numpy as np

from emo.errors import ConfigError
from emo.optimize.pipeline.check import Latencies
from emo.optimize.solution import Solution
from emo.policy import FrequencyPolicy, Step


def build_policy(
    sol: Solution,
    gpu: str,
    *,
    window_ms: float,
    device_ids: list[int] | None = None,
    transition_ms: tuple[float, float] | Latencies,
    min_interval_ms: float = 10.0,
    period_ms: float | None = None,
    window_start_ms: np.ndarray | None = None,
    window_clear_ms: np.ndarray | None = None,
    meta: dict | None = None,
) -> FrequencyPolicy:
    """`device_ids[g]`: the policy's device id of the problem's GPU g (default: g). `window_start_ms`
    [group, window]: where each window starts in the iteration (default: the items' change points on
    the baseline timeline, else window × window_ms; pipeline.tables.planned_window_starts gives
    the planned ones). Windows that start at or after the period (padding) never make a step.
    `window_clear_ms` [group, window]: when the window before has finished its packs (planned_window
    _clear); a down-step lands no earlier."""
    if not isinstance(transition_ms, Latencies):
        lo, hi = float(transition_ms[0]), float(transition_ms[1])
        if lo < 0 or hi < lo:
            raise ConfigError(f"optimizer.transition_ms must be [min, max] with 0 <= min <= max (got {transition_ms})")
    lat = Latencies.of(transition_ms)
    items = sol.items
    period = float(period_ms if period_ms is not None else sol.makespan_ns * 1e-6)
    nwin = int(items.window.max()) + 1
    if window_start_ms is None:  # the baseline change points
        window_start_ms = (
            items.edges_ns * 1e-6
            if items.edges_ns is not None
            else np.tile(np.arange(nwin + 1) * window_ms, (len(items.groups), 1))
        )
    else:  # the end of the last window: the period
        window_start_ms = np.hstack([window_start_ms, np.full((len(window_start_ms), 1), np.inf)])
    if window_clear_ms is None:
        window_clear_ms = np.full((len(items.groups), nwin), -np.inf)
    steps: dict[int, list[Step]] = {}
    for g, devs in enumerate(items.groups):
        raw = _group_steps(sol, g, lat, period, window_start_ms[g], window_clear_ms[g], min_interval_ms)
        raw = _repeated(raw, lat, float(window_clear_ms[g, 0]), min_interval_ms)
        if not raw:
            raw = [Step(0.0, int(sol.problem.clocks_mhz[sol.problem.ref]))]
        raw = _issued_in_order(raw, lat, period)
        for d in devs:
            steps[int(device_ids[d]) if device_ids is not None else int(d)] = list(raw)
    s = sol.summary()
    return FrequencyPolicy(
        gpu=gpu,
        steps=steps,
        period_ms=period,
        budget=float(sol.budget),
        lead_ms=lat.hi,
        meta={
            "method": sol.method,
            "window_ms": window_ms,
            "transition_ms": [lat.lo, lat.hi],
            "min_interval_ms": min_interval_ms,
            "model_saving": s["predicted_saving"],
            "model_slowdown": s["predicted_slowdown"],
            **(meta or {}),
        },
    )


def _group_steps(
    sol: Solution,
    g: int,
    lat: Latencies,
    period: float,
    start_ms: np.ndarray,
    clear_ms: np.ndarray,
    min_interval_ms: float,
) -> list[Step]:
    """Clock group g's steps in window order: one per change of clock, a down-step placed to land
    inside its window (dropped when the window ends first), steps closer than min_interval_ms merged
    into the one before, keeping the faster clock."""
    items, mhz = sol.items, sol.item_mhz
    ks = np.flatnonzero(items.group == g)
    ks = ks[np.argsort(items.window[ks], kind="stable")]
    raw: list[Step] = []
    for k in ks:
        w = int(items.window[k])
        t = float(start_ms[w])
        if not t < period:  # a padding window, or one that starts after the iteration ends
            continue
        c = int(mhz[k])
        if raw and raw[-1].sm_mhz == c:
            continue
        if raw and c < raw[-1].sm_mhz:
            # down-steps land inside their own window, never before it, nor before the packs of
            # the window before have finished (window_clear_ms)
            t = max(t, float(clear_ms[w])) + lat.spread(c)
            if t >= min(period, start_ms[w + 1]):
                continue  # the window ends before a slower clock could land: stay fast
        if raw and t - raw[-1].t_ms < min_interval_ms:
            raw[-1] = Step(raw[-1].t_ms, max(raw[-1].sm_mhz, c))
            if len(raw) > 1 and raw[-2].sm_mhz == raw[-1].sm_mhz:
                raw.pop()
            continue
        raw.append(Step(t, c))
    return raw


def _repeated(raw: list[Step], lat: Latencies, clear0_ms: float, min_interval_ms: float) -> list[Step]:
    """The policy repeats: a first step below the last one's clock goes down from it, so it too lands
    inside its window (issued lead_ms before t = spread, at the end of the previous iteration), or,
    when the window is too short for that, the first window stays fast."""
    if len(raw) > 1 and raw[0].sm_mhz < raw[-1].sm_mhz:
        t0 = max(0.0, clear0_ms) + lat.spread(raw[0].sm_mhz)
        if raw[1].t_ms - t0 >= min_interval_ms:
            raw[0] = Step(t0, raw[0].sm_mhz)
        else:
            raw[0] = Step(0.0, raw[-1].sm_mhz)
            if raw[1].sm_mhz == raw[0].sm_mhz:
                raw.pop(1)
    return raw


def _with_leads(raw: list[Step], lat: Latencies) -> tuple[list[Step], list[float], list[float]]:
    """(steps, issue times, earliest landings): each step with its own lead (Latencies.lead: a
    raise's or a lowering's, to its clock), None where that is the policy's lead_ms (lat.hi), so a
    policy with one lead is written as before; when each is issued, and when it lands at the soonest
    (the planned range's min after that)."""
    out, at, land = [], [], []
    for i, s in enumerate(raw):
        prev = raw[i - 1].sm_mhz if i > 0 or len(raw) > 1 else s.sm_mhz  # the schedule repeats
        up = s.sm_mhz >= prev
        lead = lat.lead(s.sm_mhz, up)
        out.append(Step(s.t_ms, s.sm_mhz, None if abs(lead - lat.hi) < 1e-9 else round(lead, 4)))
        at.append(s.t_ms - lead)
        land.append(at[-1] + lat.earliest(s.sm_mhz, up))
    return out, at, land


def _collapse(raw: list[Step]) -> list[Step]:
    return [s for i, s in enumerate(raw) if i == 0 or s.sm_mhz != raw[i - 1].sm_mhz]


def _issued_in_order(raw: list[Step], lat: Latencies, period: float) -> list[Step]:
    """The steps with their leads, each request issued once the one before it can have landed (the
    last one issued wins: a raise with a long lead issued before the short window ahead of it has
    its clock would undo that window's own request). A step issued sooner merges with the one
    before it at the faster of the two clocks; across the iteration's end, the last window takes
    the first one's clock when that is faster, else the first window stays at the last one's."""
    for _ in range(len(raw) + 1):
        steps, at, land = _with_leads(raw, lat)
        bad = next((k for k in range(1, len(steps)) if at[k] < land[k - 1]), None)
        if bad is not None:
            raw[bad - 1] = Step(raw[bad - 1].t_ms, max(raw[bad - 1].sm_mhz, raw[bad].sm_mhz))
            del raw[bad]
        elif raw[0].sm_mhz != raw[-1].sm_mhz and period > 0 and at[0] + period < land[-1]:
            if raw[0].sm_mhz < raw[-1].sm_mhz:
                raw[0] = Step(0.0, raw[-1].sm_mhz)
            else:
                raw[-1] = Step(raw[-1].t_ms, raw[0].sm_mhz)
        else:
            return steps
        raw = _collapse(raw)
    return _with_leads(raw, lat)[0]
