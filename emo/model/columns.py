"""Which columns of the user's tables are features, how each is normalised, and what looks wrong.

Any numeric column can be a feature (`features="all"`, or a list of names). A column a known
source names (emo.device.features) keeps that source's mapping; any other is a work feature on a
resource of its own, in a form read from its values unless the user says it (`name:form`):
  ratio  every value in [0, 1] (a share of time, a fraction of instructions): x the range's time;
  total  anything else (a count per range): as it is.
Either way the model divides by the benchmarks' highest rate, so a feature becomes "seconds of
that unit's work at the suite's peak rate" (emo.model.features). A feature is static when every
name has one value at all its clocks (static analysis, instruction mixes), per-clock otherwise
(counters measured at each clock); both are read at the reference clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

from emo.device.features import FEATURES, FORMS, Column, Feature, FeatureSet, resolve_columns

COLLINEAR_R = 0.999  # |correlation| over the benchmarks above which two features say the same
SCALE_FACTOR = 10.0  # targets' peak beyond this factor of the benchmarks' (either way): another unit?


def parse_features(spec: str | Sequence[str] | None) -> list[tuple[str, str | None]] | Literal["all"] | None:
    """ "all", None, or [(column, form or None)] from "a,b:total" or a list of such names."""
    if spec is None:
        return None
    if spec == "all":
        return "all"
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for it in items:
        name, _, form = str(it).strip().rpartition(":") if ":" in str(it) else (str(it).strip(), "", "")
        if not name:
            raise ValueError(f"features: {it!r} names no column")
        if form and form not in FORMS:
            raise ValueError(f"features: {it!r}: form {form!r} is not one of {', '.join(FORMS)}")
        out.append((name, form or None))
    return out


def candidate_columns(df: pd.DataFrame, reserved: set[str]) -> list[str]:
    return [c for c in df.columns if c not in reserved and pd.api.types.is_numeric_dtype(df[c])]


def infer_form(values: np.ndarray) -> str:
    """ "ratio" when every finite value lies in [0, 1], else "total"."""
    v = values[np.isfinite(values)]
    return "ratio" if v.size and v.min() >= 0 and v.max() <= 1 else "total"


def choose_features(
    bench: pd.DataFrame, targets: pd.DataFrame, features, counters: str | None, reserved: set[str]
) -> tuple[FeatureSet, list[str]]:
    """The feature set of a fit and notes on how each unknown column was read.

    features None or "all": every numeric column, known names by `counters` (another source's
    columns are then left out, with a note); a list: exactly those columns, each mapped by whichever
    source names it (a `name:form` pins the form). A column no source names is read in the form its
    values show (infer_form)."""
    spec = parse_features(features)
    cand = candidate_columns(bench, reserved)
    if spec is None or spec == "all":
        known, said = resolve_columns(cand, counters)
        wanted: list[tuple[str, str | None]] = [(c, None) for c in known]
    else:
        for name, _ in spec:
            if name not in bench.columns:
                raise ValueError(f"bench: no feature column {name!r} (features: {', '.join(cand) or 'none'})")
            if not pd.api.types.is_numeric_dtype(bench[name]):
                raise ValueError(f"bench: feature column {name!r} is not numeric")
        known, said = resolve_columns([c for c, _ in spec], None)
        wanted = spec
    cols: dict[str, Column] = {}
    extra: dict[str, Feature] = {}
    unknown: list[str] = []
    for name, form in wanted:
        col = known.columns[name]
        if col.feature not in FEATURES:  # no source names it: its values say its form
            vals = np.concatenate(
                [pd.to_numeric(d[name], errors="coerce").to_numpy(float) for d in (bench, targets) if name in d.columns]
            )
            form = form or infer_form(vals)
            extra[name] = Feature(name, "work", name, "a column no known source names")
            unknown.append(f"{name} ({form})")
        cols[name] = col if form is None else Column(col.feature, form, col.scale)
    notes = [n for n in said if "another counter source" in n]
    if unknown:
        notes.append(f"columns no counter source names, each a work feature of its own: {', '.join(unknown)}")
    return FeatureSet(cols, extra), notes


def is_static(df: pd.DataFrame, column: str) -> bool:
    """True when every name has one value of `column` at all its clocks."""
    g = pd.to_numeric(df[column], errors="coerce").groupby(df["name"])
    spread = (g.max() - g.min()).fillna(0.0)
    return bool((spread <= 1e-9 * g.max().abs().fillna(0.0).clip(lower=1e-300)).all())


def peaks(fs: FeatureSet, values: np.ndarray, time_s: np.ndarray | None) -> np.ndarray:
    """[K] what each column is divided by: the highest per-second rate (work) or the highest
    value (presence) over the rows of `values` [N, K], in the column's own unit."""
    t = np.ones(len(values)) if time_s is None else time_s
    out = np.zeros(len(fs))
    for k, name in enumerate(fs):
        col, v = fs.columns[name], values[:, k] * fs.columns[name].scale
        per_s = v / t if col.form == "total" else v  # a ratio or a rate is per second already
        out[k] = float(np.max(per_s)) if len(v) else 0.0
    return out


