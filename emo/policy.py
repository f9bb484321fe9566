"""Frequency policies: per GPU, SM-clock steps relative to the start of an iteration (docs/design.md §9).

A policy is plain JSON so that the runtime applier on a GPU box and the virtual GPU read the same file;
what a step means in time (`issue_plan`: when its clock request is made) is defined here once and used
alike by the virtual GPU, the predictor and the applier on hardware.

A policy with a `trigger` (`Trigger`) is host-triggered instead, as Perseus's controller runs: its
steps are not issued at times but when the host enters a named scope; in each iteration the i-th
step of a GPU's list (in t_ms order, which then only documents the planned time) is requested when
that rank's host enters its i-th scope named in `trigger.scopes`, after a device synchronize when
`trigger.synchronize` is set. A request repeating the clock last requested changes nothing. The
virtual GPU runs such policies; the time-based runtime applier refuses them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from emo.errors import InputError


@dataclass(frozen=True)
class Step:
    t_ms: float  # when the clock should be in effect, relative to the iteration start
    sm_mhz: int
    lead_ms: float | None = None  # this step's request is issued this early; None: the policy's lead_ms

    def to_dict(self) -> dict:
        d: dict = {"t_ms": self.t_ms, "sm_mhz": self.sm_mhz}
        if self.lead_ms is not None:  # a policy with one lead for every step is written as before
            d["lead_ms"] = self.lead_ms
        return d


@dataclass(frozen=True)
class Trigger:
    """When a host-triggered policy's steps are requested: at the host's entries into these scopes."""

    scopes: tuple[str, ...]  # names of host scopes (BEGIN ops / user annotations), e.g. "forward_step"
    synchronize: bool = False  # the host synchronizes the device (torch.cuda.synchronize) before each request

    def __post_init__(self) -> None:
        if isinstance(self.scopes, str) or not self.scopes or not all(isinstance(x, str) and x for x in self.scopes):
            raise InputError(f"trigger.scopes: a non-empty list of scope names, got {self.scopes!r}")
        object.__setattr__(self, "scopes", tuple(self.scopes))

    def to_dict(self) -> dict:
        return {"scopes": list(self.scopes), "synchronize": bool(self.synchronize)}

    @classmethod
    def from_dict(cls, d: dict) -> Trigger:
        unknown = set(d) - {"scopes", "synchronize"}
        if unknown:
            raise InputError(f"trigger: unknown keys {sorted(unknown)}")
        return cls(tuple(d["scopes"]), bool(d.get("synchronize", False)))


@dataclass
class FrequencyPolicy:
    """Clock schedule of one iteration, per device index; repeated every iteration."""

    gpu: str  # GPU model, e.g. "a100"
    steps: dict[int, list[Step]]  # device -> steps sorted by t_ms; the first step usually at t_ms=0
    period_ms: float = 0.0  # baseline iteration time the steps were planned on
    budget: float = 0.0  # allowed slowdown as a fraction of the max-clock iteration time
    lead_ms: float = 0.0  # requests are issued this early so the clock lands on time
    predicted_time_s: float | None = None
    predicted_energy_j: float | None = None
    meta: dict = field(default_factory=dict)
    trigger: Trigger | None = None  # None: time-based steps; else issued at host scope entries (Trigger)

    @classmethod
    def static(cls, gpu: str, devices: int | list[int], sm_mhz: int, **kw) -> FrequencyPolicy:
        ids = range(devices) if isinstance(devices, int) else devices
        return cls(gpu=gpu, steps={d: [Step(0.0, int(sm_mhz))] for d in ids}, **kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["steps"] = {str(k): [s.to_dict() for s in v] for k, v in self.steps.items()}
        if self.trigger is None:
            del d["trigger"]  # a time-based policy's file is as before
        else:
            d["trigger"] = self.trigger.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> FrequencyPolicy:
        d = dict(d)
        d["steps"] = {
            _device(k, "steps"): sorted(
                (
                    Step(
                        _finite(s["t_ms"], f"steps.{k}.t_ms"),
                        _mhz(s["sm_mhz"], f"steps.{k}.sm_mhz"),
                        None if s.get("lead_ms") is None else _finite(s["lead_ms"], f"steps.{k}.lead_ms", low=0.0),
                    )
                    for s in _list(v, f"steps.{k}")
                ),
                key=lambda s: s.t_ms,
            )
            for k, v in _mapping(d["steps"], "steps").items()
        }  # the sort is stable: a triggered policy's steps with equal t_ms keep their order
        for key in ("period_ms", "budget", "lead_ms"):
            if key in d:
                d[key] = _finite(d[key], key, low=0.0)
        d["meta"] = _mapping(d.get("meta") or {}, "meta")
        if d["meta"].get("ranks") is not None:
            ranks = _mapping(d["meta"]["ranks"], "meta.ranks")
            d["meta"]["ranks"] = {
                str(_device(r, "meta.ranks")): _device(v, f"meta.ranks.{r}") for r, v in ranks.items()
            }
            missing = sorted({v for v in d["meta"]["ranks"].values()} - set(d["steps"]))
            if missing:
                raise InputError(f"meta.ranks maps ranks to device {missing[0]}, which has no schedule in steps")
        trig = d.get("trigger")
        d["trigger"] = None if trig is None else Trigger.from_dict(trig)
        return cls(**d)

    def save(self, path: str | Path) -> None:
        from emo.io import write_json

        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> FrequencyPolicy:
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{path}: not a frequency policy ({e})") from e


def _mapping(v, where: str) -> dict:
    if not isinstance(v, dict):
        raise InputError(f"{where}: an object, got {type(v).__name__}")
    return v


def _list(v, where: str) -> list:
    if not isinstance(v, list):
        raise InputError(f"{where}: a list of steps, got {type(v).__name__}")
    return v


def _finite(v, where: str, low: float | None = None) -> float:
    """A JSON number that is one (not true/false, not Infinity or NaN, which Python's json reads)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InputError(f"{where}: a finite number, got {v!r}")
    if low is not None and v < low:
        raise InputError(f"{where}: at least {low:g}, got {v!r}")
    return float(v)


def _mhz(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v) or v <= 0:
        raise InputError(f"{where}: a positive whole number of MHz, got {v!r}")
    return int(v)


def _device(v, where: str) -> int:
    """A device or rank id: a non-negative integer, or its decimal string (JSON keys are strings)."""
    text = str(v) if not isinstance(v, bool) else ""
    if not text.isdigit() or isinstance(v, float):
        raise InputError(f"{where}: a device or rank id is a non-negative integer, got {v!r}")
    return int(text)


def check_clock(mhz: int, clocks: list[int], where: str) -> None:
    """One clock request against the clocks its GPU supports (the clock owner checks every request)."""
    if clocks and mhz not in clocks:
        raise InputError(
            f"{where}: {mhz} MHz is not a clock this GPU supports ({min(clocks)}-{max(clocks)} MHz, "
            f"{len(clocks)} steps; `emo gpu-config` lists them)"
        )


def model_matches(policy_gpu: str, gpu_key: str) -> bool:
    """Whether a policy made for `policy_gpu` ("a100", "rtx3080ti") fits a GPU whose model key is
    `gpu_key` ("a100_sxm4_40gb", "rtx3080_ti"): the key's first words, joined by "_" or nothing
    ("a10" is not "a100_sxm4")."""
    p, words = policy_gpu.lower(), gpu_key.lower().split("_")
    heads = {sep.join(words[:n]) for n in range(1, len(words) + 1) for sep in ("_", "")}
    return p in heads or p in ("auto", "")


def check_policy(
    policy: FrequencyPolicy,
    source: str,
    *,
    gpu_key: str | None = None,
    clocks: list[int] | None = None,
    world_size: int | None = None,
) -> None:
    """Before any clock is changed: the policy fits this GPU model, every clock it names is one the
    GPU supports, and (under a launcher) it covers exactly the job's ranks. One-line ValueError
    naming `source`; nothing checked here needs a GPU (the caller reads the model and clocks)."""
    if not policy.steps or not any(policy.steps.values()):
        raise InputError(f"{source}: no clock steps for any device")
    if gpu_key is not None and not model_matches(policy.gpu, gpu_key):
        raise InputError(f"{source}: made for GPU model {policy.gpu!r}, this GPU is {gpu_key!r}: optimize one for it")
    for d, steps in sorted(policy.steps.items()):
        for s in steps:
            check_clock(s.sm_mhz, clocks or [], f"{source}: device {d} at t={s.t_ms:g} ms")
    if world_size is not None:
        ranks = policy.meta.get("ranks")
        covered = sorted(int(r) for r in ranks) if ranks else sorted(policy.steps)
        if covered != list(range(world_size)):
            raise InputError(
                f"{source}: covers rank(s) {_span(covered)} but this job has WORLD_SIZE={world_size}: "
                "optimize a policy for this job's ranks, or map its ranks in meta.ranks"
            )


def _span(xs: list[int]) -> str:
    if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}-{xs[-1]}"
    return ", ".join(map(str, xs)) or "none"


