"""Predicting Perseus's measured plans (the SOSP'24 artifact's real Merak runs) with EMO's time and
energy model and EMO's timing engine.

A model folder in Perseus's layout holds, per frequency plan N, `N.sched.json` (per rank, the SM
clock of each Merak command: `power_states`) and `N.prof.json` (per rank, `iter_time` and
`iter_energy` per iteration, and `time_breakdown`: the wall time of each load, forward and
backward, each between two `torch.cuda.synchronize()`), plain or gzipped; the folder's name gives
dp, pp, tp, the microbatch size and count (`...+dp1+pp4+tp1+mbs8+nmb32+...`).

The model, fitted on some plans (the fit plans) and used on the others:

* each rank's forward and backward time at a clock, t(f) = a + b * fmax / min(f, cap), non-negative
  least squares on the fit plans' `time_breakdown` (a clock above `cap` runs no faster, as on a
  power-capped GPU);
* the iteration: Merak's 1F1B order on each stage (emo.perseus.merak), the pipeline's data
  dependencies (emo.baselines.perseus_schedule.dag_edges), Merak's blocking P2P (a send returns
  when the peer's receive does: the sender's next instruction waits for the receiver to reach
  it), each stage's measured load time before a forward, and two constants fitted on the fit
  plans' iteration times: a transfer lag per cross-stage edge and the tail (gradient reduction,
  optimizer step); the timeline is EMO's engine (emo.graph.whatif.forward);
* each rank's energy per iteration, a linear model on that timeline fitted by non-negative least
  squares on the fit plans' per-rank energies: static power over the iteration, compute power
  (forward and backward alike) as c1 * x + c3 * x**3 of the effective clock (x = min(f, cap) /
  fmax), and a waiting GPU's power as w1 * x + w3 * x**3 of the clock it was left at (Perseus's
  server gives a command between two compute instructions the clock of the one before it). One
  compute curve for both kinds: the plans move a stage's forward and backward clocks mostly
  together, so separate curves fit as well but split the power between them arbitrarily
  (docs/perseus-measured.md).

Pure functions over plain data; reading a folder is the only I/O (one-line errors naming the file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from scipy.optimize import nnls

from emo.baselines.perseus_schedule import Schedule, dag_edges, stage_of
from emo.graph import whatif as engine
from emo.perseus.merak import BACKWARD, FORWARD, instruction_order, pipe_schedule
from emo.trace.kineto import read_bytes

KINDS = (FORWARD, BACKWARD)
LAYOUT_KEYS = ("dp", "pp", "tp", "mbs", "nmb")
_KEY = re.compile(r"^(dp|pp|tp|mbs|nmb)(\d+)$")
_FILE = re.compile(r"^(\d+)\.(sched|prof)\.json(\.gz)?$")
LAGS_S = (0.0, 0.001, 0.002, 0.005, 0.01)  # cross-stage transfer lags tried in the fit
CAP_STEP_MHZ = 5.0
ENERGY_FEATURES = ("static", "compute x", "compute x^3", "waiting x", "waiting x^3")  # see energy_features


# --------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Layout:
    model: str
    dp: int
    pp: int
    tp: int
    mbs: int
    nmb: int

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def stages(self) -> list[int]:
        """Each rank's pipeline stage (Merak's grid: pipe outermost, as Perseus's client reports it)."""
        m = stage_of(list(range(self.world)), self.pp)
        return [m[r] for r in range(self.world)]


@dataclass
class Plan:
    """One measured plan. Per rank: the clock (MHz) of each compute instruction in Merak's order
    (instruction_order), its measured time (s, mean over the measured iterations), the mean load
    time per forward (s) and the energy per iteration (J, median); the iteration time (s, median of
    each rank's, mean over ranks). The first iteration (warm-up) is never used."""

    index: int
    clocks: list[np.ndarray]
    compute_s: list[np.ndarray]
    load_s: np.ndarray
    energy_j: np.ndarray
    time_s: float


