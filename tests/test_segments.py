"""Several measured runs in one launch (emo.segments): every rank counts the same markers, so every
rank switches clocks at the same iteration; each segment is warmed up, then measured between
synchronised edges, its policy applied from its first iteration and reset at its end."""

from __future__ import annotations

import json

import pytest

from emo.segments import SegmentWindow


class FakeClocks:
    def __init__(self, log, policy):
        self.log, self.policy = log, policy
        log.append(("apply", policy["label"]))

    def step(self):
        self.log.append(("clock step", self.policy["label"]))

    def close(self):
        self.log.append(("reset", self.policy["label"]))


def test_segments_switch_clocks_at_the_same_markers_and_measure_each(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("EMO_LAUNCH_ID", "L")
    plan = tmp_path / "segments.json"
    plan.write_text(
        json.dumps(
            {
                "segments": [
                    {"warmup": 1, "iterations": 2, "policy": None, "label": None},
                    {"warmup": 0, "iterations": 3, "policy": {"label": 900}, "label": 900},
                ]
            }
        )
    )
    log, energy = [], iter(range(0, 100, 10))
    w = SegmentWindow(
        plan, apply=lambda p: FakeClocks(log, p), energy=lambda: float(next(energy)), sync=lambda: log.append(("sync",))
    )
    markers = 0
    while not w.done:
        markers += 1
        log.append(("marker", markers))
        w.step()
    assert markers == 1 + 2 + 3  # warmup + measured of each segment, after the marker that opened it
    assert log == [
        ("marker", 1),
        ("sync",),  # segment 0 warmed up: measure from here
        ("marker", 2),
        ("marker", 3),
        ("sync",),  # 2 measured iterations
        ("apply", 900),
        ("clock step", 900),
        ("sync",),  # segment 1: no warmup, t = 0 at marker 3
        ("marker", 4),
        ("clock step", 900),
        ("marker", 5),
        ("clock step", 900),
        ("marker", 6),
        ("sync",),
        ("reset", 900),
    ]
    rec = json.loads((tmp_path / "rank001.segments.json").read_text())
    assert rec["rank"] == 1 and rec["launch"] == "L"
    assert [s["iterations"] for s in rec["segments"]] == [2, 3]
    assert [s["energy_j"] for s in rec["segments"]] == [10.0, 10.0]
    assert [s["sm_mhz"] for s in rec["segments"]] == [None, 900]
    assert all(s["time_s"] == pytest.approx(sum(s["iteration_times_s"])) for s in rec["segments"])


def test_no_energy_counter_gives_none_not_a_number(tmp_path):
    plan = tmp_path / "segments.json"
    plan.write_text(json.dumps({"segments": [{"warmup": 0, "iterations": 1, "policy": None}]}))
    w = SegmentWindow(plan, energy=lambda: None, sync=lambda: None)
    w.step()
    assert w.done and w.records[0]["energy_j"] is None
