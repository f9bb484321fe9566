"""The runtime applier with a fake clock setter: requests lead their steps, follow the iteration
marker, and clocks are reset on exit."""

from __future__ import annotations

import threading
import time

import pytest

from emo.policy import FrequencyPolicy, Issue, Step, issue_plan
from emo.runtime import PolicyApplier


class FakeSetter:
    def __init__(self, fail_on: int | None = None):
        self.calls: list[tuple[float, str, int, int | None]] = []
        self.lock = threading.Lock()
        self.fail_on = fail_on

    def set_clock(self, device, mhz):
        if mhz == self.fail_on:
            raise RuntimeError("refused")
        with self.lock:
            self.calls.append((time.monotonic(), "set", device, mhz))

    def reset_clock(self, device):
        with self.lock:
            self.calls.append((time.monotonic(), "reset", device, None))


def test_issue_plan_leads_and_wraps_t0_to_the_previous_iteration():
    steps = [Step(0, 1410), Step(30, 900), Step(70, 1200)]
    plan = issue_plan(steps, lead_ms=10, period_ms=100)
    assert plan == [Issue(0.020, 900), Issue(0.060, 1200), Issue(0.090, 1410)]
    # without a period, a step due at 0 is issued at the marker
    assert issue_plan(steps, lead_ms=10, period_ms=0) == [Issue(0.0, 1410), Issue(0.020, 900), Issue(0.060, 1200)]
    # a step inside the lead window wraps too; repeated clocks collapse
    assert issue_plan([Step(0, 900), Step(5, 1410), Step(50, 1410)], lead_ms=10, period_ms=100) == [
        Issue(0.090, 900),
        Issue(0.095, 1410),
    ]
    assert issue_plan([], lead_ms=10, period_ms=100) == []


def test_requests_lead_each_step_by_lead_ms():
    period, lead = 0.200, 0.020
    pol = FrequencyPolicy(
        gpu="a100",
        steps={0: [Step(0, 1410), Step(80, 900), Step(150, 1200)], 1: [Step(0, 1000)]},
        period_ms=period * 1000,
        lead_ms=lead * 1000,
    )
    setter = FakeSetter()
    marks = []
    with PolicyApplier(pol, setter, devices={0: 10, 1: 11}) as ap:
        for _ in range(3):
            marks.append(time.monotonic())
            ap.step()
            time.sleep(period)
        assert ap.iterations == 3
    sets = [(t, d, f) for t, kind, d, f in setter.calls if kind == "set"]
    resets = [c for c in setter.calls if c[1] == "reset"]
    # GPU 1 holds one clock: a single request at the first marker, never repeated
    assert [(d, f) for _, d, f in sets if d == 11] == [(11, 1000)]
    g0 = [(t, f) for t, d, f in sets if d == 10]
    assert [f for _, f in g0][:4] == [1410, 900, 1200, 1410]
    assert g0[0][0] - marks[0] < 0.015  # first clock at once
    due = [0.080 - lead, 0.150 - lead, period - lead]  # relative to marks[0]
    for (t, _), d in zip(g0[1:4], due):
        late = (t - marks[0]) - d
        assert -0.002 <= late < 0.030, (d, late)  # never early, issued close to its time
    # iteration 2 repeats the pattern relative to its own marker
    second = [t - marks[1] for t, f in g0[4:6]]
    assert len(second) == 2 and all(abs(a - b) < 0.030 for a, b in zip(second, due[:2]))
    assert sorted(d for _, _, d, _ in resets) == [10, 11]  # reset on exit, after every request
    assert max(t for t, *_ in sets) <= min(t for t, *_ in resets)


def test_an_early_marker_abandons_the_rest_of_the_iteration():
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(100, 900)]}, period_ms=200, lead_ms=0)
    setter = FakeSetter()
    with PolicyApplier(pol, setter) as ap:
        ap.step()
        time.sleep(0.03)
        ap.step()  # the iteration ended early: its 900 MHz step (due at 100 ms) must never come
        time.sleep(0.05)
    assert [f for _, k, _, f in setter.calls if k == "set"] == [1410]


def test_a_marker_with_ready_starts_the_iteration_when_the_gpu_gets_there():
    """step(ready=...) marks t = 0 when `ready` returns (the GPU reached the marker), in order: a loop
    that runs ahead of its GPU queues markers instead of cutting each iteration short."""
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(20, 900)]}, period_ms=40, lead_ms=0)
    setter = FakeSetter()
    gates = [threading.Event() for _ in range(3)]
    with PolicyApplier(pol, setter) as ap:
        for g in gates:  # three markers at once, as a loop running ahead of its GPU gives them
            ap.step(ready=g.wait)
        time.sleep(0.05)
        assert ap.iterations == 0 and not setter.calls  # nothing starts before the GPU does
        opened = []
        for g in gates:
            opened.append(time.monotonic())
            g.set()
            time.sleep(0.1)
        deadline = time.monotonic() + 5
        while ap.iterations < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ap.iterations == 3
        assert all(o <= m < nxt for o, m, nxt in zip(opened, ap.marks, opened[1:] + [time.monotonic()]))
    sets = [f for _, k, _, f in setter.calls if k == "set"]
    assert sets.count(900) == 3  # every iteration got its step: none was cut short by a queued marker


