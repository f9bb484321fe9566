"""Several measured runs in one launch of the user's program (in-program side): the segments of
EMO_SEGMENTS (a JSON file the parent wrote, emo.device.launcher.run_segments), each `warmup`
iterations then `iterations` measured ones under its own policy (none: default clocks; a static
clock or a schedule, applied on this rank's GPU by emo.loop.apply). Time and energy are read after a
GPU synchronise at each measured segment's edges, as the trace window reads them. Each rank writes
`emo-capture/rank<r>.segments.json` beside the segments file when the last segment ends.

Every rank counts the same markers, so every rank switches clocks at the same iteration; nothing is
exchanged between ranks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class SegmentWindow:
    starts_at_marker = False  # opened at a marker: the first segment's first iteration starts there
    e0: float | None  # the rank's energy counter (J) when the segment's measured iterations began

    def __init__(
        self,
        plan_file: str | Path,
        *,
        apply: Callable | None = None,
        energy: Any = None,
        sync: Callable[[], None] | None = None,
    ):
        from emo.loop import rank_env

        plan = json.loads(Path(plan_file).read_text())
        self.segments: list[dict] = plan["segments"]
        self.out = Path(plan_file).parent
        self.rank, self.local_rank, self.world = rank_env()
        self._apply = apply or _apply_policy
        self._energy = energy if energy is not None else _rank_energy(self.local_rank)
        self._sync = sync or _cuda_sync
        self.records: list[dict] = []
        self.i = self.k = 0
        self.clocks = None
        self.done = not self.segments
        if not self.done:
            self._begin()

    def _begin(self) -> None:
        seg = self.segments[self.i]
        self.k, self.marks, self.e0 = 0, list[float](), None
        self.clocks = self._apply(seg["policy"]) if seg.get("policy") else None
        if self.clocks is not None:
            self.clocks.step()  # this marker starts the segment's first iteration: the policy's t = 0
        if seg["warmup"] == 0:
            self._open()

    def _open(self) -> None:
        self._sync()
        self.e0, self.marks = self._energy(), [time.perf_counter()]

    def _close_segment(self) -> None:
        self._sync()
        e1 = self._energy()
        times = [b - a for a, b in zip(self.marks, self.marks[1:])]
        self.records.append(
            {
                "iterations": len(times),
                "time_s": sum(times),
                "iteration_times_s": times,
                "energy_j": None if e1 is None or self.e0 is None else e1 - self.e0,
                "sm_mhz": self.segments[self.i].get("label"),
            }
        )
        if self.clocks is not None:
            self.clocks.close()  # resets this GPU's clock before the next segment sets its own
            self.clocks = None

    def step(self) -> None:
        if self.done:
            return
        self.k += 1
        seg = self.segments[self.i]
        if self.k == seg["warmup"]:
            self._open()
        elif self.k > seg["warmup"]:
            self.marks.append(time.perf_counter())
        if self.k < seg["warmup"] + seg["iterations"]:
            if self.clocks is not None:
                self.clocks.step()
            return
        self._close_segment()
        self.i += 1
        if self.i == len(self.segments):
            self.done = True
            self._write()
        else:
            self._begin()

    def _write(self) -> None:
        rec = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world,
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            "launch": os.environ.get("EMO_LAUNCH_ID"),
            "segments": self.records,
        }
        path = self.out / f"rank{self.rank:03d}.segments.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        os.replace(tmp, path)

    def close(self) -> None:
        if self.clocks is not None:
            self.clocks.close()
            self.clocks = None


def _apply_policy(policy: dict):
    from emo import loop
    from emo.policy import FrequencyPolicy

    clocks = loop.apply(FrequencyPolicy.from_dict(policy), strict=True)  # a measured run must run at its clocks
    clocks.injected = True  # it follows the segments' markers: its step() must not mark another iteration
    return clocks


def _rank_energy(local_rank: int) -> Callable[[], float | None]:
    from emo.device.control import RankEnergy

    return RankEnergy(local_rank).read_j


def _cuda_sync() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