def parse_layout(folder: str | Path) -> Layout:
    folder = Path(folder)
    parts = folder.name.split("+")
    found: dict[str, int] = {}
    for p in parts:
        m = _KEY.match(p)
        if m:
            found[m.group(1)] = int(m.group(2))
    missing = [k for k in LAYOUT_KEYS if k not in found]
    if missing:
        raise ValueError(
            f"{folder}: the folder's name gives no {', '.join(missing)} "
            "(Perseus's layout: <framework>+<model>+<partition>+dpN+ppN+tpN+mbsN+nmbN+<scheduler>)"
        )
    zero = [k for k in LAYOUT_KEYS if found[k] < 1]
    if zero:
        raise ValueError(f"{folder}: the folder's name gives {', '.join(zero)} as 0")
    return Layout(parts[1] if len(parts) > 2 else parts[0], *(found[k] for k in LAYOUT_KEYS))


def plan_files(folder: str | Path) -> dict[int, tuple[Path, Path]]:
    """Plan index -> (sched, prof) file; plain or gzipped, one of each per plan."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    seen: dict[tuple[int, str], Path] = {}
    for p in sorted(folder.iterdir()):
        m = _FILE.match(p.name)
        if not m:
            continue
        key = (int(m.group(1)), m.group(2))
        if key in seen:
            raise ValueError(f"{p}: plan {key[0]}'s {key[1]} file is there twice ({seen[key].name} and {p.name})")
        seen[key] = p
    plans: dict[int, tuple[Path, Path]] = {}
    for i in sorted({k[0] for k in seen}):
        for other, have in (("prof", "sched"), ("sched", "prof")):
            if (i, other) not in seen:
                raise ValueError(f"{seen[(i, have)]}: no {i}.{other}.json(.gz) beside it")
        plans[i] = (seen[(i, "sched")], seen[(i, "prof")])
    if not plans:
        raise ValueError(f"{folder}: no N.sched.json / N.prof.json plans (plain or .gz)")
    return plans


def _load(path: Path) -> object:
    raw = read_bytes(path)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{path}: truncated or malformed JSON ({e})") from None


def _per_rank(doc: object, path: Path, world: int, fields: tuple[str, ...]) -> dict[int, dict]:
    if not isinstance(doc, list):
        raise ValueError(f"{path}: expected a list with one object per rank")
    out: dict[int, dict] = {}
    for e in doc:
        if not isinstance(e, dict) or not isinstance(e.get("rank"), int):
            raise ValueError(f"{path}: an entry without an integer 'rank'")
        r = e["rank"]
        if not 0 <= r < world:
            raise ValueError(f"{path}: rank {r} outside 0..{world - 1} (the folder's name gives {world} ranks)")
        if r in out:
            raise ValueError(f"{path}: rank {r} is there twice")
        for f in fields:
            if f not in e:
                raise ValueError(f"{path}: rank {r} has no '{f}'")
        out[r] = e
    if len(out) != world:
        raise ValueError(f"{path}: {len(out)} ranks, the folder's name gives {world}")
    return out


def _numbers(v: object, path: Path, what: str, n: int | None = None, at_least: int = 1) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        a = np.empty(0)
    if a.ndim != 1 or not np.isfinite(a).all() or (n is not None and len(a) != n) or len(a) < at_least:
        want = f"{n}" if n is not None else f"at least {at_least}"
        raise ValueError(f"{path}: {what} is not a list of {want} finite numbers")
    return a


def read_plan(index: int, sched: Path, prof: Path, layout: Layout) -> Plan:
    """One plan from its two files, checked against the layout (one line naming the file if not)."""
    st = layout.stages()
    s = _per_rank(_load(sched), sched, layout.world, ("power_states",))
    p = _per_rank(_load(prof), prof, layout.world, ("iter_time", "iter_energy", "time_breakdown"))
    clocks, compute, load, energy, times = [], [], [], [], []
    for r in range(layout.world):
        cmds = pipe_schedule(st[r], layout.pp, layout.nmb)
        ps = _numbers(s[r]["power_states"], sched, f"rank {r}'s power_states", n=len(cmds))
        if (ps <= 0).any():
            raise ValueError(f"{sched}: rank {r}'s power_states holds a clock <= 0")
        order = instruction_order(st[r], layout.pp, layout.nmb)
        clocks.append(ps[[j for j, c in enumerate(cmds) if c in KINDS]])
        t = _numbers(p[r]["iter_time"], prof, f"rank {r}'s iter_time", at_least=2)
        e = _numbers(p[r]["iter_energy"], prof, f"rank {r}'s iter_energy", n=len(t))
        times.append(float(np.median(t[1:])))
        energy.append(float(np.median(e[1:])))
        tb = p[r]["time_breakdown"]
        if not isinstance(tb, dict) or any(not isinstance(tb.get(k), list) for k in (*KINDS, "load")):
            raise ValueError(f"{prof}: rank {r}'s time_breakdown has no load, forward and backward lists")
        per = {}
        for k in KINDS:
            its = tb[k][1 : len(t)]
            if not its:
                raise ValueError(f"{prof}: rank {r}'s time_breakdown {k} has no iteration after the warm-up")
            rows = [_numbers(it, prof, f"rank {r}'s time_breakdown {k}", at_least=layout.nmb) for it in its]
            per[k] = np.mean([x[-layout.nmb :] for x in rows], axis=0)  # the last nmb: this iteration's
        compute.append(np.array([per[k][mb] for k, mb in order]))
        loads = [float(np.sum(_numbers(it, prof, f"rank {r}'s load", at_least=0))) for it in tb["load"][1 : len(t)]]
        load.append(np.mean(loads) / layout.nmb if loads else 0.0)
    return Plan(index, clocks, compute, np.array(load), np.array(energy), float(np.mean(times)))


def read_folder(folder: str | Path) -> tuple[Layout, list[Plan]]:
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    layout = parse_layout(folder)
    return layout, [read_plan(i, s, p, layout) for i, (s, p) in plan_files(folder).items()]


# --------------------------------------------------------------------------- the pipeline
@dataclass(frozen=True)
class Pipeline:
    """The 1F1B DAG of one iteration, one node per (stage, instruction): its edges and a topological order."""

    stage: np.ndarray  # per node (node order: stage by stage, each in Merak's order)
    first: np.ndarray  # per stage: its first node
    count: np.ndarray  # per stage: its number of nodes
    topo: np.ndarray  # topological position -> node
    src: np.ndarray  # per edge (node ids)
    dst: np.ndarray
    cross: np.ndarray  # bool per edge: between stages (a transfer)
    load_before: np.ndarray  # bool per node: a forward on a stage that loads its micro-batch


def pipeline(layout: Layout) -> Pipeline:
    order = [instruction_order(s, layout.pp, layout.nmb) for s in range(layout.pp)]
    stage = np.concatenate([np.full(len(o), s) for s, o in enumerate(order)])
    kind = np.array([k for o in order for k, _ in o], dtype=object)
    micro = np.array([m for o in order for _, m in o])
    count = np.array([len(o) for o in order])
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    n = len(stage)
    sched = Schedule(stage, kind, micro, np.arange(n, dtype=float), np.zeros(n), list(range(layout.pp)), 0.0)
    a, b = dag_edges(sched)
    # Merak's P2P blocks (batch_isend_irecv, wait, synchronize): the instruction after a send waits
    # for the receiver to finish the instruction before its receive
    pos = np.arange(n) - first[stage]
    ra, rb = [], []
    for x, y in zip(a.tolist(), b.tolist()):
        if stage[x] != stage[y] and pos[y] > 0 and pos[x] + 1 < count[stage[x]]:
            ra.append(y - 1)
            rb.append(x + 1)
    src = np.concatenate([a, np.array(ra, dtype=np.int64)])
    dst = np.concatenate([b, np.array(rb, dtype=np.int64)])
    topo = engine.toposort(n, src, dst)
    if len(topo) < n:
        raise ValueError(f"merak: the 1F1B DAG of {layout.pp} stages x {layout.nmb} micro-batches has a cycle")
    loads = (stage == 0) | (stage == layout.pp - 1)
    return Pipeline(stage, first, count, topo, src, dst, stage[src] != stage[dst], loads & (kind == FORWARD))


def timeline(pipe: Pipeline, dur_s: np.ndarray, load_s: np.ndarray, lag_s: float) -> tuple[np.ndarray, float]:
    """(start of each node, makespan) with `dur_s` per node, each stage's load before its forwards and
    `lag_s` on every transfer; EMO's timing engine."""
    n = len(dur_s)
    pos = np.empty(n, np.int64)
    pos[pipe.topo] = np.arange(n)
    load = np.where(pipe.load_before, load_s[pipe.stage], 0.0)
    lag = np.where(pipe.cross, lag_s, load[pipe.dst])
    g = engine.csr_in_edges(n, pos[pipe.src], pos[pipe.dst], np.zeros(len(lag), np.bool_), lag)
    offset = np.zeros(n)
    offset[pipe.first] = load[pipe.first]
    start, _, end, _ = engine.forward(*g, offset[pipe.topo], np.asarray(dur_s, float)[pipe.topo])
    out = np.empty(n)
    out[pipe.topo] = start
    return out, float(end)


