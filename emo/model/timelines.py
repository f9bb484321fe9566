"""The clock each GPU runs at under a policy, as the predictor's forward pass reads it: per GPU a
piecewise-constant clock in what-if time (emo.model.predict.clock_timelines states the rules).

Split in two because the optimizer predicts one policy hundreds of times (at every latency of its
quadrature, in every pass of the mark iteration): `issue_plans` reads the policy once (each GPU's
requests relative to its iteration mark, emo.policy.issue_plan), `timelines` lays them on the marks
and latencies of one pass, compiled, for every GPU at once."""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from emo.policy import FrequencyPolicy, issue_plan


@dataclass(frozen=True)
class IssuePlans:
    """Per dense GPU g: `has[g]` whether the policy steps it; `first[g]` / `last[g]` the clock
    column of its first / last step (by t_ms); its requests as CSR (`ptr` [D+1], `at_ns` after the
    iteration mark, `ci` clock column); `first_len_ns`: the warm-up iteration's length when a GPU
    has one mark (the policy's period, else 0)."""

    has: np.ndarray
    first: np.ndarray
    last: np.ndarray
    ptr: np.ndarray
    at_ns: np.ndarray
    ci: np.ndarray
    first_len_ns: float


def issue_plans(t, policy: FrequencyPolicy | None) -> IssuePlans:
    """Each GPU's requests under `policy` (None: none) on the tables `t` (a PackTables)."""
    d, clocks = len(t.device_keys), t.clocks_mhz

    def snap(mhz) -> np.ndarray:  # nearest calibrated clock column (the first of a tie)
        x = np.asarray(mhz, dtype=np.float64).reshape(-1)
        return np.argmin(np.abs(clocks[None, :] - x[:, None]), axis=1).astype(np.int64)

    has, first, last = np.zeros(d, bool), np.zeros(d, np.int64), np.zeros(d, np.int64)
    plans: list[list] = [[] for _ in range(d)]
    if policy is not None and policy.trigger is not None:  # its requests follow the host, not times
        raise ValueError("predict: a host-triggered policy (emo.policy.Trigger) has no timed steps to follow")
    for dev_id, steps in (policy.steps if policy is not None else {}).items():
        if not steps:
            continue
        assert policy is not None  # steps come from a policy
        g = t.policy_device(int(dev_id))
        s = sorted(steps, key=lambda x: x.t_ms)
        has[g] = True
        first[g], last[g] = snap([s[0].sm_mhz, s[-1].sm_mhz])
        plans[g] = issue_plan(s, lead_ms=policy.lead_ms, period_ms=policy.period_ms)
    ptr = np.zeros(d + 1, np.int64)
    ptr[1:] = np.cumsum([len(p) for p in plans])
    flat = [i for p in plans for i in p]
    at_ns = np.array([i.at_s * 1e9 for i in flat], dtype=np.float64)
    ci = snap([i.sm_mhz for i in flat]) if flat else np.zeros(0, np.int64)
    first_len = float(policy.period_ms * 1e6 or 0.0) if policy is not None and policy.steps else 0.0
    return IssuePlans(has, first, last, ptr, at_ns, ci, first_len)


def timelines(
    plans: IssuePlans, iter_start_ns: np.ndarray, up_v: np.ndarray, down_v: np.ndarray, default: int, end_ns: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ptr [D+1], t, ci): per GPU, clock column ci from t on (CSR), for the marks `iter_start_ns`
    [D, K] and the latency of a request to each clock column, up (`up_v`) and down (`down_v`), ms."""
    return _timelines(
        plans.has,
        plans.first,
        plans.last,
        plans.ptr,
        plans.at_ns,
        plans.ci,
        plans.first_len_ns,
        np.ascontiguousarray(iter_start_ns, dtype=np.float64),
        np.ascontiguousarray(up_v, dtype=np.float64),
        np.ascontiguousarray(down_v, dtype=np.float64),
        default,
        float(end_ns),
    )


@numba.njit(cache=True)
def _timelines(has, first, last, pptr, pat, pci, first_len, marks, up_v, down_v, default, end_ns):
    d, k = marks.shape
    cap = d
    for g in range(d):
        cap += (k + 1) * (pptr[g + 1] - pptr[g])
    ptr = np.zeros(d + 1, np.int64)
    ts = np.empty(cap, np.float64)
    cis = np.empty(cap, np.int64)
    n = 0
    for g in range(d):
        ts[n] = -np.inf
        if not has[g] or k == 0:
            cis[n] = last[g] if has[g] else default
            n += 1
        else:
            cis[n] = first[g]
            n += 1
            first_len_g = marks[g, 1] - marks[g, 0] if k > 1 else first_len
            n = _gpu_requests(
                marks[g],
                first_len_g,
                pat[pptr[g] : pptr[g + 1]],
                pci[pptr[g] : pptr[g + 1]],
                first[g],
                up_v,
                down_v,
                end_ns,
                ts,
                cis,
                n,
            )
        ptr[g + 1] = n
    return ptr, ts[:n], cis[:n]


@numba.njit(cache=True)
def _gpu_requests(marks, first_len, pat, pci, first, up_v, down_v, end_ns, ts, cis, n):
    """One GPU's requests from each mark (a warm-up mark first_len before the first), those not
    issued before the next mark (or the end) dropped, each landing its latency later; the last one
    issued wins. Appends (landing, clock) to ts, cis from n; returns the new n."""
    k, m = len(marks), len(pat)
    at = np.empty((k + 1) * m, np.float64)
    ci = np.empty((k + 1) * m, np.int64)
    j = 0
    for i in range(k + 1):
        mark = marks[0] - first_len if i == 0 else marks[i - 1]
        nxt = marks[i] if i < k else end_ns
        for q in range(m):
            x = mark + pat[q]
            if x < nxt:
                at[j] = x
                ci[j] = pci[q]
                j += 1
    o = np.argsort(at[:j], kind="mergesort")  # by issue time, in issue order on a tie
    at, ci = at[:j][o], ci[:j][o]
    land = np.empty(j, np.float64)
    for i in range(j):
        before = first if i == 0 else ci[i - 1]
        land[i] = at[i] + (up_v[ci[i]] if ci[i] > before else down_v[ci[i]]) * 1e6
    later = np.inf
    keep = np.zeros(j, np.bool_)
    for i in range(j - 1, -1, -1):  # kept when every later request lands after it
        keep[i] = land[i] < later
        later = min(later, land[i])
    for i in range(j):
        if keep[i]:
            ts[n] = land[i]
            cis[n] = ci[i]
            n += 1
    return n
