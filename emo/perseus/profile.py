"""Perseus's stage profile: one CSV row per (stage, instruction, frequency) with the instruction's
time (s) and energy (J) at that SM clock, as Perseus's instruction profiler writes it
(merak/scripts/generate_profile_csv.py in ml-energy/zeus, branch kronos) and its planner reads it
(lowtime/scripts/perseus.py). Read into plain arrays; anything the planner could not use is one
line naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

KINDS = ("forward", "backward")  # index 0 and 1 of the kind axis
COLUMNS = ("stage", "instruction", "frequency", "time", "energy")


@dataclass(frozen=True)
class Profile:
    name: str  # the file, for messages
    clocks_mhz: np.ndarray  # int64[C], ascending
    time_s: np.ndarray  # float64[S, 2, C]: stage × (forward, backward) × clock
    energy_j: np.ndarray  # float64[S, 2, C]: the instruction's whole energy (blocking power included)

    @property
    def stages(self) -> int:
        return self.time_s.shape[0]


def read_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        df = pd.read_csv(path)
    except Exception as e:  # malformed CSV: say which file
        raise ValueError(f"{path}: cannot read it as CSV ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return parse_profile(df, str(path))


def parse_profile(df: pd.DataFrame, name: str) -> Profile:
    """A Profile from the table; every (stage, instruction) must have every clock once."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{name}: not a Perseus stage profile: no column {', '.join(missing)} (has {list(df.columns)})"
        )
    if df.empty:
        raise ValueError(f"{name}: no rows")
    bad_kind = sorted(set(df["instruction"].astype(str)) - set(KINDS))
    if bad_kind:
        raise ValueError(f"{name}: instruction must be forward or backward (got {bad_kind[:3]})")
    num = df[["stage", "frequency", "time", "energy"]].apply(pd.to_numeric, errors="coerce")
    for col in num.columns:
        bad = ~np.isfinite(num[col].to_numpy(float))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}: row {row + 2}: {col} is not a finite number ({df[col].iloc[row]!r})")
    if (num["time"] <= 0).any() or (num["energy"] < 0).any():
        row = int(np.flatnonzero((num["time"] <= 0) | (num["energy"] < 0))[0])
        raise ValueError(f"{name}: row {row + 2}: time must be > 0 and energy >= 0")
    stage = num["stage"].to_numpy(float)
    S = int(stage.max()) + 1
    if (stage != np.round(stage)).any() or stage.min() < 0 or set(stage.astype(int)) != set(range(S)):
        raise ValueError(f"{name}: stages must be 0..{S - 1}, each present (got {sorted(set(stage.tolist()))[:10]})")
    freq = num["frequency"].to_numpy(float)
    clocks = np.unique(freq).astype(np.int64)
    kind = df["instruction"].astype(str).map({k: i for i, k in enumerate(KINDS)}).to_numpy()
    key = (stage.astype(np.int64) * 2 + kind) * len(clocks) + np.searchsorted(clocks, freq.astype(np.int64))
    counts = np.bincount(key, minlength=S * 2 * len(clocks))
    if counts.max() > 1 or counts.min() == 0:
        i = int(np.flatnonzero(counts != 1)[0])
        s, k, c = i // (2 * len(clocks)), (i // len(clocks)) % 2, i % len(clocks)
        what = "twice" if counts[i] > 1 else "missing"
        raise ValueError(f"{name}: stage {s} {KINDS[k]} at {clocks[c]} MHz is {what} (need every clock once)")
    t = np.empty(S * 2 * len(clocks))
    e = np.empty_like(t)
    t[key] = num["time"].to_numpy(float)
    e[key] = num["energy"].to_numpy(float)
    shape = (S, 2, len(clocks))
    return Profile(name, clocks, t.reshape(shape), e.reshape(shape))