# --------------------------------------------------------------------------- the model
@dataclass
class Model:
    layout: Layout
    fmax: float
    time: np.ndarray  # [rank, kind, (a, b, cap)]
    load_s: np.ndarray  # per stage
    lag_s: float
    tail_s: float
    power: np.ndarray  # [rank, feature]


def effective(f: np.ndarray, cap: float | np.ndarray) -> np.ndarray:
    return np.minimum(f, cap)


def fit_time(f: np.ndarray, t: np.ndarray, fmax: float, capped: bool = True) -> tuple[float, float, float]:
    """(a, b, cap) of t = a + b * fmax / min(f, cap), a, b >= 0: least squares over the samples,
    cap searched on a grid up to fmax (no cap; the only one tried when not `capped`)."""
    fs, inv = np.unique(f, return_inverse=True)
    cnt = np.bincount(inv).astype(float)
    mean = np.bincount(inv, t) / cnt
    w = np.sqrt(cnt)
    best = (np.inf, 0.0, 0.0, fmax)
    caps = np.arange(fs.min(), fmax, CAP_STEP_MHZ) if capped else np.empty(0)
    for cap in np.append(caps, fmax):
        X = np.c_[np.ones(len(fs)), fmax / effective(fs, cap)]
        coef, res = nnls(X * w[:, None], mean * w)
        if res < best[0] - 1e-15:
            best = (res, coef[0], coef[1], float(cap))
    return best[1], best[2], best[3]


