"""The open calibration interface (emo.model.kernels, `emo model fit`) on real and virtual-GPU data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from emo.cli import main
from emo.model.gpupowermodel import long_table, read_power_curves
from emo.model.kernels import fit_predict

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dvfs" / "gpupowermodel_titanx"
MICRO = DATA / "TitanX__titanx_micro_names_peak_idle_HPCAandCF.csv"
APPS = DATA / "TitanX__titanx_real_allFsPower_HPCAandCF.csv"
needs_data = pytest.mark.skipif(not MICRO.is_file(), reason=f"{DATA} not present")


@pytest.fixture(scope="module")
def titanx(tmp_path_factory):
    d = tmp_path_factory.mktemp("titanx")
    long_table(read_power_curves(MICRO)).to_csv(d / "bench.csv", index=False)
    long_table(read_power_curves(APPS)).to_parquet(d / "apps.parquet", index=False)
    return d


@pytest.fixture(scope="module")
def sim_dcgm():
    from kernel_tables import sim_tables

    return sim_tables(form="dcgm")


@pytest.fixture(scope="module")
def sim_ncu():
    from kernel_tables import sim_tables

    return sim_tables(form="ncu")


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@needs_data
def test_titanx_through_the_cli_beats_the_mean_curve(titanx, capsys):
    out = _json(
        capsys,
        ["model", "fit", "--bench", str(titanx / "bench.csv"), "--targets", str(titanx / "apps.parquet"), "--json"],
    )
    assert out["reference_mhz"] == 1164 and out["mape_time_pct"] is None  # power-only data
    assert out["mape_power_pct"] < out["mean_curve"]["mape_power_pct"]  # ~1.8 % vs ~5.2 %
    assert out["mape_power_pct"] < out["nnls"]["mape_power_pct"]  # plain anchored NNLS ~3.8 %
    assert out["mape_power_pct"] < 2.5
    assert not [k for k in out if k.startswith(("mean_curve_", "nnls_"))]  # each score once, under its method
    preds = pd.DataFrame(out["predictions"])
    assert preds["name"].nunique() == 35 and len(preds) == 35 * 16
    assert preds["anchor"].sum() == 35
    a = preds[preds["anchor"]]
    np.testing.assert_allclose(a["emo_power_w"], a["measured_power_w"])  # the anchor is kept exactly


@needs_data
def test_titanx_without_an_idle_row_estimates_it_and_says_so(titanx, capsys):
    bench = pd.read_csv(titanx / "bench.csv")
    bench[bench["name"] != "Idle"].to_csv(titanx / "noidle.csv", index=False)
    out = _json(
        capsys,
        [
            "model",
            "fit",
            "--bench",
            str(titanx / "noidle.csv"),
            "--targets",
            str(titanx / "apps.parquet"),
            "--ref-mhz",
            "975",
            "--json",
        ],
    )
    assert any("no idle row" in n for n in out["notes"])
    assert out["mape_power_pct"] < out["mean_curve"]["mape_power_pct"]


@pytest.mark.parametrize("form", ["dcgm", "ncu"])
@pytest.mark.parametrize("idle", [True, False])
def test_virtual_gpu_kernels_beat_both_references(form, idle, request):
    bench, targets = request.getfixturevalue(f"sim_{form}")
    if not idle:
        bench = bench[bench["name"] != "idle"]
    res = fit_predict(bench, targets, counters=form)
    emo, mean, plain = res.scores["emo"], res.scores["mean_curve"], res.scores["nnls"]
    for q in ("mape_time_pct", "mape_energy_pct"):
        assert emo[q] < mean[q], (q, res.scores)
        # on the phased virtual GPU with its per-shape effects, DCGM ratios leave the plain anchored
        # NNLS ahead on energy (with an idle row 1.2 % vs 1.4 %); everywhere else the model beats it
        if not (form == "dcgm" and q == "mape_energy_pct"):
            assert emo[q] < plain[q], (q, res.scores)
    # phased virtual GPU whose power is not the model's law: energy up to 3.0 % (DCGM, idle row)
    assert emo["mape_time_pct"] < 3.0 and emo["mape_energy_pct"] < 3.5
    assert any("idle" in n for n in res.notes)
    json.dumps(res.to_json())  # plain JSON


def test_a_clock_subset_predicts_every_clock(sim_ncu):
    bench, targets = sim_ncu
    clocks = np.sort(bench["sm_mhz"].unique())
    sub = bench[bench["sm_mhz"].isin(clocks[::3]) | (bench["sm_mhz"] == clocks[-1])]
    full, part = fit_predict(bench, targets), fit_predict(sub, targets)
    assert set(part.predictions["sm_mhz"]) == set(clocks)  # the targets' clocks, interpolated
    for q in ("mape_time_pct", "mape_energy_pct"):
        assert part.scores["emo"][q] < full.scores["emo"][q] + 1.0


def test_explicit_pairs_and_unknown_columns(sim_ncu):
    bench, targets = sim_ncu
    res = fit_predict(bench, targets, pairs=[("fp32_fma_low", "fp32_fma_high"), ("int32_low", "int32_high")])
    assert res.scores["emo"]["mape_energy_pct"] < res.scores["mean_curve"]["mape_energy_pct"]
    with pytest.raises(ValueError, match="pairs: 'nope' is not a benchmark"):
        fit_predict(bench, targets, pairs=[("nope", "int32_high")])
    extra = fit_predict(bench.assign(my_counter=1.0), targets.assign(my_counter=1.0))
    assert any("my_counter" in n for n in extra.notes) and "my_counter" in extra.features


def test_bad_tables_get_one_line(sim_ncu, tmp_path, capsys):
    bench, targets = sim_ncu
    with pytest.raises(ValueError, match="targets: missing counter column"):
        fit_predict(bench, targets.drop(columns=["dram__bytes_read.sum"]))
    with pytest.raises(ValueError, match="has no row at the reference clock"):
        fit_predict(bench, targets[targets["sm_mhz"] != targets["sm_mhz"].max()])
    with pytest.raises(ValueError, match="needs an energy_j or a power_w"):
        fit_predict(bench.drop(columns=["power_w"]), targets)
    with pytest.raises(ValueError, match="ref-mhz: 1 MHz is not a benchmark clock"):
        fit_predict(bench, targets, ref_mhz=1)
    with pytest.raises(ValueError, match="no measurement of int32_high"):
        fit_predict(bench.drop(index=bench.index[(bench["name"] == "int32_high")][:1]), targets)
    (tmp_path / "bad.csv").write_text("name,sm_mhz\n")
    assert main(["model", "fit", "--bench", str(tmp_path / "bad.csv"), "--targets", str(tmp_path / "bad.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bench" in err[0]


def test_the_cli_names_the_users_file_for_what_the_model_cannot_take(sim_ncu, tmp_path, capsys):
    bench, targets = sim_ncu
    f = bench["sm_mhz"].max()

    def fit(b, t, *extra):
        bp, tp = tmp_path / "b.csv", tmp_path / "t.csv"
        b.to_csv(bp, index=False)
        t.to_csv(tp, index=False)
        rc = main(["model", "fit", "--bench", str(bp), "--targets", str(tp), *extra])
        out, err = capsys.readouterr()
        return rc, out, err.strip(), bp, tp

    rc, _, err, bp, _ = fit(bench.assign(**{"dram__bytes_read.sum": np.inf}), targets)
    assert (
        rc == 2 and err.startswith(f"emo: error: --bench {bp}: ") and "dram__bytes_read.sum=inf (must be finite)" in err
    )
    t = targets.copy()
    t.loc[t.index[3], "power_w"] = np.inf
    rc, _, err, _, tp = fit(bench, t)
    assert rc == 2 and err.startswith(f"emo: error: --targets {tp}: ") and "power_w=inf" in err
    rc, _, err, bp, _ = fit(bench[bench["sm_mhz"] == f], targets)
    assert rc == 2 and err == f"emo: error: --bench {bp}: every row is at {f} MHz; the model needs several clocks"
    rc, _, err, _, tp = fit(bench, targets.drop(columns=["dram__bytes_read.sum"]))  # the model's own check
    assert rc == 2 and err.startswith(f"emo: error: --targets {tp}: missing counter column")
    rc, _, err, _, _ = fit(bench, targets, "--ref-mhz", "1")
    assert rc == 2 and err.startswith("emo: error: --ref-mhz 1 MHz is not a benchmark clock")

    rc, out, _, _, _ = fit(bench, targets[targets["sm_mhz"] == f])  # one measurement each: predict, score nothing
    assert rc == 0 and "nothing scored" in out and "MAPE" not in out
    rc, _, err, bp, _ = fit(bench, targets, "--out", str(tmp_path / "b.csv" / "x.csv"))  # under a file
    assert rc == 2 and err.startswith(f"emo: error: --out {bp / 'x.csv'}: cannot write (") and ".tmp" not in err


def test_json_to_a_reader_that_goes_away_is_not_an_error(sim_ncu, tmp_path):
    import subprocess
    import sys

    bench, targets = sim_ncu
    bench.to_csv(tmp_path / "b.csv", index=False)
    targets.to_csv(tmp_path / "t.csv", index=False)
    cmd = f"{sys.executable} -m emo.cli model fit --bench b.csv --targets t.csv --json | head -c 20"
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert r.returncode == 0 and r.stdout.startswith('{"reference_mhz"') and r.stderr == "", r.stderr


def _renamed(bench: pd.DataFrame, targets: pd.DataFrame):
    """The ncu-form tables with every counter under a name no source knows."""
    cols = [c for c in bench.columns if c not in ("name", "sm_mhz", "time_s", "power_w")]
    new = {c: f"metric_{i}" for i, c in enumerate(cols)}
    return bench.rename(columns=new), targets.rename(columns=new), list(new.values())


def test_any_feature_names_fit_and_say_how_they_are_normalised(sim_ncu, tmp_path, capsys):
    bench, targets, names = _renamed(*sim_ncu)
    res = fit_predict(bench, targets, features="all")
    for q in ("mape_time_pct", "mape_energy_pct"):
        assert res.scores["emo"][q] < res.scores["mean_curve"][q], (q, res.scores)
    assert set(res.features) <= set(names) and res.normalisation
    assert all("total per range" in res.normalisation[c] for c in res.features)  # counts: read as totals
    some = fit_predict(bench, targets, features=f"{names[0]},{names[3]}:total")
    assert set(some.features) <= {names[0], names[3]}
    with pytest.raises(ValueError, match="bench: no feature column 'nope'"):
        fit_predict(bench, targets, features=["nope"])
    with pytest.raises(ValueError, match="features: 'x:half'"):
        fit_predict(bench, targets, features="x:half")
    bench.to_csv(tmp_path / "b.csv", index=False)
    targets.to_csv(tmp_path / "t.csv", index=False)
    argv = ["model", "fit", "--bench", str(tmp_path / "b.csv"), "--targets", str(tmp_path / "t.csv")]
    assert main([*argv, "--features", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--bench {tmp_path / 'b.csv'}" in err[0] and "nope" in err[0]
    targets.assign(**{names[0]: "lots"}).to_csv(tmp_path / "t_text.csv", index=False)
    assert (
        main(
            [
                "model",
                "fit",
                "--bench",
                str(tmp_path / "b.csv"),
                "--targets",
                str(tmp_path / "t_text.csv"),
                "--features",
                "all",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--targets {tmp_path / 't_text.csv'}" in err[0] and f"{names[0]}='lots'" in err[0]
    out = _json(capsys, [*argv, "--features", "all", "--json"])
    assert out["mape_energy_pct"] < out["mean_curve"]["mape_energy_pct"] and set(out["normalisation"]) == set(
        out["features"]
    )


def _mix_fractions(df: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Static instruction-mix-like features: each range's counts as fractions of its total."""
    frac = df[names].div(df[names].sum(axis=1), axis=0)
    return df.drop(columns=names).join(frac.add_prefix("frac_"))


