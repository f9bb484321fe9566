"""Perseus via lowtime: pass/pack units, feasibility, Rust-panic fallback to the Python min-cut."""
import numpy as np
import pytest

from emo.optimize.instances import random_problem, pipeline_problem, one_f_one_b

lowtime = pytest.importorskip("lowtime", reason="lowtime not installed (pip install 'emo[baselines]')")

from emo.optimize.perseus import optimize_perseus, units  # noqa: E402


def _pipeline():
    clocks = np.array([810, 1005, 1200, 1410])
    f = clocks / 1410
    t = np.stack([np.stack([0.02 * (0.3 + 0.7 / f), 0.04 * (0.3 + 0.7 / f)]) for _ in range(3)])
    e = t * (70 + 250 * f ** 2)
    return pipeline_problem(t, e, clocks, microbatches=3, idle_w=70.0, split=2)


def test_pass_units_are_the_pipeline_passes():
    p = _pipeline()
    u = units(p, "pass")
    # 3 stages x 3 microbatches x (fwd + bwd), 2 packs each; stage 0's first forwards follow each
    # other with nothing in between, so they may share a pass
    n_pass = len(np.unique(u[u >= 0]))
    assert 12 <= n_pass <= 18
    assert len(np.unique(units(p, "pack"))) == int((p.device >= 0).sum())  # no host nodes here
    assert one_f_one_b(2, 2) == [[("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)],
                                 [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]]


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