def normalisation(fs: FeatureSet, bench: pd.DataFrame, values: np.ndarray, time_s: np.ndarray | None) -> dict[str, str]:
    """Per feature, one phrase: what it is, static or per-clock, and what it is divided by."""
    top = peaks(fs, values, time_s)
    out = {}
    for k, name in enumerate(fs):
        col, role = fs.columns[name], fs.feature(name).role
        when = "static" if is_static(bench, name) else "per-clock, read at the reference clock"
        unit = f" x {col.scale:g}" if col.scale != 1 else ""
        if role == "presence":
            how = f"an average{unit}, / the benchmarks' highest ({top[k]:.4g})"
        elif col.form == "total":
            how = f"a total per range{unit}, / the benchmarks' highest rate ({top[k]:.4g} per s)"
        elif time_s is None:  # power-only data: no duration to weigh a share by
            how = f"a {col.form}{unit}, / the benchmarks' highest ({top[k]:.4g})"
        else:
            how = f"a {col.form}{unit} x the range's time, / the benchmarks' highest ({top[k]:.4g})"
        out[name] = f"{fs.feature(name).name} ({role}, {when}): {how}"
    return out


def constant_columns(values: np.ndarray) -> np.ndarray:
    """[K] bool: non-zero and the same for every benchmark (zero columns are noted elsewhere)."""
    top, low = values.max(axis=0), values.min(axis=0)
    return (top > 0) & (top - low <= 1e-9 * np.abs(top))


def collinear_pairs(names: Sequence[str], values: np.ndarray) -> list[tuple[str, str, float]]:
    """(a, b, r) for columns whose values over the benchmarks correlate at |r| >= COLLINEAR_R."""
    v = values - values.mean(axis=0)
    norm = np.linalg.norm(v, axis=0)
    ok = norm > 0
    out = []
    idx = np.nonzero(ok)[0]
    for i_, i in enumerate(idx):
        for j in idx[i_ + 1 :]:
            r = float(v[:, i] @ v[:, j] / (norm[i] * norm[j]))
            if abs(r) >= COLLINEAR_R:
                out.append((names[int(i)], names[j], r))
    return out


def scale_mismatch(fs: FeatureSet, cb, tb, cs, ts) -> list[tuple[str, float, float]]:
    """(column, benchmarks' peak, targets' peak) for a column in another unit in one table: the
    targets beyond SCALE_FACTOR x the benchmarks' peak (rates for totals, so long kernels do not look
    large; the benchmarks are what defines the peak), or below 1/SCALE_FACTOR of it with the values
    a share in one table and beyond one in the other (fraction vs percent). A target that merely uses
    a unit lightly is below the peak too, so lower peaks alone say nothing."""
    pb, ps = peaks(fs, cb, tb), peaks(fs, cs, ts)
    out = []
    for k, name in enumerate(fs):
        if not (pb[k] > 0 and ps[k] > 0):
            continue
        share = (np.nanmax(cb[:, k]) <= 1.0) != (np.nanmax(cs[:, k]) <= 1.0)
        if ps[k] > SCALE_FACTOR * pb[k] or (pb[k] > SCALE_FACTOR * ps[k] and share):
            out.append((name, float(pb[k]), float(ps[k])))
    return out


def feature_warnings(fs: FeatureSet, cb: np.ndarray, tb, cs: np.ndarray, ts) -> list[str]:
    """One line per thing that looks wrong in the feature columns at the reference clock: a column
    the same in every benchmark (it still bounds the mix's total, so it stays), two columns that
    move together over the benchmarks, a column on another scale in the targets."""
    out = []
    names = list(fs)
    const = constant_columns(cb)
    for k in np.nonzero(const)[0]:
        out.append(f"feature {names[k]} is {cb[0, k]:.4g} in every benchmark: it cannot tell them apart")
    keep = [k for k in range(len(names)) if not const[k]]
    for a, b, r in collinear_pairs([names[k] for k in keep], cb[:, keep]):
        out.append(
            f"features {a} and {b} are collinear over the benchmarks (r = {r:.4f}): the fit cannot tell "
            "their work apart"
        )
    for name, pb, ps in scale_mismatch(fs, cb, tb, cs, ts):
        out.append(
            f"feature {name} peaks at {ps:.4g} in the targets but {pb:.4g} in the benchmarks: another "
            "unit or scale in one table? (want the same in both)"
        )
    return out
