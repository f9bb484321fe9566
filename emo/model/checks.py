"""Checks of `emo model fit`'s input tables that physics allows, before anything is fitted.

The model takes any source's long tables (name, sm_mhz, time_s, energy_j or power_w, counters) and
cannot tell a unit slip from a measurement: bench times in ms, or target counters x 1000, fitted
without a word and raised the true energy error tenfold. What can be checked is checked here, each
check's verdict is a line the command prints, and a table that fails one is refused in one line
naming the file (ValueError):

- shape: every CSV row has the header's fields (a file cut short loses its last row's tail, which
  pandas reads as missing values); a (name, clock) measured twice must agree.
- power: power_w, and energy_j / time_s, are a GPU's watts (1 W to 3 kW; mW or kJ are not).
- time vs clock: a benchmark does not get slower as its clock rises (a time column that is a rate,
  or clocks and times swapped).
Whether the two tables' features share their units (a x1000 slip in counters, or times in ms in one
table only) depends on how each feature is read, so emo.model.columns warns about it, feature by
feature (`scale_mismatch`), where the features are known.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

POWER_RANGE_W = (1.0, 3000.0)
KEYS = ("name", "sm_mhz")


def check_fit_inputs(tables: dict[str, pd.DataFrame], paths: dict[str, str | Path]) -> list[str]:
    """`tables`/`paths`: option (--bench, --targets) -> table, file. Returns the verdict lines;
    raises ValueError (`OPTION FILE: problem`) on a table the model must not take."""
    lines = []
    for option, df in tables.items():
        where = f"{option} {paths[option]}"
        _complete_rows(paths[option], where)
        lines += _duplicates(df, where)
        lines += _power(df, where)
    bench = tables.get("--bench")
    if bench is not None:
        lines += _time_vs_clock(bench, f"--bench {paths['--bench']}")
    return lines


def _complete_rows(path: str | Path, where: str) -> None:
    path = Path(path)
    if path.suffix in (".parquet", ".pq"):
        return
    openers: dict[str, Callable[..., IO[str]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
    opener = openers.get(path.suffix, open)  # as pandas reads them
    with opener(path, "rt", newline="", errors="replace") as f:
        rows = csv.reader(f)
        header = next(rows, [])
        for n, row in enumerate(rows, start=2):
            if row and len(row) != len(header):
                raise ValueError(
                    f"{where}: line {n} has {len(row)} fields, the header {len(header)} "
                    "(a file cut short, or a stray separator)"
                )


def _duplicates(df: pd.DataFrame, where: str) -> list[str]:
    if not set(KEYS) <= set(df):
        return []
    dup = df.duplicated(list(KEYS), keep=False)
    if not dup.any():
        return []
    rows = df[dup]
    values = [c for c in df.columns if c not in KEYS]
    for (name, mhz), g in rows.groupby(list(KEYS), sort=False):
        differ = [c for c in values if g[c].astype(str).nunique() > 1]
        if differ:
            c = differ[0]
            raise ValueError(
                f"{where}: {name} at {mhz} MHz is measured {len(g)} times with different {c} "
                f"({', '.join(map(str, g[c].head(3)))}): keep one row per name and clock"
            )
    return [f"check: {where}: {int(dup.sum() - rows.groupby(list(KEYS)).ngroups)} identical duplicate row(s) ignored"]


def _power(df: pd.DataFrame, where: str) -> list[str]:
    lo, hi = POWER_RANGE_W
    out = []
    for label, p in (
        ("power_w", df.get("power_w")),
        ("energy_j / time_s", df["energy_j"] / df["time_s"] if {"energy_j", "time_s"} <= set(df) else None),
    ):
        if p is None:
            continue
        p = pd.to_numeric(p, errors="coerce").to_numpy(float)
        p = p[np.isfinite(p)]
        if not len(p):
            continue
        bad = (p < lo) | (p > hi)
        if bad.mean() > 0.5:  # most rows: a unit, not a noisy row
            raise ValueError(
                f"{where}: {label} is {np.median(p):.4g} W (median), outside a GPU's {lo:g}-{hi:g} W: "
                "wrong unit? (want time_s in seconds, energy_j in joules, power_w in watts)"
            )
        out.append(f"check: {where}: {label} {np.min(p):.3g}-{np.max(p):.3g} W: watts and seconds")
    return out


def _time_vs_clock(df: pd.DataFrame, where: str) -> list[str]:
    if not {"time_s", *KEYS} <= set(df) or df["sm_mhz"].nunique() < 2:
        return []
    slower = total = 0
    for _, g in df.groupby("name"):
        g = g.sort_values("sm_mhz")
        if len(g) < 2 or g["sm_mhz"].iat[0] == g["sm_mhz"].iat[-1]:
            continue
        total += 1
        slower += bool(g["time_s"].iat[-1] > 1.5 * g["time_s"].iat[0])  # 50 % slower at the highest clock
    if total and slower > total / 2:
        raise ValueError(
            f"{where}: {slower} of {total} benchmarks are slower at their highest clock than at their "
            "lowest: is time_s a time (not a rate), and sm_mhz the SM clock?"
        )
    return (
        [f"check: {where}: time_s falls or stays as sm_mhz rises ({total - slower} of {total} benchmarks)"]
        if total
        else []
    )