def test_a_marker_that_fails_falls_back_to_the_host_time(capsys):
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410)]}, period_ms=40, lead_ms=0)

    def broken():
        raise RuntimeError("no CUDA context")

    with PolicyApplier(pol, FakeSetter()) as ap:
        ap.step(ready=broken)
        deadline = time.monotonic() + 5
        while ap.iterations < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ap.iterations == 1 and "iteration marker failed (no CUDA context)" in capsys.readouterr().err
    assert ap.errors == [] and len(ap.marker_errors) == 1  # not a clock request's failure


def test_setter_errors_are_kept_not_raised_in_the_loop():
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(10, 900)]}, period_ms=50, lead_ms=0)
    setter = FakeSetter(fail_on=900)
    ap = PolicyApplier(pol, setter)
    ap.step()
    time.sleep(0.05)
    ap.close()
    ap.close()  # idempotent
    assert len(ap.errors) >= 1 and "refused" in str(ap.errors[0])
    assert [c[1] for c in setter.calls].count("reset") == 1
    assert ap.failed >= 1 and ap.landed == 1 and not ap.summary()["applied"]


def test_the_first_failure_is_one_line_at_once_and_close_says_what_landed(capsys):
    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410), Step(5, 900)]}, period_ms=10, lead_ms=0)
    ap = PolicyApplier(pol, FakeSetter(fail_on=900), devices={0: 3})
    for _ in range(5):
        ap.step()
        time.sleep(0.012)
    err = capsys.readouterr().err.splitlines()
    assert err == ["emo: GPU 3: could not lock the SM clock at 900 MHz: refused"]  # said before close, once
    ap.close()
    ap.close()
    s = ap.summary()
    assert s["failed"] >= 2 and s["landed"] >= 2 and not s["applied"]
    assert capsys.readouterr().err.splitlines() == [f"emo: clock requests: {s['landed']} landed, {s['failed']} failed"]


def test_nothing_landed_means_no_savings():
    class Refusing(FakeSetter):
        def set_clock(self, device, mhz):
            raise PermissionError("no permission")

    ap = PolicyApplier(FrequencyPolicy(gpu="a100", steps={0: [Step(0, 900)]}, period_ms=10), Refusing())
    ap.step()
    time.sleep(0.03)
    ap.close()
    assert ap.summary()["applied"] is False and ap.landed == 0
    assert "saved nothing" in ap.summary_line()


def test_strict_turns_a_failure_into_an_error_at_the_next_step_and_at_exit():
    from emo.runtime import ClockRequestFailed

    pol = FrequencyPolicy(gpu="a100", steps={0: [Step(0, 900)]}, period_ms=10)
    setter = FakeSetter(fail_on=900)
    ap = PolicyApplier(pol, setter, strict=True)
    ap.step()
    time.sleep(0.03)
    with pytest.raises(ClockRequestFailed, match="could not lock the SM clock at 900 MHz: refused"):
        ap.step()
    assert [c[1] for c in setter.calls] == ["reset"]  # it reset before raising
    with pytest.raises(ClockRequestFailed):
        with PolicyApplier(pol, FakeSetter(fail_on=900), strict=True) as ap2:
            ap2.step()
            time.sleep(0.03)
    with PolicyApplier(pol, FakeSetter(), strict=True) as ap3:  # nothing failed: nothing raised
        ap3.step()
        time.sleep(0.02)


def test_nvml_applier_restores_on_sigterm_though_threads_set_the_clocks(tmp_path):
    """Clock changes come from background threads; the handlers must still be installed."""
    import json
    import signal
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    log = tmp_path / "calls.jsonl"
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import nvml_fake
        sys.modules["pynvml"] = nvml_fake.FakeNVML(log_path={str(log)!r})
        from emo.policy import FrequencyPolicy, Step
        from emo.device.nvml_control import nvml_applier
        pol = FrequencyPolicy(gpu="a100", steps={{0: [Step(0, 1410), Step(5, 900)]}}, period_ms=50)
        ap = nvml_applier(pol)
        ap.step()
        time.sleep(0.1)
        print("ready", flush=True)
        time.sleep(30)
    """)
    sys.path.insert(0, str(Path(__file__).parent))
    import nvml_fake

    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "", **nvml_fake.owner_env(log)},
    )  # the clock owner's calls go to the same log
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    calls = [tuple(json.loads(l)) for l in log.read_text().splitlines()]
    locks = [c for c in calls if c[0] == "lock"]
    assert locks and locks[0] == ("lock", 0, 1410, 1410)
    assert calls.index(("reset", 0)) > calls.index(locks[0])
    assert p.returncode == -signal.SIGTERM
