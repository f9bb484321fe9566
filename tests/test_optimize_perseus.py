"""Perseus via lowtime: pass/pack units, feasibility, Rust-panic fallback to the Python min-cut."""

import numpy as np
import pytest
from optimize_instances import one_f_one_b, pipeline_problem, random_problem

lowtime = pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")

from emo.optimize.problem import units  # noqa: E402
from emo.optimize.solvers.perseus import optimize_perseus  # noqa: E402


def _pipeline():
    clocks = np.array([810, 1005, 1200, 1410])
    f = clocks / 1410
    t = np.stack([np.stack([0.02 * (0.3 + 0.7 / f), 0.04 * (0.3 + 0.7 / f)]) for _ in range(3)])
    e = t * (70 + 250 * f**2)
    return pipeline_problem(t, e, clocks, microbatches=3, idle_w=70.0, split=2)


def test_pass_units_are_the_pipeline_passes():
    p = _pipeline()
    u = units(p, "pass")
    # 3 stages x 3 microbatches x (fwd + bwd), 2 packs each; stage 0's first forwards follow each
    # other with nothing in between, so they may share a pass
    n_pass = len(np.unique(u[u >= 0]))
    assert 12 <= n_pass <= 18
    assert len(np.unique(units(p, "pack"))) == int((p.device >= 0).sum())  # no host nodes here
    device = p.device[np.argsort(p.perm)]  # caller's order, as units
    for k in np.unique(u[u >= 0]):  # a pass never spans two GPUs
        assert len(np.unique(device[u == k])) == 1
    assert one_f_one_b(2, 2) == [
        [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)],
        [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)],
    ]


@pytest.mark.parametrize("level", ["pass", "pack"])
def test_perseus_meets_the_deadline_and_saves(level):
    p = _pipeline()
    sol = optimize_perseus(p, 0.05, level=level, unit_time_ms=1.0)
    assert sol.feasible
    assert sol.energy_j < sol.baseline().energy_j
    assert sol.info["rust_panics"] == 0 and sol.info["lowtime_version"]


def test_rust_panic_falls_back_to_python_min_cut(monkeypatch):
    from lowtime import solver as lt_solver

    p, _ = random_problem(1, gpus=2, kernels=6)
    ref = optimize_perseus(p, 0.05, level="pass", unit_time_ms=0.5)

    class Panic(BaseException):  # what pyo3's PanicException derives from
        pass

    class Boom:
        def __init__(self, *a):
            pass

        def find_min_cut(self):
            raise Panic("thread panicked")

    class FakeRs:
        PhillipsDessouky = Boom

    monkeypatch.setattr(lt_solver, "_lowtime_rs", FakeRs)
    sol = optimize_perseus(p, 0.05, level="pass", unit_time_ms=0.5)
    assert sol.info["rust_panics"] > 0
    assert lt_solver._lowtime_rs is FakeRs  # restored after the solve
    assert sol.energy_j == pytest.approx(ref.energy_j, rel=1e-6)


def _host_bridged():
    """GPU 0 runs a; a host sync waits for it, two host calls follow, the second launches b on GPU 1
    (start-to-start); c on GPU 1 follows b on its stream. Host nodes: 1, 2."""
    from emo.optimize.problem import build_problem

    clocks = np.array([705, 1410])
    dur = np.array([[20e6, 10e6], [1e6, 1e6], [3e6, 3e6], [20e6, 10e6], [20e6, 10e6]])
    en = np.array([[1.0, 2.0], [0, 0], [0, 0], [1.0, 2.0], [1.0, 2.0]])
    return build_problem(
        [0, 1, 2, 3],
        [1, 2, 3, 4],
        [0, -1, -1, 1, 1],
        dur,
        en,
        np.full((2, 2), 50.0),
        clocks,
        from_start=[False, False, True, False],
    )


def test_perseus_dag_keeps_precedence_through_host_calls():
    from emo.optimize.solvers.perseus import gpu_edges

    p = _host_bridged()
    a, b = gpu_edges(p)
    pairs = set(zip(p.perm[a].tolist(), p.perm[b].tolist()))
    assert pairs == {(0, 3), (3, 4)}  # a -> b through the two host calls, b -> c directly
    _, _, gap = gpu_edges(p, with_gaps=True)
    gaps = dict(zip(zip(p.perm[a].tolist(), p.perm[b].tolist()), gap.tolist()))
    assert gaps == {(0, 3): 1e6, (3, 4): 0.0}  # the sync's 1 ms; b launches at the start of the 3 ms call


def test_perseus_time_quantum_bounds_the_iterations():
    p = _pipeline()
    sol = optimize_perseus(p, 0.0, level="pass", max_iterations=20)
    walk_ms = (p.forward(p.dur_ns[:, 0])[2] - p.makespan0_ns) * 1e-6
    assert sol.info["unit_time_ms"] >= walk_ms / 20 - 1e-9
    assert sol.info["pd_iterations"] <= 40 and sol.info["max_pd_iterations"] == 20
    assert sol.feasible
