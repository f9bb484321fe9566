"""A Hydra sweep as one Snakemake DAG: every job's configuration is composed and planned, and the
Snakefile's rules are generic over stage folders (`results/<stage>/{hash}/`), so the jobs' targets
go to one Snakemake run; a stage folder several jobs share is one node of that DAG (same hash, one
job). Independent jobs then run at once: `-j N` on a workstation, one GPU each on a GPU box
(`resources: gpu=...`, the GPU handed over through CUDA_VISIBLE_DEVICES), or a cluster through a
Snakemake executor plugin.

This module is plain data and functions; the Snakefile builds a `Sweep` from its config and looks
up, for a rule's `{hash}` wildcard, the job that planned it (its configuration and upstream folders).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emo import errors
from emo.errors import ConfigError
from emo.workflow.plan import StagePlan, compose, plan


def expand(overrides: list[str], multirun: bool, config_dir: Path | None = None) -> list[list[str]]:
    """The jobs of a run: one without -m; with it, what Hydra's basic sweeper makes of the overrides
    (its grammar: `a,b`, `choice(...)`, `range(start,stop,step)`, `glob(pattern)` over a config
    group): the cartesian product of each key's values, a key given twice taking the last."""
    if not multirun:
        return [list(overrides)]
    from hydra.core.override_parser.types import ValueType

    from emo.workflow.plan import ROOT, _parse

    parsed = _parse(list(overrides))
    if any(
        o.value_type == ValueType.GLOB_CHOICE_SWEEP for o in parsed
    ):  # glob lists a group: Hydra's loader knows them
        parsed = _parse(list(overrides), config_dir=Path(config_dir or ROOT / "conf"))
    choices: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        choices[key] = [f"{key}={v}" for v in _values(o)]
    return [list(combo) for combo in itertools.product(*choices.values())]


def _values(o) -> list[str]:
    """One override's values, as strings the override grammar reads back."""
    if not o.is_sweep_override():
        return [o.get_value_element_as_str()]
    if not o.is_discrete_sweep():
        raise ConfigError(
            f"{o.input_line}: an interval is not a list of values (a sampling sweeper such as "
            "Optuna's draws from it); give them with choice(...) or range(start,stop,step)"
        )
    from hydra.core.override_parser.types import ValueType

    values = list(o.sweep_string_iterator())
    if (
        o.value_type == ValueType.GLOB_CHOICE_SWEEP
    ):  # the typed-config schemas conf/ names in its defaults lists are not choices
        values = [v for v in values if not v.endswith("_schema")]
    if not values:
        raise ConfigError(f"{o.input_line}: matches no value")
    return values


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    cfg: dict = field(repr=False)
    plans: dict[str, StagePlan] = field(repr=False)
    name: str = ""  # what tells it apart from the sweep's other jobs (its MLflow run name)

    @property
    def result(self) -> str:
        return self.plans["validate"].out("result.json")


@dataclass(frozen=True)
class Sweep:
    jobs: tuple[Job, ...]
    results: Path  # the one results folder every job writes into
    by_stage: dict[str, dict[str, Job]]  # stage -> folder hash -> the first job that planned it

    def job(self, stage: str, stage_hash: str) -> Job:
        try:
            return self.by_stage[stage][stage_hash]
        except KeyError:  # Snakemake asked for a folder this sweep no longer plans
            raise ValueError(
                f"{self.results / stage / stage_hash}: no job of this sweep plans that folder "
                "(were the code or conf/ edited while it ran?): run it again"
            ) from None

    def plan(self, stage: str, stage_hash: str) -> StagePlan:
        return self.job(stage, stage_hash).plans[stage]

    def upstream(self, stage: str, stage_hash: str, up: str, name: str) -> str:
        """The path of file `name` of stage `up` that folder `stage`/`stage_hash` is computed from."""
        return self.job(stage, stage_hash).plans[up].out(name)

    def folders(self, stage: str) -> list[str]:
        return sorted(self.by_stage.get(stage, {}))

    @property
    def summary(self) -> Path:
        """The sweep's summary folder (compare table, plots: the report), named by its jobs' results."""
        import hashlib

        key = ",".join(sorted(j.plans["validate"].hash for j in self.jobs))
        return self.results / "summary" / hashlib.sha256(key.encode()).hexdigest()[:12]

    def plots(self, job: Job) -> list[Path]:
        """The summary's plots of one job (energy-time of its GPU x workload, its timeline)."""
        import json

        index = self.summary / "plots.json"
        names = json.loads(index.read_text()).get(job.plans["validate"].hash, []) if index.exists() else []
        return [self.summary / "plots" / n for n in names]


