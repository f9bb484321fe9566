"""Predicting Perseus's measured plans (emo.perseus.measured): the folder reader and its one-line
errors, plain and gzipped files, the fit recovering a planted model from a synthetic folder, and
the held-out errors on the artifact's real A100 runs (skipped when the shared data is absent)."""

import gzip
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from emo.perseus import measured as pm
from emo.perseus.merak import FORWARD, instruction_order, pipe_schedule

ROOT = Path(__file__).resolve().parents[1]
A100 = ROOT.parent / "shared" / "data" / "perseus-sosp24" / "perseus" / "A100" / "dp1+pp4+tp1"
NAME = "merak+tiny+custom:0,1,2+dp1+pp3+tp1+mbs1+nmb4+PointSolution"
FMAX = 1410.0


def planted(layout: pm.Layout) -> pm.Model:
    """A model with known parameters: times capped at 1200 MHz on rank 0, uncapped on the others."""
    time = np.zeros((layout.world, 2, 3))
    time[0] = [[0.010, 0.020, 1200.0], [0.020, 0.040, 1200.0]]
    time[1] = [[0.008, 0.018, FMAX], [0.015, 0.035, FMAX]]
    time[2] = [[0.004, 0.010, FMAX], [0.010, 0.030, FMAX]]
    power = np.array([[60.0, 100.0, 150.0, 40.0, 20.0], [50.0, 120.0, 130.0, 30.0, 10.0], [70.0, 90, 160, 20, 30]])
    return pm.Model(layout, FMAX, time, np.array([0.004, 0.0, 0.003]), 0.0, 0.05, power)


def power_states(layout: pm.Layout, rank: int, compute: np.ndarray) -> list[float]:
    """Perseus's server's filling: a command takes the clock of the compute instruction before it."""
    cmds = pipe_schedule(layout.stages()[rank], layout.pp, layout.nmb)
    it, state, out = iter(compute.tolist()), float(compute[0]), []
    for c in cmds:
        if c in pm.KINDS:
            state = next(it)
        out.append(state)
    return out


def write_plan(folder: Path, i: int, model: pm.Model, clocks: list[np.ndarray], gz: bool) -> None:
    layout = model.layout
    t, e = pm.predict(model, clocks)
    busy = pm.durations(model, clocks)
    sched = [{"rank": r, "power_states": power_states(layout, r, c)} for r, c in enumerate(clocks)]
    prof = []
    for r in range(layout.world):
        order = instruction_order(layout.stages()[r], layout.pp, layout.nmb)
        per = {k: [busy[r][j] for j, (kk, _) in enumerate(order) if kk == k] for k in pm.KINDS}
        loads = [float(model.load_s[layout.stages()[r]])] * layout.nmb
        prof.append(
            {
                "rank": r,
                "iter_time": [2 * t, t, t, t],  # the first iteration is warm-up
                "iter_energy": [3 * e[r], e[r], e[r], e[r]],
                "time_breakdown": {
                    "load": [loads] * 4,
                    "forward": [[0.0, *per[FORWARD]]] + [per[FORWARD]] * 3,
                    "backward": [[0.0, *per["backward"]]] + [per["backward"]] * 3,
                },
            }
        )
    for stem, doc in ((f"{i}.sched.json", sched), (f"{i}.prof.json", prof)):
        data = json.dumps(doc).encode()
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)


@pytest.fixture
def synthetic(tmp_path):
    folder = tmp_path / NAME
    folder.mkdir()
    layout = pm.parse_layout(folder)
    model = planted(layout)
    rng = np.random.default_rng(0)
    n = [len(instruction_order(s, layout.pp, layout.nmb)) for s in layout.stages()]
    for i in range(12):
        if i == 0:
            clocks = [np.full(k, FMAX) for k in n]
        else:
            clocks = [rng.choice([1000.0, 1100.0, 1200.0, 1300.0, FMAX], size=k) for k in n]
        write_plan(folder, i, model, clocks, gz=i % 3 == 0)  # plain and gzipped files side by side
    return folder, model


