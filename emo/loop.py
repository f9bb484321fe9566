"""The training-loop API (docs/design.md §9, in the spirit of Zeus's monitor):

    with emo.apply("policy.json") as clocks:
        for batch in data:
            clocks.step()          # once per iteration, at its start: the policy's t = 0
            ...

    with emo.measure() as window:  # the NVML energy counter over a window; no policy needed
        ...
    print(window.result.energy_j)

Ranks come from the launcher's RANK / LOCAL_RANK (torchrun, deepspeed, accelerate, SLURM through
torchrun): rank r applies the policy's schedule for device r on its own GPU (LOCAL_RANK among the
visible ones); a policy may map several ranks to one schedule with meta["ranks"] = {rank: device}
(the ranks of one TP group or pipeline stage). A rank the policy does not cover is an error.
Clock control is the GPU control backend's runtime applier (emo.device.control; on NVIDIA GPUs NVML
as root, else zeusd).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emo.policy import FrequencyPolicy
from emo.runtime import refuse_triggered

_ACTIVE: Clocks | None = None
LOG_ENV = "EMO_LOG_DIR"  # where a rank's failure writes its traceback (default: the temporary folder)


def _one_line(fn):
    """An EMO failure raised to the program marks itself: if nothing catches it, the process prints
    one line (`emo: error: rank R: problem (traceback: LOG)`) instead of the chained tracebacks, and
    exits with status 1 as for any uncaught exception, which the launcher reports. A program that
    catches it gets the exception as raised."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            e.emo_failure = True
            if not isinstance(sys.excepthook, _OneLineHook):
                sys.excepthook = _OneLineHook(sys.excepthook)
            raise

    return wrapper


class _OneLineHook:
    """sys.excepthook for EMO's failures; anything else goes to the hook it replaced (torch's, Python's)."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, kind, value, tb) -> None:
        if not getattr(value, "emo_failure", False):
            return self.previous(kind, value, tb)
        import tempfile
        import traceback

        from emo.errors import one_line

        rank = os.environ.get("RANK")
        folder = Path(os.environ.get(LOG_ENV) or tempfile.gettempdir())
        log = folder / f"emo-{'rank' + rank if rank is not None else 'error'}-{os.getpid()}.log"
        try:
            log.write_text("".join(traceback.format_exception(kind, value, tb)))
            where = f"traceback: {log}"
        except OSError as e:
            where = f"no traceback written: {log}: {e.strerror}"
        who = f"rank {rank}: " if rank is not None else ""
        line = f"emo: error: {who}{one_line(value)} ({where})\n".encode()
        try:  # one write: the ranks share the launcher's stderr, and a line must not be split by another's
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), line)
        except (OSError, ValueError):  # no file descriptor (a captured stderr)
            sys.stderr.write(line.decode())
            sys.stderr.flush()


def rank_env() -> tuple[int, int, int]:
    """(RANK, LOCAL_RANK, WORLD_SIZE) as the launcher set them; (0, 0, 1) for a plain process."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", env.get("RANK", 0))), int(env.get("WORLD_SIZE", 1))


