"""The graph builder's as-of look-up picks exactly what pd.merge_asof(allow_exact_matches=False) picks."""
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
        want = (pd.merge_asof(left, right, on="t", by=by, direction=direction, allow_exact_matches=False)["r"]
                .fillna(-1).to_numpy(np.int64) if n and m else np.full(n, -1))
        j = _asof([left[k] for k in by], left["t"], [right[k] for k in by], right["t"], direction == "forward")
        got = np.array([right["r"].iat[i] if i >= 0 else -1 for i in j], dtype=np.int64)
        assert (got == want).all()