def durations(model: Model, clocks: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's predicted time of each of its compute instructions (Merak's order)."""
    out = []
    for r, f in enumerate(clocks):
        st = model.layout.stages()[r]
        kinds = [k for k, _ in instruction_order(st, model.layout.pp, model.layout.nmb)]
        a, b, cap = model.time[r, [KINDS.index(k) for k in kinds]].T
        out.append(a + b * model.fmax / effective(f, cap))
    return out


def _stage_durations(model: Model, pipe: Pipeline, per_rank: list[np.ndarray]) -> np.ndarray:
    """Per node: the slowest of the stage's ranks (a stage's tensor-parallel ranks wait for each other)."""
    dur = np.zeros(len(pipe.stage))
    for r, d in enumerate(per_rank):
        s = model.layout.stages()[r]
        sl = slice(pipe.first[s], pipe.first[s] + pipe.count[s])
        dur[sl] = np.maximum(dur[sl], d)
    return dur


def energy_features(
    model: Model, pipe: Pipeline, clocks: list[np.ndarray], busy: list[np.ndarray], start: np.ndarray, period: float
) -> np.ndarray:
    """Per rank, the energy model's features (ENERGY_FEATURES): the iteration time, the compute
    time weighted by x and x**3 (x = effective clock / fmax), the waiting time weighted by x and
    x**3 (x = the clock the GPU was left at). A gap runs at the clock of the instruction before
    it; the iteration's first gap at the first instruction's."""
    rows = []
    for r, f in enumerate(clocks):
        s = model.layout.stages()[r]
        sl = slice(pipe.first[s], pipe.first[s] + pipe.count[s])
        st, d = start[sl], busy[r]
        kinds = np.array([KINDS.index(k) for k, _ in instruction_order(s, model.layout.pp, model.layout.nmb)])
        x = effective(f, model.time[r, kinds, 2]) / model.fmax
        gap = np.maximum(np.append(st[1:] - (st[:-1] + d[:-1]), period - (st[-1] + d[-1])), 0.0)
        gap[0] += st[0]  # wait before the first instruction: Perseus gives its clock to the commands before it
        gx = f / model.fmax
        rows.append([period, np.sum(d * x), np.sum(d * x**3), np.sum(gap * gx), np.sum(gap * gx**3)])
    return np.array(rows)


def _simulate(model: Model, pipe: Pipeline, clocks: list[np.ndarray], lag_s: float):
    busy = durations(model, clocks)
    start, span = timeline(pipe, _stage_durations(model, pipe, busy), model.load_s, lag_s)
    return busy, start, span


def fit(layout: Layout, plans: list[Plan], *, capped: bool = True) -> Model:
    """EMO's model of this pipeline from the fit plans' measurements only (`capped=False`: the
    instruction times without a clock cap, for the ablation)."""
    if len(plans) < 2:
        raise ValueError(f"{layout.model}: need at least 2 plans to fit (got {len(plans)})")
    fmax = float(max(c.max() for p in plans for c in p.clocks))
    st = np.array(layout.stages())
    time = np.zeros((layout.world, len(KINDS), 3))
    for r in range(layout.world):
        kinds = np.array([k for k, _ in instruction_order(st[r], layout.pp, layout.nmb)])
        for k, name in enumerate(KINDS):
            m = kinds == name
            f = np.concatenate([p.clocks[r][m] for p in plans])
            t = np.concatenate([p.compute_s[r][m] for p in plans])
            time[r, k] = fit_time(f, t, fmax, capped)
    load = np.array([np.mean([p.load_s[st == s].max() for p in plans]) for s in range(layout.pp)])
    model = Model(layout, fmax, time, load, 0.0, 0.0, np.zeros((layout.world, len(ENERGY_FEATURES))))
    pipe = pipeline(layout)
    measured = np.array([p.time_s for p in plans])
    best = None
    for lag in LAGS_S:  # the tail is the mean residual at each lag; keep the lag that fits best
        spans = np.array([_simulate(model, pipe, p.clocks, lag)[2] for p in plans])
        tail = float(np.mean(measured - spans))
        sse = float(np.sum((spans + tail - measured) ** 2))
        if best is None or sse < best[0] - 1e-12:
            best = (sse, lag, tail)
    assert best is not None
    model.lag_s, model.tail_s = best[1], best[2]
    feats = []
    for p in plans:
        busy, start, span = _simulate(model, pipe, p.clocks, model.lag_s)
        feats.append(energy_features(model, pipe, p.clocks, busy, start, span + model.tail_s))
    F = np.array(feats)  # [plan, rank, feature]
    for r in range(layout.world):
        model.power[r], _ = nnls(F[:, r], np.array([p.energy_j[r] for p in plans]))
    return model


def predict(model: Model, clocks: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """(iteration time s, energy per iteration J per rank) of a plan given its clocks."""
    pipe = pipeline(model.layout)
    busy, start, span = _simulate(model, pipe, clocks, model.lag_s)
    period = span + model.tail_s
    return period, np.einsum("rf,rf->r", energy_features(model, pipe, clocks, busy, start, period), model.power)


def powers_w(model: Model, rank: int, f: float) -> tuple[float, float]:
    """(compute, waiting) power (W) the fitted energy model gives `rank` at clock `f` (compute at
    its effective clock: the lower of the rank's two caps)."""
    c = model.power[rank]
    x = min(f, float(model.time[rank, :, 2].min())) / model.fmax
    w = f / model.fmax
    return float(c[0] + c[1] * x + c[2] * x**3), float(c[0] + c[3] * w + c[4] * w**3)


# --------------------------------------------------------------------------- references
def naive(base: Plan, clocks: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """The base plan scaled by the instructions' clock ratios: each instruction's time by
    f_base / f (the slowest rank's compute-time-weighted ratio scales the iteration), each rank's
    energy by its compute-time-weighted (f / f_base)**2 (energy per operation ~ V**2 with V ~ f)."""
    w = base.compute_s
    ratio = [np.sum(w[r] * base.clocks[r] / f) / np.sum(w[r]) for r, f in enumerate(clocks)]
    scale = [np.sum(w[r] * (f / base.clocks[r]) ** 2) / np.sum(w[r]) for r, f in enumerate(clocks)]
    return base.time_s * max(ratio), base.energy_j * np.array(scale)


def nearest(fitted: list[Plan], clocks: list[np.ndarray]) -> Plan:
    """The fit plan whose clocks are closest (sum of |MHz| differences over every instruction)."""
    d = [sum(float(np.abs(p.clocks[r] - f).sum()) for r, f in enumerate(clocks)) for p in fitted]
    return fitted[int(np.argmin(d))]
