"""How a comparison is scored: pure functions over measured ES/PL, shared by `emo compare` and
`benchmarks/paper_tables.py` so both apply one rule.

- Every cell is measured over several seeds (`gpu.seed`: the device's noise, so the trace, the
  profile and every measurement differ); a method's score is the mean and the spread (sample
  standard deviation) of its ES and PL over them.
- Within budget: mean PL <= budget + TOLERANCE_PCT.
- A method is ahead of another when both are within budget and its mean ES exceeds the other's by
  more than their combined spread (the sum of the two standard deviations).
- The static curve: validate measures the energy and time of a set of static clocks (optimizer=static,
  `validate.pareto_points`). Static's entry in a table is the best *measured* clock within budget, and
  a method's margin over the curve is its ES minus the curve's ES at the method's own measured PL
  (the energy that slack saved, not a slower clock), per seed, then mean and spread. The curve is
  the measured clocks' monotone fit (`frontier`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from emo.methods import PL_TOLERANCE_PCT as TOLERANCE_PCT
from emo.methods import lead as lead_method


@dataclass(frozen=True)
class Score:
    es: float  # mean ES %
    es_sd: float
    pl: float  # mean PL %
    pl_sd: float
    n: int  # seeds

    def within(self, budget_pct: float) -> bool:
        return self.pl <= budget_pct + TOLERANCE_PCT

    def text(self, budget_pct: float | None = None) -> str:
        """`ES±sd/PL±sd` (`ES/PL` from one seed), one decimal; `!` when over the budget given."""
        flag = "!" if budget_pct is not None and not self.within(budget_pct) else ""
        if self.n == 1:
            return f"{self.es:.1f}/{self.pl:.1f}{flag}"
        return f"{self.es:.1f}±{self.es_sd:.1f}/{self.pl:.1f}±{self.pl_sd:.1f}{flag}"


def spread(values) -> float:
    """Sample standard deviation (0 for a single value)."""
    v = np.asarray(list(values), dtype=float)
    return float(v.std(ddof=1)) if v.size > 1 else 0.0


def score(es: list[float], pl: list[float]) -> Score:
    if not es or len(es) != len(pl):
        raise ValueError(f"score: want as many ES as PL values, at least one (got {len(es)} and {len(pl)})")
    return Score(float(np.mean(es)), spread(es), float(np.mean(pl)), spread(pl), len(es))


def relative_curve(curve: pd.DataFrame, t_ori_s: float, e_ori_j: float) -> pd.DataFrame:
    """A measured static curve (sm_mhz, time_s, energy_j) as PL/ES % against the max-clock baseline it
    was measured with."""
    return pd.DataFrame(
        {
            "sm_mhz": curve["sm_mhz"].to_numpy(),
            "pl_pct": 100.0 * (curve["time_s"].to_numpy() / t_ori_s - 1.0),
            "es_pct": 100.0 * (1.0 - curve["energy_j"].to_numpy() / e_ori_j),
        }
    )


def static_points(curve: pd.DataFrame, metrics: dict) -> pd.DataFrame:
    """Every clock one static validate run measured, as PL/ES %: its curve (against the baseline it
    was measured with) and static's own policy, a measured clock too."""
    own = pd.DataFrame([{"sm_mhz": -1, "pl_pct": metrics["pl_pct"], "es_pct": metrics["es_pct"]}])
    return pd.concat([relative_curve(curve, metrics["t_ori_s"], metrics["e_ori_j"]), own], ignore_index=True)


def frontier(curve: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The static curve as increasing (pl, es) knots: the measured clocks' monotone fit (isotonic
    regression of ES on PL, the max clock at PL 0 / ES 0 included, equal PLs pooled), the ES a
    static clock gives in expectation at each PL. Not the points' upper envelope: a running maximum
    keeps the points that noise lifted, so a clock re-measured in its own run scores below the
    curve it lies on (paper_tables prints that check: `the bar`)."""
    pts = pd.DataFrame(
        {
            "pl": np.concatenate([[0.0], curve["pl_pct"].to_numpy(float)]),
            "es": np.concatenate([[0.0], curve["es_pct"].to_numpy(float)]),
        }
    )
    knots = pts.groupby("pl", sort=True)["es"].agg(["mean", "size"])
    fit = isotonic_regression(knots["mean"].to_numpy(), weights=knots["size"].to_numpy(float)).x
    return knots.index.to_numpy(float), fit


def static_es_at(curve: pd.DataFrame, pl_pct: float) -> float:
    """The static curve's ES at a measured PL, linear between its knots (flat past either end)."""
    pl, es = frontier(curve)
    return float(np.interp(pl_pct, pl, es))


def best_static(curve: pd.DataFrame, budget_pct: float) -> tuple[float, float, int]:
    """The best measured static clock within budget: (ES %, PL %, MHz); the max clock when none is."""
    ok = curve[curve["pl_pct"] <= budget_pct + TOLERANCE_PCT]
    if ok.empty:
        return 0.0, 0.0, -1
    best = ok.loc[ok["es_pct"].idxmax()]
    return float(best["es_pct"]), float(best["pl_pct"]), int(best["sm_mhz"])


def margins(points: list[tuple[float, float]], curves: list[pd.DataFrame]) -> Score:
    """A method's margin over the static curve per seed ((ES, PL) beside that seed's curve): ES minus
    the curve's ES at the same PL. The result's `pl` is the method's mean PL."""
    if len(points) != len(curves) or not points:
        raise ValueError(f"margins: want one static curve per seed (got {len(points)} points, {len(curves)} curves)")
    d = [es - static_es_at(c, pl) for (es, pl), c in zip(points, curves)]
    return score(d, [pl for _, pl in points])


def above(margin: Score) -> bool:
    """Above the static curve by more than the margin's spread."""
    return margin.es > 0 and margin.es > margin.es_sd


def below(margin: Score) -> bool:
    return margin.es < 0 and -margin.es > margin.es_sd


def ahead(scores: dict[str, Score], budget_pct: float, lead: str | None = None) -> tuple[bool, str]:
    """Is `lead` (the registry's lead method by default: emo.methods.lead) ahead of every other method
    within budget by more than their combined spread? And why not, in a few words."""
    lead = lead or lead_method()
    me = scores.get(lead)
    if me is None:
        return False, f"{lead} not measured"
    if not me.within(budget_pct):
        return False, f"{lead} PL {me.pl:.2f} % over budget"
    not_beaten = [
        m for m, s in scores.items() if m != lead and s.within(budget_pct) and me.es - s.es <= me.es_sd + s.es_sd
    ]
    return (not not_beaten), ("" if not not_beaten else "not beyond the spread of " + ", ".join(not_beaten))
