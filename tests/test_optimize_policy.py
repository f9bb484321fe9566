"""Policies from solutions: steps per GPU, transition lead, ε, and the baselines' policies."""

import numpy as np
import pytest
from optimize_instances import random_problem

from emo.optimize import make_items, optimize, optimize_static
from emo.optimize.pipeline.schedule import build_policy
from emo.optimize.solution import Solution
from emo.policy import FrequencyPolicy


def _sol(choice_by_window, interval=20.0):
    p, _ = random_problem(4, gpus=1, kernels=12)
    it = make_items(p, interval)
    mhz = list(p.clocks_mhz)
    choice = np.array([mhz.index(choice_by_window[w % len(choice_by_window)]) for w in it.window])
    return Solution(p, it, choice, "emo", 0.02), p


def test_steps_collapse_lead_and_down_steps_land_inside_their_window():
    p, _ = random_problem(4, gpus=1, kernels=12)
    hi, lo = int(p.clocks_mhz[-1]), int(p.clocks_mhz[2])
    sol, _ = _sol([hi, lo, lo, hi])
    pol = build_policy(sol, "a100", window_ms=20.0, transition_ms=(5.0, 15.0), min_interval_ms=10.0)
    steps = pol.steps[0]
    assert pol.lead_ms == 15.0
    assert steps[0] == type(steps[0])(0.0, hi)
    assert steps[1].sm_mhz == lo and steps[1].t_ms == pytest.approx(20.0 + 10.0)  # down: +(max-min)
    assert steps[2].sm_mhz == hi and steps[2].t_ms == pytest.approx(60.0)  # up: at the window start
    assert all(b.sm_mhz != a.sm_mhz for a, b in zip(steps, steps[1:]))
    assert FrequencyPolicy.from_dict(pol.to_dict()).steps == pol.steps


def test_min_interval_merges_keeping_the_faster_clock():
    """Windows of 5 ms with clocks changing every one or two windows, ε = 12 ms: steps are at least ε
    apart, there is more than one, and a merged window never runs slower than planned."""
    p, _ = random_problem(4, gpus=1, kernels=12)
    hi, mid, lo = int(p.clocks_mhz[-1]), int(p.clocks_mhz[3]), int(p.clocks_mhz[0])
    sol, _ = _sol([lo, lo, lo, hi, mid, mid, mid, lo], interval=5.0)
    pol = build_policy(sol, "a100", window_ms=5.0, transition_ms=(5.0, 5.0), min_interval_ms=12.0)
    steps = pol.steps[0]
    ts = [s.t_ms for s in steps]
    assert len(steps) >= 2
    assert all(b - a >= 12.0 - 1e-9 for a, b in zip(ts, ts[1:]))

    def clock_at(t):
        return [s.sm_mhz for s in steps if s.t_ms <= t][-1]

    planned = sol.item_mhz[np.argsort(sol.items.window)]
    for w, mhz in enumerate(planned):
        if (w + 0.5) * 5.0 < pol.period_ms:
            assert clock_at((w + 0.5) * 5.0) >= mhz, w


def test_static_is_one_step_and_never_beats_emo():
    p, _ = random_problem(6, gpus=2, kernels=10)
    it = make_items(p, 20.0)
    st = optimize_static(p, 0.05, items=it)
    em = optimize(p, 0.05, items=it)
    pol = build_policy(st, "a100", window_ms=20.0, transition_ms=(5.0, 15.0))
    assert all(len(s) == 1 for s in pol.steps.values())
    assert em.energy_j <= st.energy_j + 1e-9
    assert st.feasible


def _chains(offsets_ms, jitter: float, seed: int = 0):
    """One chain of 40 one-ms kernels per GPU, GPU d starting offsets_ms[d] later (a host node
    of that length before it), each kernel's duration jittered by `jitter` (relative)."""
    from emo.optimize.problem import build_problem

    rng = np.random.default_rng(seed)
    clocks = np.array([705, 1410])
    src, dst, device, dur = [], [], [], []
    for d, off in enumerate(offsets_ms):
        host = len(device)
        device.append(-1)
        dur.append([off * 1e6] * 2)
        prev = host
        for _ in range(40):
            k = len(device)
            device.append(d)
            t = 1e6 * (1 + jitter * rng.standard_normal())
            dur.append([2 * t, t])
            src.append(prev)
            dst.append(k)
            prev = k
    dur = np.array(dur)
    energy = np.where(np.array(device)[:, None] >= 0, dur * 1e-7, 0.0)
    return build_problem(src, dst, device, dur, energy, np.full((len(offsets_ms), 2), 50.0), clocks)


def test_jittered_peers_share_a_schedule_and_pipeline_stages_do_not():
    from emo.optimize.problem import symmetric_groups

    # tensor-parallel peers: the same work at the same time, each kernel 3 % off
    assert symmetric_groups(_chains([0.0, 0.0, 0.0, 0.0], 0.03)) == [[0, 1, 2, 3]]
    # pipeline stages: the same kernels, one stage's worth of time apart
    assert symmetric_groups(_chains([0.0, 10.0, 20.0], 0.0)) == [[0], [1], [2]]