def test_layout_from_the_folder_name():
    lay = pm.parse_layout(Path("x") / "merak+gpt3-xl+custom:0,8+dp2+pp4+tp2+mbs8+nmb128+PointSolution")
    assert (lay.model, lay.dp, lay.pp, lay.tp, lay.mbs, lay.nmb, lay.world) == ("gpt3-xl", 2, 4, 2, 8, 128, 16)
    assert lay.stages() == [r // 4 for r in range(16)]  # pipe outermost in Merak's grid


def test_the_fit_recovers_a_planted_model(synthetic):
    folder, truth = synthetic
    layout, plans = pm.read_folder(folder)
    assert [p.index for p in plans] == list(range(12))
    model = pm.fit(layout, [p for p in plans if p.index % 2 == 0])
    np.testing.assert_allclose(model.time, truth.time, rtol=1e-6, atol=1e-9)
    # planted without a transfer lag: iteration times alone do not separate it from the tail where
    # every critical path crosses the stages as often (docs/perseus-measured.md)
    assert (model.lag_s, model.tail_s) == (truth.lag_s, pytest.approx(truth.tail_s))
    for p in plans:
        if p.index % 2:
            t, e = pm.predict(model, p.clocks)
            assert t == pytest.approx(p.time_s, rel=1e-6)
            np.testing.assert_allclose(e, p.energy_j, rtol=1e-6)


def test_gzipped_and_plain_files_read_the_same(synthetic, tmp_path):
    folder, _ = synthetic
    layout = pm.parse_layout(folder)
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in (folder / "0.sched.json.gz", folder / "0.prof.json.gz"):
        (plain / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    a = pm.read_plan(0, folder / "0.sched.json.gz", folder / "0.prof.json.gz", layout)
    b = pm.read_plan(0, plain / "0.sched.json", plain / "0.prof.json", layout)
    assert a.time_s == b.time_s
    np.testing.assert_array_equal(a.energy_j, b.energy_j)
    np.testing.assert_array_equal(np.concatenate(a.clocks), np.concatenate(b.clocks))


def test_the_pipeline_makespan_is_1f1b():
    # equal forward and backward times on every stage, no loads or lags: (nmb + pp - 1) (f + b)
    lay = pm.Layout("m", 1, 4, 1, 1, 8)
    pipe = pm.pipeline(lay)
    dur = np.where(np.array([k for s in range(4) for k, _ in instruction_order(s, 4, 8)]) == FORWARD, 1.0, 2.0)
    _, span = pm.timeline(pipe, dur, np.zeros(4), 0.0)
    assert span == pytest.approx((8 + 4 - 1) * 3.0)


def test_fit_time_finds_the_cap():
    f = np.repeat([1000.0, 1100.0, 1200.0, 1300.0, 1410.0], 4)
    t = 0.01 + 0.03 * FMAX / np.minimum(f, 1250.0)
    a, b, cap = pm.fit_time(f, t, FMAX)
    assert (a, b, cap) == (pytest.approx(0.01), pytest.approx(0.03), 1250.0)
    assert pm.fit_time(f, t, FMAX, capped=False)[2] == FMAX


def test_the_naive_predictor_is_the_base_at_its_own_clocks(synthetic):
    _, plans = pm.read_folder(synthetic[0])
    t, e = pm.naive(plans[0], plans[0].clocks)
    assert t == pytest.approx(plans[0].time_s)
    np.testing.assert_allclose(e, plans[0].energy_j)
    t2, _ = pm.naive(plans[0], [c / 2 for c in plans[0].clocks])  # half the clock: twice the time
    assert t2 == pytest.approx(2 * plans[0].time_s)


def benchmark():
    spec = importlib.util.spec_from_file_location("perseus_measured", ROOT / "benchmarks" / "perseus_measured.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("split", ["even", "odd", "half"])
def test_the_benchmark_line(synthetic, capsys, split):
    assert benchmark().main([str(synthetic[0]), "--fit-on", split]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(
        r"perseus measured: time MAPE ([\d.]+) %, energy MAPE ([\d.]+) % over 6 plans \(1 models\);"
        r" naive time ([\d.]+) %, energy ([\d.]+) %",
        last,
    )
    assert m, last
    assert float(m.group(1)) == 0.0 and float(m.group(2)) == 0.0 and float(m.group(3)) > 1.0


def test_the_benchmark_names_a_bad_folder(tmp_path, capsys):
    assert benchmark().main([str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err.strip() == f"perseus_measured: error: {tmp_path / 'nope'}: no such folder"


# --------------------------------------------------------------------------- bad input: one line naming the file
def test_a_folder_name_without_the_layout(tmp_path):
    bad = tmp_path / "merak+tiny+dp1+pp2+tp1"
    bad.mkdir()
    with pytest.raises(ValueError, match=r"merak\+tiny\+dp1\+pp2\+tp1: the folder's name gives no mbs, nmb"):
        pm.read_folder(bad)


def test_a_plan_missing_its_profile(synthetic):
    folder, _ = synthetic
    (folder / "4.prof.json").unlink()
    with pytest.raises(ValueError, match=r"4\.sched\.json: no 4\.prof\.json\(\.gz\) beside it"):
        pm.read_folder(folder)


def test_a_plan_given_twice(synthetic):
    folder, _ = synthetic
    (folder / "0.sched.json").write_bytes(gzip.decompress((folder / "0.sched.json.gz").read_bytes()))
    with pytest.raises(ValueError, match=r"plan 0's sched file is there twice"):
        pm.read_folder(folder)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s, p: s[0].update(power_states=s[0]["power_states"][:-1]), r"rank 0's power_states is not a list of"),
        (lambda s, p: s.pop(), r"2 ranks, the folder's name gives 3"),
        (lambda s, p: s[1].update(rank=5), r"rank 5 outside 0..2"),
        (lambda s, p: p[1].pop("iter_energy"), r"rank 1 has no 'iter_energy'"),
        (lambda s, p: p[0]["time_breakdown"].pop("backward"), r"rank 0's time_breakdown has no load, forward"),
        (lambda s, p: p[0].update(iter_time=[1.0]), r"rank 0's iter_time is not a list of at least 2"),
    ],
)
def test_bad_plan_files(synthetic, edit, message):
    folder, _ = synthetic
    sp, pp = folder / "1.sched.json", folder / "1.prof.json"
    s, p = json.loads(sp.read_text()), json.loads(pp.read_text())
    edit(s, p)
    sp.write_text(json.dumps(s))
    pp.write_text(json.dumps(p))
    with pytest.raises(ValueError, match=message) as err:
        pm.read_folder(folder)
    assert str(err.value).startswith(str(folder / "1."))


def test_malformed_json(synthetic):
    folder, _ = synthetic
    (folder / "2.prof.json").write_text('[{"rank": 0,')
    with pytest.raises(ValueError, match=r"2\.prof\.json: truncated or malformed JSON"):
        pm.read_folder(folder)


# --------------------------------------------------------------------------- the real runs
@pytest.mark.skipif(not A100.is_dir(), reason=f"Perseus's measured runs are not at {A100}")
def test_bert_huge_held_out_plans_within_the_goal():
    (folder,) = sorted(A100.glob("merak+bert-huge-uncased+*"))
    layout, plans = pm.read_folder(folder)
    assert (layout.world, layout.nmb, len(plans)) == (4, 32, 30)
    assert all((c == 1410).all() for c in plans[0].clocks)  # plan 0: every instruction at the maximum clock
    model = pm.fit(layout, [p for p in plans if p.index % 2 == 0])
    terr, eerr = [], []
    for p in plans[1::2]:
        t, e = pm.predict(model, p.clocks)
        terr.append(abs(t / p.time_s - 1))
        eerr += list(abs(e / p.energy_j - 1))
    assert np.mean(terr) < 0.02 and np.mean(eerr) < 0.03
