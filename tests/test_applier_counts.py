"""Counts that cannot lie (issue 48 item 2, issue 44 item 7): every request the applier did not make
as planned is counted and printed beside landed/failed, and under strict a dropped or lost clock ends
the job. With a fake clock setter; the clock owner's side is in tests/test_gpu_locks.py."""

from __future__ import annotations

import time

import pytest

from emo.policy import FrequencyPolicy, Step
from emo.runtime import ClockLost, ClockRequestFailed, PolicyApplier, RequestDropped


class Setter:
    """Lands every request after `delay_s`; from request number `bad_from` on raises `bad`."""

    def __init__(self, delay_s: float = 0.0, bad: type[Exception] | None = None, bad_from: int = 0):
        self.delay_s, self.bad, self.bad_from, self.n = delay_s, bad, bad_from, 0

    def set_clock(self, device, mhz):
        self.n += 1
        if self.bad is not None and self.n > self.bad_from:
            raise self.bad("the clock owner got a signal and reset the clocks")
        time.sleep(self.delay_s)

    def reset_clock(self, device):
        pass


def _policy(period_ms: float = 60.0) -> FrequencyPolicy:
    return FrequencyPolicy(
        gpu="a100", steps={0: [Step(0, 1410), Step(20, 900), Step(40, 705)]}, period_ms=period_ms, lead_ms=0
    )


def _wait(pred, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_steps_cut_off_by_an_early_marker_are_counted_and_said(capsys):
    """Issue 44 item 7: markers every 10 ms under a 60 ms plan cut off 2 of its 3 requests each time."""
    ap = PolicyApplier(_policy(), Setter())
    for _ in range(5):
        ap.step()
        time.sleep(0.010)
    ap.close()
    s = ap.summary()
    assert s["skipped"] >= 8 and s["landed"] >= 1, s
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{s['skipped']} skipped (planned past an early iteration marker)" in line, line


def test_requests_that_land_after_the_next_was_due_are_late():
    """Issue 48 item 6: a setter (zeusd) slower than the schedule: every request lands, all late."""
    ap = PolicyApplier(_policy(period_ms=30.0), Setter(delay_s=0.05))
    ap.step()
    _wait(lambda: ap.landed >= 3)
    ap.close()
    s = ap.summary()
    assert s["late"] >= 2 and s["landed"] >= 3, s
    assert f"({s['late']} late: after the next request was due)" in ap.summary_line()


@pytest.mark.parametrize("kind, counter", [(RequestDropped, "dropped"), (ClockLost, "lost")])
def test_dropped_and_lost_requests_are_counted_said_and_not_applied(capsys, kind, counter):
    ap = PolicyApplier(_policy(), Setter(bad=kind, bad_from=1))
    ap.step()
    _wait(lambda: getattr(ap, counter) >= 1)
    ap.close()
    s = ap.summary()
    assert s[counter] >= 1 and s["landed"] == 1 and not s["applied"], s
    err = capsys.readouterr().err
    assert f"{s[counter]} {counter} (" in err.splitlines()[-1], err
    assert err.startswith("emo: GPU 0: ") and "reset the clocks" in err.splitlines()[0]


@pytest.mark.parametrize("kind", [RequestDropped, ClockLost])
def test_under_strict_a_dropped_or_lost_clock_ends_the_job(kind):
    ap = PolicyApplier(_policy(), Setter(bad=kind, bad_from=1), strict=True)
    with pytest.raises(ClockRequestFailed, match="strict: stopping"):
        with ap:
            ap.step()
            _wait(lambda: ap.dropped + ap.lost >= 1)
            ap.step()


def test_emo_apply_sums_every_count_and_fails_on_dropped_or_lost():
    from emo.cli import apply as apply_cli

    base = {"rank": 0, "device": 0, "landed": 210, "failed": 0, "iterations": 30}
    lines = apply_cli.summary([{**base, "dropped": 90}, {**base, "rank": 1, "late": 4, "skipped": 7}])
    assert lines[-1] == (
        "2 rank(s): 420 clock requests landed (4 late: after the next request was due), 0 failed, "
        "90 dropped (the clock owner was resetting), 7 skipped (planned past an early iteration marker)"
    )


@pytest.mark.parametrize("counter, status", [("dropped", 1), ("lost", 1), ("late", 0), ("skipped", 0)])
def test_emo_apply_exits_1_when_a_rank_dropped_or_lost_clocks(tmp_path, monkeypatch, capsys, counter, status):
    """A job whose rank reports `counter` (written as the injected applier writes it at exit)."""
    import json
    import sys

    from emo.cli import main

    monkeypatch.setenv("EMO_FAKE_GPU", "1")
    monkeypatch.setenv("EMO_GPU_LOCK_DIR", str(tmp_path / "locks"))
    policy = tmp_path / "policy.json"
    FrequencyPolicy(gpu="a100", steps={0: [Step(0, 1410)]}).save(policy)
    rec = {"rank": 0, "device": 0, "landed": 210, "failed": 0, "iterations": 30, counter: 90, "errors": []}
    job = f"import json, os; open(os.environ['EMO_APPLY_REPORT'] + '/rank00000.json', 'w').write({json.dumps(rec)!r})"
    assert main(["apply", "--policy", str(policy), "--", sys.executable, "-c", job]) == status
    assert f"90 {counter}" in capsys.readouterr().err
