"""The graph builder's numpy look-ups pick exactly what pandas picks: pd.merge_asof(allow_exact_matches=False),
pd.merge (rows and their order), drop_duplicates."""

import numpy as np
import pandas as pd
import pytest

from emo.graph.build import _asof


@pytest.mark.parametrize("direction", ["backward", "forward"])
def test_asof_matches_pandas_with_ties_and_groups(direction):
    rng = np.random.default_rng(1)
    for _ in range(300):
        n, m, nk = int(rng.integers(0, 30)), int(rng.integers(0, 30)), int(rng.integers(1, 4))
        by = [f"k{i}" for i in range(nk)]
        left = pd.DataFrame({**{k: rng.integers(0, 3, n) for k in by}, "t": rng.integers(0, 15, n)})
        right = pd.DataFrame({**{k: rng.integers(0, 3, m) for k in by}, "t": rng.integers(0, 15, m), "r": np.arange(m)})
        left, right = left.sort_values("t", kind="stable"), right.sort_values("t", kind="stable")
        want = (
            pd.merge_asof(left, right, on="t", by=by, direction=direction, allow_exact_matches=False)["r"]
            .fillna(-1)
            .to_numpy(np.int64)
            if n and m
            else np.full(n, -1)
        )
        j = _asof([left[k] for k in by], left["t"], [right[k] for k in by], right["t"], direction == "forward")
        got = np.array([right["r"].iat[i] if i >= 0 else -1 for i in j], dtype=np.int64)
        assert (got == want).all()


def test_merge_first_of_and_codes_match_pandas():
    """The builder's numpy joins give pd.merge's rows in pd.merge's order, drop_duplicates' rows,
    and one code per distinct key."""
    from emo.graph.tables import codes, first_of, group_numbers, merge

    rng = np.random.default_rng(2)
    for _ in range(300):
        n, m, nk = int(rng.integers(0, 25)), int(rng.integers(0, 25)), int(rng.integers(1, 3))
        on = [f"k{i}" for i in range(nk)]
        left = {**{k: rng.integers(0, 3, n) for k in on}, "a": np.arange(n)}
        right = {**{k: rng.integers(0, 3, m) for k in on}, "b": np.arange(m)}
        want = pd.DataFrame(left).merge(pd.DataFrame(right), on=on)
        got = merge(left, right, on)
        for c in [*on, "a", "b"]:
            assert got[c].tolist() == want[c].tolist()
        if n:
            keys = [left[k] for k in on]
            assert first_of(*keys).tolist() == pd.DataFrame(left)[on].drop_duplicates().index.tolist()
            code = codes(*keys)
            assert pd.Series(code).groupby(pd.DataFrame(left)[on].apply(tuple, axis=1)).nunique().eq(1).all()
            assert len(np.unique(code)) == len(pd.DataFrame(left)[on].drop_duplicates())
            assert group_numbers(*keys).tolist() == pd.DataFrame(left).groupby(on, sort=False).ngroup().tolist()


def _queue_lengths_pandas(df: pd.DataFrame) -> np.ndarray:
    """HTA mode's per-stream queue lengths as pandas computes them (the reference for the numpy one)."""
    from emo.graph.hta import HTA_LAUNCH_CALLS

    launch = df[df["kind"].eq("runtime") & df["name"].isin(HTA_LAUNCH_CALLS) & (df["ic"] > 0)]
    ops = df[df["stream"].ne(-1) & df["correlation"].isin(launch["correlation"])]
    stream_of = dict(zip(ops["correlation"], ops["stream"]))
    a = pd.DataFrame(
        {"index": launch.index, "ts": launch["ts"], "q": 1, "stream": launch["correlation"].map(stream_of)}
    )
    b = pd.DataFrame({"index": ops.index, "ts": ops["ts"], "q": -1, "stream": ops["stream"]})
    m = pd.concat([a, b]).sort_values("ts", kind="stable")
    m["ql"] = m.groupby("stream")["q"].cumsum()
    out = np.full(len(df), np.nan)
    out[m["index"].to_numpy(np.int64)] = m["ql"].to_numpy(np.float64)
    return out


@pytest.mark.parametrize(
    "name",
    [
        "hta_alexnet_a100_2stream_cudasync.json.gz",
        "hta_event_sync_a100_3stream.json.gz",
        "dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz",
    ],
)
def test_hta_queue_lengths_match_pandas(name):
    from real_traces import real

    from emo.graph.hta import _queue_lengths, _rank_frame
    from emo.trace import read_trace

    df = _rank_frame(read_trace(real(name)), 0)
    assert np.array_equal(_queue_lengths(df), _queue_lengths_pandas(df), equal_nan=True)
    df = df.iloc[::-1].reset_index(drop=True)  # ties and streams in another order
    assert np.array_equal(_queue_lengths(df), _queue_lengths_pandas(df), equal_nan=True)