def rank_gpu(visible: list[int], local: int) -> int:
    """This rank's GPU (NVML index): visible[LOCAL_RANK], or the one GPU a rank bound to its own GPU
    sees (SLURM's --gpu-bind, a CUDA_VISIBLE_DEVICES per task), whatever its LOCAL_RANK."""
    from emo.device.control import GpuAccessError

    if len(visible) == 1:
        return visible[0]
    if not 0 <= local < len(visible):
        raise GpuAccessError(
            f"LOCAL_RANK={local} but this process sees {len(visible)} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return visible[local]


def policy_device(policy: FrequencyPolicy, rank: int, source: str = "policy") -> int:
    """The policy's device whose schedule `rank` follows: meta["ranks"][rank] if the policy maps ranks,
    else the rank itself. A rank it does not cover is an error, never silence."""
    ranks = {int(k): int(v) for k, v in (policy.meta.get("ranks") or {}).items()}
    device = ranks.get(rank, rank if not ranks else None)
    if device is None or device not in policy.steps:
        covered = sorted(ranks) if ranks else sorted(policy.steps)
        raise ValueError(
            f"{source}: no schedule for rank {rank} (it covers rank(s) {_span(covered)}; "
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE', 1)}): optimize a policy for this job's ranks, "
            "or map ranks to schedules in its meta.ranks"
        )
    return device


def _span(xs: list[int]) -> str:
    if xs and xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2:
        return f"{xs[0]}-{xs[-1]}"
    return ", ".join(map(str, xs)) or "none"


class Clocks:
    """A policy applied to this rank's GPU (device: the policy's schedule it follows; None: a process
    without a launcher applying every schedule, one per GPU). `step()` once per iteration, at its start."""

    starts_at_marker = True  # armed by emo.capture at a marker: that marker starts its first iteration

    def __init__(
        self,
        applier: Any,
        *,
        rank: int,
        device: int | None,
        source: str,
        report_dir: str | None = None,
        injected: bool = False,
    ):
        self.applier, self.rank, self.device, self.source = applier, rank, device, source
        self.report_dir, self.injected, self.closed = report_dir, injected, False

    @_one_line
    def step(self) -> None:
        """Mark the start of an iteration (every rank marks its own)."""
        self.applier.step()
        if not self.injected and "emo.capture" in sys.modules:  # windows `emo trace` injected follow it
            sys.modules["emo.capture"].step()

    @property
    def iterations(self) -> int:
        return self.applier.iterations

    @property
    def landed(self) -> int:
        return self.applier.landed

    @property
    def failed(self) -> int:
        return self.applier.failed

    @_one_line
    def close(self) -> None:
        """Reset the GPU's clocks (the applier's last request) and, under `emo apply`, report."""
        global _ACTIVE
        if self.closed:
            return
        self.closed = True
        self.applier.close()
        if _ACTIVE is self:
            _ACTIVE = None
        if self.report_dir:
            write_report(Path(self.report_dir), self)

    def __enter__(self) -> Clocks:
        return self

    @_one_line
    def __exit__(self, kind, value, tb) -> None:
        self.close()
        self.applier.__exit__(kind, value, tb)  # strict: a failed request raises here, as the applier's own block does


def write_report(folder: Path, clocks: Clocks) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rec = {
        **clocks.applier.summary(),
        "rank": clocks.rank,
        "device": clocks.device,
        "errors": [str(e) for e in clocks.applier.errors[:5]],
    }
    tmp = folder / f"rank{clocks.rank:05d}.json.tmp"
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, tmp.with_suffix(""))


def active() -> Clocks | None:
    """The Clocks this process applies now, if any."""
    return _ACTIVE


@_one_line
def apply(
    policy: str | os.PathLike | FrequencyPolicy, *, report_dir: str | None = None, **applier_options: Any
) -> Clocks:
    """Apply a frequency policy (a policy.json path or a FrequencyPolicy) to this rank's GPU until
    close() / the end of the `with` block. Extra keyword arguments go to the backend's runtime applier
    (GpuControl.policy_applier, e.g. lead_ms)."""
    global _ACTIVE
    from emo.device.control import GpuAccessError, open_control

    source = "policy" if isinstance(policy, FrequencyPolicy) else str(policy)
    if not isinstance(policy, FrequencyPolicy):
        if not Path(policy).is_file():
            raise FileNotFoundError(f"{policy}: no such policy file")
        policy = FrequencyPolicy.load(Path(policy))
    refuse_triggered(policy, source)
    if _ACTIVE is not None:
        raise ValueError(f"emo.apply({source}): {_ACTIVE.source} is already applied in this process; close it first")
    rank, local, ranks = rank_env()
    launched = "RANK" in os.environ or "LOCAL_RANK" in os.environ
    control = open_control()
    visible = control.visible()
    where = f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
    if not launched and len(policy.steps) > 1 and not policy.meta.get("ranks"):
        # one process driving several GPUs (no launcher): schedule d on visible GPU d
        if max(policy.steps) >= len(visible):
            raise GpuAccessError(
                f"{source}: schedules for GPUs {sorted(policy.steps)} but this process sees {len(visible)} {where}"
            )
        device, devices = None, {d: visible[d] for d in policy.steps}
    else:
        if launched:  # every rank fails on the first rank the policy misses, before any collective hangs
            for r in range(ranks):
                policy_device(policy, r, source)
        device = policy_device(policy, rank, source)
        devices = {device: rank_gpu(visible, local)}
    world = int(os.environ["WORLD_SIZE"]) if launched and "WORLD_SIZE" in os.environ else None
    check_fit(policy, source, control, sorted(set(devices.values())), world_size=world)
    applier = control.policy_applier(policy, devices=devices, **applier_options)
    _ACTIVE = Clocks(applier, rank=rank, device=device, source=source, report_dir=report_dir)
    return _ACTIVE


