"""The runtime applier: a frequency policy applied inside a training loop on a GPU box.

One background thread per GPU. The training loop calls `applier.step()` at the start of every
iteration (or emo.capture's profiler hook does, on each optimizer step); that marker is the policy's
t = 0. Each thread then issues its clock changes `lead_ms` before they are due, because a clock
request lands milliseconds after it is made (calibrate measures how many). A step due at (or within
lead_ms of) t = 0 belongs to the next iteration: it is issued lead_ms before the iteration is expected to end (t0 + period_ms), so the
new iteration starts at the right clock. If the next marker comes early, the thread drops what is
left of the old iteration and follows the new one.

Clocks are reset when the applier closes, and the reset is always the last request a GPU sees: close()
stops the threads, a request is never begun once closing has started, and a request that was
already in flight (a set-clock call can take seconds) is followed by a reset from its own thread when
it returns after close() gave up waiting for it.

A failed request is said at once: the first one prints one line to stderr (the GPU, the clock, the
cause and what to do, from the setter's error), every one is counted, and close() prints how many
landed and failed, and every other count that is not 0: dropped (the setter was resetting), lost
(someone else reset the GPU), late (landed after the next request was due) and skipped (planned
past an early iteration marker). With strict=True the next step() (and leaving the `with` block) raises
ClockRequestFailed after resetting (a dropped or lost request too), so the job stops with a non-zero status instead of running on at
clocks it never got; summary()["applied"] is False when no request landed, and then no saving may be
claimed. In a forked child (a DataLoader worker) the inherited applier does nothing at all: it has no
threads there, and step() and close() neither set nor reset the parent's GPUs.

What a step means in time (`emo.policy.issue_plan`) is defined once, beside the policy, and shared
with the virtual GPU and the predictor; this module only holds the threads. The NVML applier that
drives real GPUs is emo.device.nvml.nvml_applier.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from emo.errors import DeviceError
from emo.policy import FrequencyPolicy, Issue, Step, issue_plan


def refuse_triggered(policy: FrequencyPolicy, source: str = "policy") -> None:
    """A host-triggered policy (emo.policy.Trigger: steps requested at host scopes, Perseus's) cannot
    be followed by this time-based applier: a one-line ValueError naming `source`, never a silent
    time-based run of its steps."""
    if policy.trigger is not None:
        raise ValueError(
            f"{source}: a host-triggered policy (its steps are requested at the host's "
            f"{'/'.join(policy.trigger.scopes)} scopes"
            f"{', after a device synchronize' if policy.trigger.synchronize else ''}) cannot be applied on real "
            f"GPUs yet: the runtime applier issues steps at times; only the virtual GPU runs it"
        )


def counts_text(s: dict, noun: str = "") -> str:
    """`N landed, M failed` (`N <noun>landed`) and every other count that is not 0, in words (a
    summary() or a rank's report; `emo apply` sums them over ranks)."""
    text = f"{s['landed']} {noun}landed" + (
        f" ({s['late']} late: after the next request was due)" if s.get("late") else ""
    )
    text += f", {s['failed']} failed"
    for key, what in (
        ("dropped", "dropped (the clock owner was resetting)"),
        ("lost", "lost (the GPU was reset by someone else)"),
        ("skipped", "skipped (planned past an early iteration marker)"),
        ("resets_failed", "resets failed (run `emo reset-clocks`)"),
    ):
        if s.get(key):
            text += f", {s[key]} {what}"
    if s["landed"] == 0 and s.get("iterations"):
        text += "; no clock was ever changed, so this run saved nothing"
    return text


class ClockRequestFailed(DeviceError):
    """A clock request failed under strict=True: the job must not run on believing it was applied."""


class RequestDropped(Exception):
    """A request the setter deliberately did not make (its clocks are being reset): counted as dropped."""


class ClockLost(Exception):
    """The GPU's clock was reset or taken by someone else (`emo reset-clocks`, another job that found
    this one's owner stuck): this job no longer holds it. Counted as lost."""


class ClockSetter(Protocol):
    def set_clock(self, device: int, mhz: int) -> None: ...

    def reset_clock(self, device: int) -> None: ...


class _DeviceThread(threading.Thread):
    def __init__(self, applier: PolicyApplier, device: int, target: int, plan: list[Issue], first: int):
        super().__init__(name=f"emo-clock-{device}", daemon=True)
        self.applier, self.device, self.target, self.plan, self.first = applier, device, target, plan, first
        self.current: int | None = None

    def _set(self, mhz: int, until: float = float("inf")) -> None:
        """Request `mhz` now; a request that lands after `until` (when the next one is due) is late."""
        if mhz != self.current:
            if self.applier._issue(self.target, mhz) and self.applier._clock() > until:
                self.applier._count("late")
            self.current = mhz

    def run(self) -> None:
        a = self.applier
        seen = 0
        with a._cond:
            while not a._closed:
                if a._generation == seen:
                    a._cond.wait()
                    continue
                seen, t0 = a._generation, a._t0
                if self.current is None:  # very first marker: the iteration starts now
                    a._cond.release()
                    try:
                        self._set(self.first)
                    finally:
                        a._cond.acquire()
                for i, issue in enumerate(self.plan):
                    deadline = t0 + issue.at_s
                    while not a._closed and a._generation == seen:
                        left = deadline - a._clock()
                        if left <= 0:
                            break
                        a._cond.wait(left)
                    if a._closed:
                        break
                    if a._generation != seen:  # a new iteration began: follow it, counting what it cut off
                        a._count("skipped", len(self.plan) - i)
                        break
                    a._cond.release()  # never hold the lock while NVML/zeusd works
                    try:
                        self._set(issue.sm_mhz, t0 + self._next_at(i))
                    finally:
                        a._cond.acquire()

    def _next_at(self, i: int) -> float:
        """When the request after plan[i] is due, from the marker (the next iteration's first one for the last)."""
        if i + 1 < len(self.plan):
            return self.plan[i + 1].at_s
        period_s = self.applier.policy.period_ms / 1000.0
        return period_s + self.plan[0].at_s if period_s > 0 else float("inf")


class PolicyApplier:
    """Apply `policy` to GPUs through `setter`. `devices` maps the policy's device ids to the setter's
    (default: identity over the policy's devices). Use as a context manager, or call close()."""

    JOIN_S = 5.0  # how long close() waits for a request in flight before resetting anyway

    def __init__(
        self,
        policy: FrequencyPolicy,
        setter: ClockSetter,
        *,
        devices: dict[int, int] | None = None,
        lead_ms: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        strict: bool = False,
    ):
        refuse_triggered(policy)
        self.policy = policy
        self.setter = setter
        self.strict = strict
        self._pid = os.getpid()  # a forked child's copy of this applier does nothing
        # landed: made (late: after the next request was due); failed: refused or unanswered; dropped:
        # not made, the owner was resetting; lost: the GPU was reset or taken by someone else; skipped:
        # planned but cut off by an early iteration marker; resets_failed: a reset refused
        self.landed = self.failed = self.dropped = self.lost = self.late = self.skipped = self.resets_failed = 0
        self._counts = threading.RLock()  # the GPUs' threads count at once (re-entrant: close() may run in a handler)
        self._landed_on: set[int] = set()  # GPUs some request landed on: only their failed resets matter
        self.first_error: str | None = None  # the one line printed for the first failure
        self._said_summary = False
        self.lead_ms = policy.lead_ms if lead_ms is None else float(lead_ms)
        self._clock = clock
        self._cond = threading.Condition()
        self._generation = 0
        self._t0 = 0.0
        self.marks: list[float] = []  # t = 0 of every iteration, on `clock`
        self._pending: list[Callable[[], object]] = []  # markers waiting for the GPU (step(ready=...))
        self.marker_errors: list[BaseException] = []
        self._aligner: threading.Thread | None = None
        self._closed = False
        self.errors: list[BaseException] = []
        self.log: list[tuple[float, int, int]] = []  # (time, setter device, mhz) of every request
        mapping = devices if devices is not None else {d: d for d in policy.steps}
        self._requests = {target: threading.Lock() for target in mapping.values()}  # one request at a time per GPU
        self._threads = []
        for d, target in mapping.items():
            steps = policy.steps.get(d)
            if not steps:
                continue
            if lead_ms is not None:  # the caller's one lead replaces the steps' own
                steps = [Step(s.t_ms, s.sm_mhz) for s in steps]
            plan = issue_plan(steps, lead_ms=self.lead_ms, period_ms=policy.period_ms)
            first = sorted(steps, key=lambda s: s.t_ms)[0].sm_mhz
            self._threads.append(_DeviceThread(self, d, target, plan, first))
        for t in self._threads:
            t.start()

    def _count(self, counter: str, n: int = 1) -> None:
        with self._counts:
            setattr(self, counter, getattr(self, counter) + n)

    def _issue(self, target: int, mhz: int) -> bool:
        """Make one request; whether it landed."""
        if os.getpid() != self._pid:
            return False
        landed = False
        with self._requests[target]:
            if self._closed:  # closing: the reset must stay the last request
                return False
            try:
                self.setter.set_clock(target, mhz)
                self.log.append((self._clock(), target, mhz))
                with self._counts:
                    self.landed += 1
                    self._landed_on.add(target)
                landed = True
            except RequestDropped as e:
                self._fail(e, f"GPU {target}: the SM clock request at {mhz} MHz was dropped", "dropped")
            except ClockLost as e:
                self._fail(e, f"GPU {target}: the SM clock at {mhz} MHz was not set", "lost")
            except BaseException as e:  # keep the training loop alive; said now, counted, raised by step() if strict
                self._fail(e, f"GPU {target}: could not lock the SM clock at {mhz} MHz", "failed")
            if self._closed:  # close() gave up waiting for this request and reset before it landed
                self._reset(target)
        return landed

    def _reset(self, target: int) -> None:
        try:
            self.setter.reset_clock(target)
        except RequestDropped:
            pass
        except ClockLost as e:  # someone else reset it (or holds it now): not ours to reset, but said
            if target in self._landed_on:
                self._fail(e, f"GPU {target}: the SM clock was reset by someone else", "lost")
        except BaseException as e:
            if target in self._landed_on:  # else nothing was changed that a reset must undo
                self._fail(e, f"GPU {target}: could not reset the SM clock", "resets_failed")

    def _fail(self, e: BaseException, what: str, counter: str) -> None:
        with self._counts:
            self.errors.append(e)
            first = self.first_error is None
            if first:  # named before it is counted: a reader that sees the count sees its line
                reason = getattr(e, "reason", None) or str(e) or type(e).__name__
                self.first_error = f"emo: {what}: {reason}"
            setattr(self, counter, getattr(self, counter) + 1)
        if first:
            print(self.first_error, file=sys.stderr, flush=True)

    def summary(self) -> dict:
        """What happened: requests landed (late: after the next one was due), failed, dropped (the
        setter was resetting), lost (someone else reset the GPU), skipped (cut off by an early
        marker), failed resets, iterations, and `applied`: some request landed and none failed, was
        dropped or lost (else report no savings)."""
        return {
            "landed": self.landed,
            "failed": self.failed,
            "dropped": self.dropped,
            "lost": self.lost,
            "late": self.late,
            "skipped": self.skipped,
            "resets_failed": self.resets_failed,
            "iterations": self._generation,
            "applied": self.landed > 0 and not (self.failed or self.dropped or self.lost),
            "first_error": self.first_error,
        }

    def summary_line(self) -> str:
        return "emo: clock requests: " + counts_text(self.summary())

    def _raise_if_failed(self) -> None:
        if self.strict and (self.failed or self.resets_failed or self.dropped or self.lost):
            assert self.first_error is not None  # _fail counts a failure and names the first one
            raise ClockRequestFailed(
                f"{self.first_error.removeprefix('emo: ')} (strict: stopping; "
                f"{self.summary_line().removeprefix('emo: ')})"
            )

    def step(self, ready: Callable[[], object] | None = None) -> None:
        """Mark the start of an iteration (the policy's t = 0). strict: a failed request raises here.

        `ready`: a call that returns once the GPU has reached this point of the stream (a CUDA event's
        synchronize); t = 0 is then when it returned, not when step() was called. A loop runs ahead of
        its GPU by whatever it queued since its last host sync. Markers given
        a `ready` are taken in order by one thread that waits for each in turn."""
        if os.getpid() != self._pid:
            return
        if self.strict and (self.failed or self.dropped or self.lost):
            self.close()
            self._raise_if_failed()
        if ready is None:
            self._mark()
            return
        with self._cond:
            if self._aligner is None:
                self._aligner = threading.Thread(target=self._align, name="emo-clock-marker", daemon=True)
                self._aligner.start()
            self._pending.append(ready)
            self._cond.notify_all()

    def _mark(self) -> None:
        with self._cond:
            self._t0 = self._clock()
            self.marks.append(self._t0)
            self._generation += 1
            self._cond.notify_all()

    def _align(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                ready = self._pending.pop(0)
            try:
                ready()  # outside the lock: it blocks until the GPU gets there
            except Exception as e:  # a broken marker must not stop the loop: take the host's time
                self.marker_errors.append(e)  # not a clock request's failure: kept apart from `errors`
                if len(self.marker_errors) == 1:
                    print(f"emo: iteration marker failed ({e}): timing from the host's marker", file=sys.stderr)
            self._mark()

    @property
    def iterations(self) -> int:
        return self._generation

    def close(self) -> None:
        """Reset every GPU's clocks, the last request each sees (safe from any thread, from a signal
        handler, and more than once). The threads are not joined: a handler may run while this
        thread holds the condition they wait on. They stop at their next wake-up, and none starts a
        request once closing began (the per-GPU request lock and the closed flag see to that).
        Prints the summary line once. In a forked child it does nothing."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + self.JOIN_S
        for target, lock in self._requests.items():
            if not any(t.target == target for t in self._threads):
                continue
            got = lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
            try:
                self._reset(target)  # not got: the request in flight resets again when it returns
            finally:
                if got:
                    lock.release()
        if not self._said_summary and self._threads:
            self._said_summary = True
            print(self.summary_line(), file=sys.stderr, flush=True)

    def __enter__(self) -> PolicyApplier:
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close()
        if kind is None:
            self._raise_if_failed()