def build(job_overrides: list[list[str]]) -> Sweep:
    """Compose and plan every job; one table of stage folders over all of them (shared ones once)."""
    shared = set.intersection(*(set(o) for o in job_overrides)) if len(job_overrides) > 1 else set()
    built: list[Job] = []
    for o in job_overrides:
        cfg = compose(o)
        built.append(Job(tuple(o), cfg, plan(cfg), " ".join(x for x in o if x not in shared) or "defaults"))
    jobs = tuple(built)
    from emo.sections import TrackingConfig, typed
    from emo.workflow.tracking import check_uri

    for tracking in {
        j.cfg["tracking"]["uri"]: j.cfg["tracking"] for j in jobs if j.cfg["tracking"]["enabled"]
    }.values():
        check_uri(typed(TrackingConfig, tracking))
    roots = {Path(j.cfg["results"]) for j in jobs}
    if len(roots) != 1:
        raise ConfigError(
            f"results: a sweep writes into one results folder, not {len(roots)} ({', '.join(sorted(map(str, roots)))})"
        )
    by_stage: dict[str, dict[str, Job]] = {}
    for j in jobs:
        for stage, p in j.plans.items():
            by_stage.setdefault(stage, {}).setdefault(p.hash, j)
    return Sweep(jobs, roots.pop(), by_stage)


def save_planned(sw: Sweep, path: Path) -> None:
    """The sweep `emo run` composed and planned, for its Snakemake process to take instead of
    composing every job again (seconds per sweep, before any job starts)."""
    import pickle

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # private even if the name existed: only a file we alone wrote is read back
        f.write(pickle.dumps(sw, protocol=pickle.HIGHEST_PROTOCOL))


def from_snakemake_config(config: dict) -> Sweep:
    """The Snakefile's sweep: `jobs: [["budget=0.02"], ["budget=0.05"]]` from a config file or
    `--config` (what `emo run -m` passes in a config file, with `planned: FILE`: the sweep it
    planned, see save_planned), or one job from
    `--config 'overrides=[...]'` (plain `snakemake`), or the defaults."""
    if config.get("jobs"):
        jobs = [[str(o) for o in job] for job in config["jobs"]]
        planned = _load_planned(config.get("planned"))
        if planned is not None and [list(j.overrides) for j in planned.jobs] == jobs:
            return planned
        return build(jobs)
    return build([[str(o) for o in config.get("overrides", [])]])


def _load_planned(path) -> Sweep | None:
    import pickle

    if not path:
        return None
    try:
        data = _private_bytes(Path(path))
        sw = None if data is None else pickle.loads(data)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):  # gone, cut short, older code
        return None
    return sw if isinstance(sw, Sweep) else None