def check_fit(
    policy: FrequencyPolicy, source: str, control: Any, gpus: list[int], *, world_size: int | None = None
) -> None:
    """emo.policy.check_policy against each of `gpus` (NVML indices: its model and supported
    clocks, read from the control) before any clock is changed: one line naming `source`."""
    from emo.policy import check_policy

    for g in gpus:
        check_policy(
            policy,
            f"{source} (GPU {g})",
            gpu_key=str(control.describe(g).get("name", "")),
            clocks=control.supported_clocks(g),
            world_size=world_size,
        )
    if not gpus:
        check_policy(policy, source, world_size=world_size)


def preflight(policy: Path) -> None:
    """Before the job starts (`emo apply`, `emo trace --policy`, in the parent): one line for what
    would fail in every rank: no file, not a policy, no GPU, a policy made for another GPU model or
    naming clocks it does not support."""
    from emo.device import gpu_locks
    from emo.device.control import open_control
    from emo.policy import FrequencyPolicy
    from emo.runtime import refuse_triggered

    if not policy.is_file():
        raise FileNotFoundError(f"{policy}: no such policy file")
    loaded = FrequencyPolicy.load(policy)
    refuse_triggered(loaded, str(policy))
    control = open_control()  # GpuAccessError: e.g. "cannot initialise NVML (...): no NVIDIA driver or GPU"
    try:  # every GPU the job may use: its model and supported clocks (ranks are checked in each rank)
        visible = control.visible()
        check_fit(loaded, str(policy), control, visible)
        for line in gpu_locks.recover(control.reset_sm_clock, visible):  # a dead job's locks: reset, said
            print(f"emo: {line}", file=sys.stderr)
        for rec in gpu_locks.held_by_others(visible):  # each rank refuses its own GPU if it is one of these
            print(f"emo: warning: {gpu_locks.Held(rec)}: a rank given this GPU stops at its start", file=sys.stderr)
    finally:
        control.close()


def recover_left() -> list[str]:
    """After the job (`emo apply`, in the parent): reset what its ranks' clock owners could not (the
    job's processes all killed at once, an owner stopped), from their lock records
    (emo.device.gpu_locks); one line per GPU."""
    from emo.device import gpu_locks
    from emo.device.control import open_control

    if not gpu_locks.records():
        return []
    control = open_control()
    try:
        return gpu_locks.recover(control.reset_sm_clock, control.visible())
    finally:
        control.close()


@dataclass
class Energy:
    """What a window measured: wall seconds and joules, in total and per GPU (NVML index)."""

    time_s: float
    energy_j: float
    per_gpu_j: dict[int, float] = field(default_factory=dict)


class EnergyWindow:
    """Time and NVML energy between begin() and end() (or over a `with` block: `.result`)."""

    def __init__(self, gpus: list[int] | None = None, sync: bool = True):
        from emo.device.control import open_control

        self.control = open_control()
        if gpus is None and "LOCAL_RANK" in os.environ:  # a rank measures its own GPU
            gpus = [rank_gpu(self.control.visible(), rank_env()[1])]
        self.gpus = self.control.visible() if gpus is None else list(gpus)
        self.read_j()  # a GPU it cannot read is said now, not at end()
        self.sync = sync
        self.result: Energy | None = None
        self._t0: float | None = None
        self._e0: dict[int, float] = {}

    def read_j(self) -> dict[int, float]:
        return {g: self.control.energy_j(g) for g in self.gpus}

    def _synchronize(self) -> None:
        torch = sys.modules.get("torch")  # only if the program uses torch: never imported here
        if self.sync and torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()

    @_one_line
    def begin(self) -> None:
        self._synchronize()
        self._e0, self._t0 = self.read_j(), time.perf_counter()

    @_one_line
    def end(self) -> Energy:
        if self._t0 is None:
            raise ValueError("emo.measure: end() before begin()")
        self._synchronize()
        t1, e1 = time.perf_counter(), self.read_j()
        per = {i: e1[i] - self._e0[i] for i in e1}
        self.result = Energy(time_s=t1 - self._t0, energy_j=sum(per.values()), per_gpu_j=per)
        self._t0 = None
        return self.result

    def __enter__(self) -> EnergyWindow:
        self.begin()
        return self

    def __exit__(self, *exc) -> None:
        self.end()


@_one_line
def measure(gpus: list[int] | None = None, *, sync: bool = True) -> EnergyWindow:
    """An energy window over `gpus` (NVML indices; default: this rank's GPU under a launcher, else
    every visible GPU). The GPU is synchronised at both edges when the program uses CUDA torch."""
    return EnergyWindow(gpus, sync=sync)
