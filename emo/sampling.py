"""Planning a job from a sample of its ranks (`trace.ranks`): one trace per equivalence class.

In a TP x PP x DP job (Megatron-LM's order: TP ranks adjacent, then replicas, then stages; rank =
(stage * dp + replica) * tp + TP position) the ranks at one pipeline stage and TP position run the same
program in every data-parallel replica: they meet only in their gradient all-reduces. They are one
*class* (stage, TP position), and a sample that traces one rank of every class holds all the job's
information: its graph is one replica's, its plan one schedule per class, and the policy maps every
rank of the job to its class's schedule (`meta.ranks`). Time and memory grow with the sampled ranks,
not with the replicas.

The assumption, stated in the plan's summary and checked by validate (which measures every rank):
a rank not sampled runs as its class's sampled rank does. In the graph, a collective that reaches
unsampled ranks is joined with the same collective on its members' class representatives (its
process group mapped to theirs); a data-parallel all-reduce, whose members are all one class, keeps
its recorded time: the replicas are taken to arrive together, as the sampled one did.

`trace.ranks`: `all` (every rank: the job planned rank by rank, as before), `replica` (replica 0),
or a list of ranks (`[0,1,8,9]`, or `"0-7,64-71"`) that covers every stage and TP position; a rank
beyond the first of its class is traced but not planned from.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass

from emo.errors import ConfigError

ASSUMPTION = (
    "planned from {n} sampled rank(s) of {world}, one per (pipeline stage, TP position): every other rank "
    "is assumed to run as its class's sampled rank does (same program, same timing; its data-parallel "
    "all-reduces take the time the sampled rank's took) and follows that rank's schedule (policy meta.ranks); "
    "validate measures every rank"
)


@dataclass(frozen=True)
class Sample:
    """Which ranks of a tp x pp x dp job were traced, and the representative of each class."""

    tp: int
    pp: int
    dp: int
    sampled: tuple[int, ...]  # the ranks traced, ascending

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def position(self, r: int) -> tuple[int, int, int]:
        """(stage, replica, TP position) of rank r."""
        return r // (self.tp * self.dp), (r // self.tp) % self.dp, r % self.tp

    def klass(self, r: int) -> int:
        """The class of rank r: stage * tp + TP position."""
        s, _, t = self.position(r)
        return s * self.tp + t

    @property
    def reps(self) -> dict[int, int]:
        """class -> its representative: the lowest sampled rank of the class."""
        out: dict[int, int] = {}
        for r in self.sampled:
            out.setdefault(self.klass(r), r)
        return out

    def rep_of(self, r: int) -> int:
        return self.reps[self.klass(r)]

    def rank_map(self) -> dict[int, int]:
        """Every rank of the job -> its class's representative."""
        reps = self.reps
        return {r: reps[self.klass(r)] for r in range(self.world)}

    def to_dict(self) -> dict:
        reps = sorted(self.reps.values())
        return {
            "grid": {"tp": self.tp, "pp": self.pp, "dp": self.dp},
            "world": self.world,
            "sampled": list(self.sampled),
            "planned_from": reps,
            "classes": len(reps),
            "assumption": ASSUMPTION.format(n=len(reps), world=self.world),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Sample:
        g = d["grid"]
        return cls(int(g["tp"]), int(g["pp"]), int(g["dp"]), tuple(int(r) for r in d["sampled"]))


def parse_ranks(spec, world: int) -> list[int]:
    """A rank list: ints, or a string of ranks and ranges ("0-7,64-71"). One line naming trace.ranks."""
    if isinstance(spec, str):
        out: list[int] = []
        for part in spec.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
            if m is None:
                _bad(f"a list of ranks and ranges like 0-7,64-71 ({part!r} is neither)", spec)
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                _bad(f"a list of ranks and ranges like 0-7,64-71 ({part.strip()} is an empty range)", spec)
            out += range(lo, hi + 1)
    else:
        out = [int(r) for r in spec]
    bad = [r for r in out if not 0 <= r < world]
    if bad:
        _bad(f"ranks of the job (0-{world - 1}; rank {bad[0]} is not one)", spec)
    return sorted(set(out))


def sample_of(workload: dict, spec, grid: tuple[int, int, int] | None) -> Sample | None:
    """The sample `trace.ranks` = `spec` takes of `workload`'s job, whose ranks lie on `grid`
    ((tp, pp, dp): its kind's, emo.workloads.grid_of; None: it declares none). None: every rank, `all`.
    ValueError in one line naming trace.ranks when the workload has no grid or the sample leaves a
    pipeline stage or TP position uncovered."""
    if spec is None or spec == "all":
        return None
    if grid is None:
        _bad(
            f"all for workload={workload.get('kind')} (a sampled trace needs the TP x PP x DP grid of a tp, pp "
            "or hybrid workload to know which ranks are alike)",
            spec,
        )
    assert grid is not None
    tp, pp, dp = grid
    world = tp * pp * dp
    ranks = [(s * dp + 0) * tp + t for s in range(pp) for t in range(tp)] if spec == "replica" else None
    if ranks is None:
        ranks = parse_ranks(spec, world)
    sample = Sample(tp, pp, dp, tuple(ranks))
    have = {sample.klass(r) for r in ranks}
    missing = [c for c in range(tp * pp) if c not in have]
    if missing:
        where = ", ".join(f"stage {c // tp} TP position {c % tp}" for c in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        _bad(
            "a sample covering every pipeline stage and TP position (trace.ranks=replica takes data-parallel "
            f"replica 0); it leaves {where}{more} uncovered (rank {(missing[0] // tp) * tp * dp + missing[0] % tp} "
            "is one of them)",
            spec,
        )
    return sample


def _bad(allowed: str, value) -> typing.NoReturn:
    raise ConfigError(f"bad configuration: trace.ranks must be {allowed} (got {value!r})")


# --------------------------------------------------------------------------- the sampled events
def canonical_events(events, sample: Sample):
    """The event table of the sample's representatives only (one rank per class), each collective
    whose process group reaches a rank that is not a representative mapped onto the representatives
    of its members' classes, so that it joins the same collective on them (the n-th collective of a
    group on each rank is one instance: emo.graph.build). A group that maps onto one class (a
    data-parallel group) is left to that rank: the graph keeps its recorded time. The rank-set
    warning a sample would draw (ranks absent) is replaced by the sample's own statement."""
    import numpy as np
    import pandas as pd

    from emo.trace.schema import text_column

    reps = sample.reps
    keep = events["rank"].isin(list(reps.values())).to_numpy()
    ev = events.loc[keep].reset_index(drop=True)
    pairs = pd.MultiIndex.from_arrays([ev["group_ranks"].astype(str), ev["process_group"].astype(str)])
    codes, uniq = pd.factorize(pairs)
    new_listed, new_names = [], []
    for text, name in uniq:
        if not text:
            new_listed.append(text)
            new_names.append(name)
            continue
        members = [int(r) for r in text.split(",") if r.strip()]
        mapped = sorted({sample.rep_of(m) for m in members if 0 <= m < sample.world})
        if mapped == sorted(members):  # every member is a representative: the group as recorded
            new_listed.append(text)
            new_names.append(name)
            continue
        stem = re.sub(r"[0-9.]+", "", name)  # the group's kind (tp, pp-, mp, dp) without stage or replica
        joined = ",".join(map(str, mapped))
        new_listed.append(joined)
        new_names.append(f"{stem}[{joined}]")
    ev["group_ranks"] = text_column(np.asarray(codes, np.int64), new_listed)
    ev["process_group"] = text_column(np.asarray(codes, np.int64), new_names)
    ev["world_size"] = np.int32(len(reps))
    absent = re.compile(r"\d+ of the run's \d+ ranks are absent from the trace")  # emo.trace.read.rank_set_warnings
    ev.attrs["warnings"] = [w for w in events.attrs.get("warnings", []) if not absent.match(w)]
    return ev


# --------------------------------------------------------------------------- the policy for every rank
def expand_policy(policy, sample: Sample) -> dict:
    """Map every rank of the job to its class's schedule (policy.meta.ranks, in place), keeping one
    schedule per distinct step list, and state the predicted time and energy for the whole job (each
    class's energy times its ranks). Returns what the summary says of the sample."""
    reps = sample.reps
    per_class = sample.world // len(reps)  # every class has dp ranks
    first: dict[tuple, int] = {}
    schedule_of: dict[int, int] = {}
    for rep in sorted(reps.values()):
        steps = tuple(policy.steps.get(rep, ()))
        schedule_of[rep] = first.setdefault(steps, rep)
    policy.steps = {d: s for d, s in policy.steps.items() if d in set(first.values())}
    policy.meta["ranks"] = {str(r): schedule_of[rep] for r, rep in sample.rank_map().items()}
    if policy.predicted_energy_j is not None:
        policy.predicted_energy_j *= per_class
    for key in ("baseline_energy_j",):
        if policy.meta.get(key) is not None:
            policy.meta[key] = float(policy.meta[key]) * per_class
    info = {**sample.to_dict(), "schedules": len(first), "ranks_per_class": per_class}
    policy.meta["sample"] = {k: v for k, v in info.items() if k != "sampled"}
    return info


def class_spread(policy_meta: dict, energy_per_device_j: dict) -> dict | None:
    """Where the assumption is checked: each rank's measured energy against its class's sampled
    rank's (validate, every rank measured). None for a policy planned from every rank."""
    ranks = policy_meta.get("ranks")
    sample = policy_meta.get("sample")
    if not ranks or not sample:
        return None
    s = Sample.from_dict({**sample, "sampled": sample["planned_from"]})
    e = {int(k): float(v) for k, v in energy_per_device_j.items()}
    devs = []
    for r in range(s.world):
        rep = s.rep_of(r)
        if r != rep and r in e and e.get(rep):
            devs.append(100.0 * (e[r] / e[rep] - 1.0))
    if not devs:
        return None
    a = [abs(x) for x in devs]
    return {
        "unsampled_ranks_measured": len(devs),
        "energy_vs_class_rep_max_abs_pct": max(a),
        "energy_vs_class_rep_mean_abs_pct": sum(a) / len(a),
    }