@dataclass(frozen=True)
class Issue:
    at_s: float  # seconds after the iteration marker
    sm_mhz: int


def issue_plan(steps: list[Step], *, lead_ms: float, period_ms: float) -> list[Issue]:
    """When, relative to an iteration marker, each clock request is made: t_ms minus the step's own
    lead_ms, or `lead_ms` for a step without one.

    A step whose issue time (t_ms - lead_ms) is before the marker is issued at the end of the
    iteration instead (period_ms - lead_ms ahead), for the next one; without a period it is issued
    at the marker itself. A step that repeats the previous step's clock is dropped.
    """
    if not steps:
        return []
    kept: list[Step] = []
    for s in sorted(steps, key=lambda s: s.t_ms):  # a step repeating the clock before it is a no-op
        if not kept or kept[-1].sm_mhz != s.sm_mhz:
            kept.append(s)
    out = []
    for s in kept:
        at = s.t_ms - (lead_ms if s.lead_ms is None else s.lead_ms)
        if at < 0:
            at = at + period_ms if period_ms > 0 else 0.0
        out.append(Issue(max(at, 0.0) / 1000.0, int(s.sm_mhz)))
    return sorted(out, key=lambda i: i.at_s)


def policy_device_ids(device_keys: list[tuple[int, int]]) -> list[int]:
    """The policy's device id of each GPU (dense index order, keys (rank, device)): the rank when ranks
    tell GPUs apart (one GPU per rank, as under torchrun), else the device index (one rank driving
    several GPUs). The one rule the optimizer, the predictor and the appliers share."""
    ranks = [k[0] for k in device_keys]
    return ranks if len(set(ranks)) == len(ranks) else [k[1] for k in device_keys]


def dense_index(device_keys: list[tuple[int, int]], device_id: int) -> int:
    """The dense GPU index of a policy's device id (policy_device_ids' inverse)."""
    ids = policy_device_ids(device_keys)
    if device_id in ids:
        return ids.index(device_id)
    raise InputError(f"policy names device {device_id}, the graph has GPUs {device_keys}")