def _private_bytes(path: Path) -> bytes | None:
    """The file's bytes if this user alone could have written them (a regular file it owns, mode
    0600, not a link), else None. Unpickling runs code: a results folder others can write must not
    be able to hand this process a pickle (they can replace the file, not make one owned by us)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        return f.read()


def gpus_needed(cfg: dict) -> int:
    """GPUs one job of this configuration occupies: the workload's ranks on real GPUs; one slot on
    the virtual GPU (it runs on a CPU core, so jobs spread over cores)."""
    if cfg["gpu"]["backend"] == "sim":
        return 1
    from emo.workloads import kind_of

    n = kind_of(cfg["workload"]).gpus(cfg["workload"])  # one rank per GPU: its grid's, a launcher's count
    # no count said: every GPU it sees; at least one, which a scheduler places where none is visible here
    return max(len(visible_gpus()), 1) if n is None else n


def gpus_available(cfg: dict, cores: int) -> int:
    """The `gpu` resource of a run: the visible GPUs of a real backend, one slot per core on the virtual GPU."""
    if cfg["gpu"]["backend"] == "sim":
        return max(cores, 1)
    return len(visible_gpus())


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out: CUDA_VISIBLE_DEVICES (a scheduler sets it on a cluster
    node), else every GPU NVML counts."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [x.strip() for x in env.split(",") if x.strip()]
    try:
        from emo.device.control import open_control

        control = open_control()
        try:
            return [str(i) for i in range(control.count())]
        finally:
            control.close()
    except Exception:  # no driver: no GPU to hand out
        return []


@contextlib.contextmanager
def claim_gpus(
    count: int, lock_dir: Path, available: list[str] | None = None, poll_s: float = 0.2
) -> Iterator[list[str]]:
    """Hold `count` of the visible GPUs for one job (an exclusive lock file per GPU, released on exit
    however the job ends) and export them as CUDA_VISIBLE_DEVICES. Snakemake's `gpu` resource already
    keeps the sum of running jobs' GPUs within what is there, so a claim finds free GPUs at once; the
    locks decide which ones."""
    ids = visible_gpus() if available is None else available
    if count > len(ids):
        raise ValueError(f"gpu: this job needs {count} GPUs but {len(ids)} are visible ({','.join(ids) or 'none'})")
    lock_dir.mkdir(parents=True, exist_ok=True)
    held: list[tuple[str, int]] = []
    try:
        while len(held) < count:
            for gid in ids:
                if len(held) == count or any(g == gid for g, _ in held):
                    continue
                fd = os.open(lock_dir / f"gpu{gid}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append((gid, fd))
                except BlockingIOError:
                    os.close(fd)
            if len(held) < count:
                time.sleep(poll_s)
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(g for g, _ in held)
        try:
            yield [g for g, _ in held]
        finally:
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous
    finally:
        for _, fd in held:
            os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def gpu_for_stage(cfg: dict, gpus: int, results: Path) -> Iterator[list[str]]:
    """What a GPU-touching rule runs inside: its own GPU(s) on a real backend, nothing on the virtual GPU."""
    if gpus <= 0 or cfg["gpu"]["backend"] == "sim":
        yield []
        return
    with claim_gpus(gpus, results / ".gpu-locks") as ids:
        yield ids


# --------------------------------------------------------------------------- when the run ends
def failed_job(job: Job, error: str | None, failed: list[Path] | None) -> bool:
    """Did this run fail for `job`? Any failure counts for every job when the failing folders are
    unknown (`failed` empty or None); else only for jobs computed from one of them. Its result.json,
    if any, is then an earlier run's, and is not shown as this run's."""
    if error is None:
        return False
    if not failed:
        return True
    mine = {p.dir.resolve() for p in job.plans.values()}
    return any(Path(f).resolve() in mine for f in failed)


def unreadable_results(sw: Sweep) -> list[str]:
    """The jobs' result.json files that exist but cannot be read (cut short, edited): their lines."""
    from emo.report.runs import read_result

    bad = []
    for job in sw.jobs:
        if Path(job.result).exists():
            try:
                read_result(job.result)
            except ValueError as e:
                bad.append(str(e))
    return bad


GPU_SHARE_WARN_PCT = (
    20.0  # below it, a predicted saving is mostly the model's guess at GPU work the job barely waits on
)
GPU_CATEGORIES = ("gpu_compute", "memcpy", "communication")  # of the critical path's breakdown (emo.graph.summary)


def gpu_share_note(summary: str | Path | None) -> str:
    """`, the GPU N % of the critical path` from the graph stage's summary.json (nothing when it is
    absent), with a warning when that share is small: a clock schedule then saves on work the job's
    time hardly depends on, which only a measurement can confirm."""
    if summary is None or not Path(summary).is_file():
        return ""
    s = json.loads(Path(summary).read_text())
    total, parts = s.get("critical_path_us") or 0.0, s.get("breakdown_us") or {}
    if total <= 0:
        return ""
    share = 100 * sum(parts.get(k, 0.0) for k in GPU_CATEGORIES) / total
    note = f", the GPU {share:.1f} % of the critical path"
    if share < GPU_SHARE_WARN_PCT:
        top = max(parts, key=lambda k: parts[k]) if parts else "?"
        note += (
            f"; warning: the GPU is a small share, the path is mostly {top}: the saving is the model's alone,"
            " measure it on the GPU before counting on it"
        )
    return note