def test_static_and_per_clock_features(sim_ncu):
    bench, targets, names = _renamed(*sim_ncu)
    fb, ft = _mix_fractions(bench, names), _mix_fractions(targets, names)
    static = fit_predict(fb, ft, features="all")
    assert all("static" in v and "ratio" in v for v in static.normalisation.values())
    for q in ("mape_time_pct", "mape_energy_pct"):
        assert static.scores["emo"][q] < static.scores["mean_curve"][q], (q, static.scores)
    # a static feature given on one row per name only fills the others
    top = fb["sm_mhz"].max()
    sparse = fb.copy()
    sparse.loc[sparse["sm_mhz"] != top, [c for c in fb if c.startswith("frac_")]] = np.nan
    same = fit_predict(sparse, ft, features="all")
    assert same.scores["emo"] == static.scores["emo"]
    # per-clock counters (here: changing with the clock away from the reference) are read at the anchor
    moving = bench.copy()
    moving[names] = moving[names].mul(moving["sm_mhz"] / top, axis=0)
    per_clock = fit_predict(moving, targets, features="all")
    assert all("per-clock" in v for v in per_clock.normalisation.values())
    assert per_clock.scores["emo"] == fit_predict(bench, targets, features="all").scores["emo"]


def test_other_scale_constant_and_collinear_features_are_warned(sim_dcgm, tmp_path, capsys):
    bench, targets = sim_dcgm
    ratio = [c for c in bench.columns if c.startswith("DCGM_FI_PROF_") and "BYTES" not in c]
    pct = targets.assign(**{c: targets[c] * 100 for c in ratio})  # percent in the targets, fractions in the benchmarks
    res = fit_predict(bench, pct, counters="dcgm")
    hit = [w for w in res.warnings if "another unit or scale" in w]
    assert hit and all(any(c in w for c in ratio) for w in hit)
    assert not fit_predict(bench, targets, counters="dcgm").warnings  # the same tables in one unit: quiet
    down = fit_predict(bench.assign(**{c: bench[c] * 100 for c in ratio}), targets, counters="dcgm")
    assert any("another unit or scale" in w for w in down.warnings)  # percent in the benchmarks this time
    light = targets.assign(DCGM_FI_PROF_PIPE_FP64_ACTIVE=targets["DCGM_FI_PROF_PIPE_FP64_ACTIVE"] * 0.01)
    assert not fit_predict(bench, light, counters="dcgm").warnings  # a unit used lightly is no other scale
    b2 = bench.assign(const=3.0, twice=2 * bench["DCGM_FI_PROF_DRAM_ACTIVE"])
    t2 = targets.assign(const=3.0, twice=2 * targets["DCGM_FI_PROF_DRAM_ACTIVE"])
    res = fit_predict(b2, t2, features="all")
    assert any(w.startswith("feature const is 3 in every benchmark") for w in res.warnings)
    assert any("DCGM_FI_PROF_DRAM_ACTIVE and twice are collinear" in w for w in res.warnings)
    bench.to_csv(tmp_path / "b.csv", index=False)
    pct.to_csv(tmp_path / "t.csv", index=False)
    assert (
        main(
            [
                "model",
                "fit",
                "--bench",
                str(tmp_path / "b.csv"),
                "--targets",
                str(tmp_path / "t.csv"),
                "--counters",
                "dcgm",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("emo: warning: feature ") for line in err)


def test_selection_uses_the_benchmarks_only(sim_ncu, capsys, tmp_path):
    bench, targets = sim_ncu
    res = fit_predict(bench, targets, select=True)
    chosen = (
        f"mix={res.form['mix']} anchor={res.form['anchor']} overlap={res.form['overlap']} "
        f"smooth={'on' if res.form['smooth'] else 'off'}"
    )
    assert (
        len(res.selection) == 16
        and res.selection[chosen] <= res.selection["mix=work anchor=dynamic overlap=roofline smooth=on"]
    )  # the default with an idle row, or clearly better
    assert any("cross-validation" in n for n in res.notes)
    # the targets' measurements away from their anchor cannot move the choice
    top = targets["sm_mhz"].max()
    noisy = targets.copy()
    away = noisy["sm_mhz"] != top
    noisy.loc[away, "time_s"] *= np.random.default_rng(0).uniform(0.5, 2.0, away.sum())
    again = fit_predict(bench, noisy, select=True)
    assert again.selection == res.selection and again.form == res.form
    bench.to_csv(tmp_path / "b.csv", index=False)
    targets.to_csv(tmp_path / "t.csv", index=False)
    out = _json(
        capsys,
        [
            "model",
            "fit",
            "--bench",
            str(tmp_path / "b.csv"),
            "--targets",
            str(tmp_path / "t.csv"),
            "--select",
            "--json",
        ],
    )
    assert out["form"] == res.form and out["selection"] == res.selection


def test_the_anchor_sets_the_work_energy_not_the_idle_power():
    from emo.model.shapes import energies

    t = np.array([[2.0, 1.5, 1.0]])  # a kernel's time at three clocks, reference last
    tb, p_run = t.copy(), np.array([50.0, 60.0, 80.0])
    eb = p_run * tb + np.array([[30.0, 40.0, 60.0]])  # one benchmark: running power plus work energy
    true = p_run * t + 1.5 * (eb - p_run * tb)  # the kernel does 1.5x that work per unit of the mix
    x = np.array([[1.0]])
    dyn = energies(x, t, tb, eb, p_run, true[:, 2], 2, "dynamic")
    np.testing.assert_allclose(dyn, true)
    whole = energies(x, t, tb, eb, p_run, true[:, 2], 2, "curve")  # k on the idle part too: off elsewhere
    assert whole[0, 2] == pytest.approx(true[0, 2]) and abs(whole[0, 0] - true[0, 0]) > 1.0


def test_a_form_replaces_the_default_only_when_clearly_better():
    from emo.model.select import clearly_better

    base = np.array([1.0, 1.2, 0.9, 1.1, 1.0, 1.3])
    rng = np.random.default_rng(0)
    assert not clearly_better(base + rng.normal(0, 0.05, 6) - 0.01, base)  # a smaller mean within the noise
    assert clearly_better(base - 0.2 + rng.normal(0, 0.02, 6), base)
    assert not clearly_better(base[:1] - 0.5, base[:1])  # one fold says nothing


def test_the_work_energy_anchor_needs_the_boards_power_measured(sim_ncu):
    bench, targets = sim_ncu
    noidle = bench[bench["name"] != "idle"]
    assert fit_predict(bench, targets).form["anchor"] == "dynamic"  # an idle row
    assert fit_predict(noidle, targets).form["anchor"] == "curve"  # idle estimated: the whole curve
    pairs = [("fp32_fma_low", "fp32_fma_high"), ("int32_low", "int32_high")]
    assert fit_predict(noidle, targets, pairs=pairs).form["anchor"] == "dynamic"  # P_run from the pairs
    sel = fit_predict(noidle, targets, select=True)
    assert len(sel.selection) == 8 and all("anchor=curve" in f for f in sel.selection)
