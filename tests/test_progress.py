import logging

from emo.progress import progress, track


def test_progress_logs_each_tenth_with_an_eta(caplog):
    with caplog.at_level(logging.INFO, logger="emo"):
        with progress(20, "calibrate") as p:
            for _ in range(20):
                p.update()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("calibrate:")]
    assert len(lines) == 10
    assert lines[0].startswith("calibrate: 2/20") and lines[-1].startswith("calibrate: 20/20")


def test_track_yields_every_item_in_order(caplog):
    with caplog.at_level(logging.INFO, logger="emo"):
        assert list(track(range(5), "packs")) == [0, 1, 2, 3, 4]
    assert any(r.getMessage().startswith("packs: 5/5") for r in caplog.records)