def result_line(job: Job, failed_with: str | None = None) -> str:
    """One readable line per job: ES, PL, prediction error, where the policy is (or what is missing);
    `failed_with`: this run failed for the job (the error), so no earlier result is printed."""
    from emo.methods import PL_TOLERANCE_PCT
    from emo.report.runs import read_result

    res, policy = Path(job.result), job.plans["optimize"].out("policy.json")
    head = f"emo: {errors.redact(job.name)}: "
    if failed_with is not None:
        return head + "no result: this run failed" + (" (an earlier run's result is not shown)" if res.exists() else "")
    if not res.exists():
        done = [s for s, p in job.plans.items() if (p.dir / "config.json").exists()]
        rest = [s for s in job.plans if s not in done]
        return head + f"no result (stages done: {', '.join(done) or 'none'}; not done: {', '.join(rest)})"
    try:
        r = read_result(res)
    except ValueError as e:
        return "emo: error: " + head.removeprefix("emo: ") + str(e)
    cfg = job.cfg
    what = f"{cfg['optimizer']['name']} on {cfg['gpu']['name']}, budget {100 * cfg['budget']:g} %"
    if "metrics" not in r:  # validate could not measure it (a recorded trace): the prediction stands
        pred = (
            f"predicted ES {r['predicted_es_pct']:.2f} %, PL {r['predicted_pl_pct']:.2f} % (a prediction"
            + gpu_share_note(job.plans["graph"].out("summary.json") if "graph" in job.plans else None)
            + ")"
            if "predicted_es_pct" in r
            else "no prediction"
        )
        where = f"policy {policy}" if Path(policy).exists() else f"result {res}"
        return head + f"{what}: not measured ({r['skipped'].removeprefix('validate: skipped: ')}); {pred}; {where}"
    m = r["metrics"]
    err = ""
    if "time_error_pct" in m:
        err = f", prediction error {m['time_error_pct']:.2f} % time / {m.get('energy_error_pct', float('nan')):.2f} % energy"
    where = (
        f"policy {policy}"
        if r.get("predicted") is not None and Path(policy).exists()
        else f"online {r['method']}, result {res}"
    )
    over = ""
    if m.get("within_budget") == 0 or m["pl_pct"] > 100 * cfg["budget"] + PL_TOLERANCE_PCT:
        over = f" OVER BUDGET (PL {m['pl_pct']:.2f} % > {100 * cfg['budget']:g} % + {PL_TOLERANCE_PCT:g} tolerance)"
    return head + f"{what}: ES {m['es_pct']:.2f} %, PL {m['pl_pct']:.2f} %{over}{err}; {where}"


def finish(
    sw: Sweep,
    name: str | None,
    overrides: Sequence[str] = (),
    *,
    print_results: bool = True,
    error: str | None = None,
    killed: bool = False,
    failed: list[Path] | None = None,
) -> dict[str, str]:
    """The one writer when a Snakemake run ends (emo run, or the Snakefile's onsuccess/onerror for
    plain `snakemake`): log every job to MLflow from its stage folders (a job without its result ends
    FAILED, or KILLED when a signal stopped the run, with `error` as its emo.error tag), then print
    its result line (also when MLflow failed: its error comes after, the results are in their folders).
    `failed`: the stage folders this run failed to make; a job computed from one (every job, when
    they are unknown) shows no result: its result.json is an earlier run's."""
    from emo.workflow import tracking

    stale = {j.name for j in sw.jobs if failed_job(j, error, failed)}
    try:
        return tracking.log_sweep(
            list(sw.jobs),
            name,
            list(overrides),
            plots={j.name: sw.plots(j) for j in sw.jobs},
            error=error,
            killed=killed,
            failed=stale,
        )
    finally:
        if print_results:
            for job in sw.jobs:
                print(result_line(job, error if job.name in stale else None), flush=True)
