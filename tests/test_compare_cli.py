"""`emo compare`: the ES/PL table and the plots, read back from an MLflow store the way `emo run` fills it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from emo.cli import main as cli_main
from emo.cli.compare import table, workload_label
from emo.io import write_json
from emo.workflow import tracking
from emo.workflow.plan import compose, plan
from emo.workflow.sweep import Job

CELLS = {  # (workload.tp, method, budget) -> (es %, pl %)
    (2, "emo", 0.02): (20.0, 1.8),
    (2, "static", 0.02): (6.0, 1.9),
    (2, "zeus", 0.02): (3.0, 1.2),
    (4, "emo", 0.05): (25.0, 4.6),
    (4, "geepafs", 0.05): (9.0, 5.2),
}


def fake_job(results, overrides, es, pl, pareto=False):
    """A job whose validate folder holds a result (as a finished stage leaves it)."""
    cfg = compose([*overrides, f"results={results}"])
    job = Job(tuple(overrides), cfg, plan(cfg), " ".join(overrides))
    t_ori, e_ori = 0.2, 150.0
    metrics = {
        "es_pct": es,
        "pl_pct": pl,
        "t_ori_s": t_ori,
        "e_ori_j": e_ori,
        "t_opt_s": t_ori * (1 + pl / 100),
        "e_opt_j": e_ori * (1 - es / 100),
    }
    vdir = job.plans["validate"].dir
    vdir.mkdir(parents=True)
    write_json(vdir / "metrics.json", metrics)
    write_json(
        vdir / "result.json", {"method": cfg["optimizer"]["name"], "gpu": cfg["gpu"]["name"], "metrics": metrics}
    )
    write_json(
        vdir / "config.json", {"stage": "validate", "hash": job.plans["validate"].hash, "covers": {"inputs": {}}}
    )
    if pareto:
        pd.DataFrame(
            {"sm_mhz": [1005, 1200, 1410], "time_s": [0.27, 0.23, 0.2], "energy_j": [105.0, 118.0, 150.0]}
        ).to_parquet(vdir / "pareto.parquet")
    return job


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    jobs = [
        fake_job(
            results, [f"workload.tp={tp}", f"optimizer.name={method}", f"budget={budget}"], es, pl, method == "static"
        )
        for (tp, method, budget), (es, pl) in CELLS.items()
    ]
    tracking.log_sweep(jobs, None)  # as plain `snakemake` logs when its run ends
    return results


def test_compare_prints_the_table_and_writes_plots(store, tmp_path, capsys):
    rc = cli_main(
        [
            "compare",
            "--uri",
            f"sqlite:///{store}/mlflow.db",
            "--experiment",
            "emo",
            "--plots",
            str(tmp_path / "plots"),
            "--csv",
            str(tmp_path / "runs.csv"),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "TP2" in out and "TP4" in out
    assert "20.0/1.8" in out and " 6.0/1.9" in out and "25.0/4.6" in out
    header = out.splitlines()[0]
    assert header.index("emo") < header.index("static") < header.index("zeus") < header.index("geepafs")
    # the static cell is the best clock of its curve, not the static run's own line: said beneath the table
    assert out.splitlines()[-1].startswith("static: the best clock the static run's validate measured")
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["energy_time_a100_tp2.png", "energy_time_a100_tp4.png"]
    assert len(pd.read_csv(tmp_path / "runs.csv")) == len(CELLS)


def test_latest_run_of_a_cell_wins():
    runs = pd.DataFrame(
        [
            {
                "run_id": "new",
                "workload": "TP2",
                "method": "emo",
                "budget": 0.02,
                "gpu": "a100",
                "es_pct": 21.0,
                "pl_pct": 1.0,
            },
            {
                "run_id": "h100",
                "workload": "TP2",
                "method": "emo",
                "budget": 0.02,
                "gpu": "h100",
                "es_pct": 9.0,
                "pl_pct": 1.0,
            },
            {
                "run_id": "old",
                "workload": "TP2",
                "method": "emo",
                "budget": 0.02,
                "gpu": "a100",
                "es_pct": 5.0,
                "pl_pct": 1.0,
            },
        ]
    )
    assert table(runs).loc[("a100", "TP2", 0.02), "emo"] == "21.0/1.0"


def test_seeds_give_mean_and_spread_the_measured_static_curve_and_the_margin(tmp_path):
    """Three seeds per method: cells are mean±sd; static is the best measured clock within budget
    + 0.5 % from its curve (not its own pick); EMO's margin is over that curve at EMO's own PL."""
    from emo.cli.compare import results_rows, static_points

    results = tmp_path / "results"
    jobs = []
    for seed, (es, pl) in enumerate([(10.0, 1.0), (11.0, 1.2), (12.0, 1.1)]):
        jobs.append(
            fake_job(results, ["workload.tp=2", "optimizer.name=emo", "budget=0.02", f"gpu.seed={seed}"], es, pl)
        )
        jobs.append(
            fake_job(
                results,
                ["workload.tp=2", "optimizer.name=static", "budget=0.02", f"gpu.seed={seed}"],
                1.0,
                0.5,
                pareto=True,
            )
        )
    runs = results_rows([(j.cfg, str(j.plans["validate"].dir)) for j in jobs])
    assert sorted(runs["seed"]) == [0, 0, 1, 1, 2, 2]
    t = table(runs, static_points(runs, results))
    row = t.loc[("a100", "TP2", 0.02)]
    assert row["emo"] == "11.0±1.0/1.1±0.1"
    assert row["static"] == "1.0±0.0/0.5±0.0"  # nothing on the curve (PL 15 %, 35 %) fits in 2.5 %
    # the curve: (0, 0), (0.5, 1) from static's own pick, then (15, 21.3): at PL ~1.1 it gives ~1.4
    margin = float(row["EMO - static curve"].split("±")[0])
    assert 9.0 < margin < 10.0
    assert row["EMO ahead"] == "yes" and row["seeds"] == 3


def test_two_gpus_are_two_rows_and_two_plots(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    jobs = [
        fake_job(results, ["workload=offload", "optimizer.name=emo"], 30.0, 0.1),
        fake_job(results, ["gpu=h100", "workload=offload", "optimizer.name=emo"], 25.0, 0.2),
    ]
    tracking.log_sweep(jobs, None)
    assert cli_main(["compare", "--uri", f"sqlite:///{results}/mlflow.db", "--plots", str(tmp_path / "plots")]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "offload" in ln]
    assert (
        len(rows) == 2
        and any("a100" in r and "30.0" in r for r in rows)
        and any("h100" in r and "25.0" in r for r in rows)
    )
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "energy_time_a100_offload.png",
        "energy_time_h100_offload.png",
    ]


def test_workload_labels():
    assert workload_label({"workload.kind": "tp", "workload.tp": "8"}) == "TP8"
    assert (
        workload_label({"workload.kind": "pp", "workload.pp": "4", "workload.partition": "parameter"})
        == "PP4 parameter"
    )
    assert workload_label({"workload.kind": "offload"}) == "offload"


def test_compare_without_a_store_is_one_line(tmp_path, capsys):
    rc = cli_main(["compare", "--uri", f"sqlite:///{tmp_path}/none.db", "--experiment", "emo"])
    assert rc == 2 and "no MLflow store" in capsys.readouterr().err


def test_a_cell_says_how_many_seeds_and_gives_no_verdict_without_a_baseline():
    runs = pd.DataFrame(
        [
            {
                "run_id": str(s),
                "workload": "TP2",
                "method": "emo",
                "budget": 0.02,
                "gpu": "a100",
                "seed": s,
                "es_pct": 5.0 + s,
                "pl_pct": 1.0,
            }
            for s in range(3)
        ]
    )
    row = table(runs).loc[("a100", "TP2", 0.02)]
    assert row["seeds"] == 3 and row["emo"] == "6.0±1.0/1.0±0.0"
    assert row["EMO ahead"] == "- (no baseline measured)"


def recorded_result(job, **pred):
    """What validate leaves for a recorded trace: no measurement, the prediction."""
    write_json(
        job.plans["validate"].dir / "result.json",
        {"skipped": "validate: skipped: a recorded trace cannot be re-run", "method": "emo", **pred},
    )


def test_the_summary_leaves_out_unmeasured_jobs_and_names_a_result_cut_short(tmp_path):
    import re

    from emo.cli.compare import write_summary

    results = tmp_path / "results"
    measured = fake_job(results, ["optimizer.name=emo"], 10.0, 1.0)
    rec = fake_job(results, ["optimizer.name=emo", "budget=0.05"], 0.0, 0.0)
    recorded_result(rec, predicted_es_pct=3.0, predicted_pl_pct=1.0)
    jobs = [(j.name, j.cfg, str(j.plans["validate"].dir)) for j in (measured, rec)]
    write_summary(jobs, tmp_path / "summary")
    assert list(pd.read_csv(tmp_path / "summary/jobs.tsv", sep="\t")["budget"]) == [0.02]
    write_summary(jobs[1:], tmp_path / "only_recorded")  # nothing measured: empty tables, no plots
    assert pd.read_csv(tmp_path / "only_recorded/jobs.tsv", sep="\t").empty

    res = measured.plans["validate"].dir / "result.json"
    res.write_text(res.read_text()[:40])
    with pytest.raises(ValueError, match=f"^{re.escape(str(res))}: not a complete result"):
        write_summary(jobs, tmp_path / "summary")


def test_each_job_gets_a_line_saying_what_it_has(tmp_path):
    from emo.workflow.sweep import result_line

    results = tmp_path / "results"
    measured = fake_job(results, ["optimizer.name=zeus"], 10.0, 1.0)
    assert result_line(measured).endswith(
        f"zeus on a100, budget 2 %: ES 10.00 %, PL 1.00 %; online zeus, result {measured.result}"
    )
    rec = fake_job(results, ["optimizer.name=emo", "budget=0.05"], 0.0, 0.0)
    recorded_result(rec, predicted_es_pct=3.0, predicted_pl_pct=1.25)
    assert result_line(rec).endswith(
        "emo on a100, budget 5 %: not measured (a recorded trace cannot be re-run); "
        f"predicted ES 3.00 %, PL 1.25 % (a prediction); result {rec.result}"
    )
    # with the graph stage's summary: how much of the critical path is GPU, and a warning when it is little
    graph = rec.plans["graph"].dir
    graph.mkdir(parents=True)
    gpu_bound = {"gpu_compute": 800.0, "memcpy": 50.0, "communication": 50.0, "cpu": 100.0}
    write_json(graph / "summary.json", {"critical_path_us": 1000.0, "breakdown_us": gpu_bound})
    assert "PL 1.25 % (a prediction, the GPU 90.0 % of the critical path); result" in result_line(rec)
    cpu_bound = {"gpu_compute": 35.0, "memcpy": 6.0, "communication": 10.0, "cpu": 11521.0, "start_offset": 7513.0}
    write_json(graph / "summary.json", {"critical_path_us": 20866.0, "breakdown_us": cpu_bound})  # dlrm_8rank's
    assert (
        "(a prediction, the GPU 0.2 % of the critical path; warning: the GPU is a small share, the path is "
        "mostly cpu: the saving is the model's alone, measure it on the GPU before counting on it)"
    ) in result_line(rec)
    recorded_result(rec)
    assert "; no prediction; " in result_line(rec)
    Path(rec.result).write_text('{"skipped": ')
    assert f"{rec.result}: not a complete result" in result_line(rec)

    cfg = compose(["budget=0.1", f"results={results}"])
    fresh = Job(("budget=0.1",), cfg, plan(cfg), "budget=0.1")
    assert result_line(fresh) == (
        "emo: budget=0.1: no result (stages done: none; not done: " + ", ".join(fresh.plans) + ")"
    )


def test_the_result_lines_come_also_when_mlflow_fails(tmp_path, capsys):
    from emo.workflow import sweep

    results = tmp_path / "results"
    fake_job(results, ["optimizer.name=zeus"], 10.0, 1.0)
    sw = sweep.build([["optimizer.name=zeus", f"results={results}"]])
    (results / "mlflow.db").write_text("not a database")
    with pytest.raises(ValueError, match=r"mlflow.db: the MLflow store failed: file is not a database"):
        sweep.finish(sw, None)
    assert "ES 10.00 %, PL 1.00 %" in capsys.readouterr().out


def test_a_csv_that_cannot_be_written_is_one_line(store, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    rc = cli_main(["compare", "--uri", f"sqlite:///{store}/mlflow.db", "--csv", str(tmp_path / "afile" / "runs.csv")])
    err = capsys.readouterr().err
    assert (
        rc == 2
        and err.startswith(f"emo: error: --csv {tmp_path / 'afile' / 'runs.csv'}: cannot write (")
        and err.count("\n") == 1
    ), err
    rc = cli_main(["compare", "--uri", f"sqlite:///{store}/mlflow.db", "--csv", str(tmp_path / "new" / "runs.csv")])
    assert rc == 2 and not (tmp_path / "new").exists()  # a missing folder is not made (a typo is not a new tree)
    (tmp_path / "new").mkdir()
    assert (
        cli_main(["compare", "--uri", f"sqlite:///{store}/mlflow.db", "--csv", str(tmp_path / "new" / "runs.csv")]) == 0
    )
    assert len(pd.read_csv(tmp_path / "new" / "runs.csv")) == len(CELLS)


def test_a_failed_run_prints_no_earlier_result(tmp_path, capsys, monkeypatch):
    """Issue 36: after a failed re-run, the previous run's ES/PL and policy were printed (exit 1)."""
    from emo.workflow import sweep

    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    fake_job(results, ["workload.tp=2"], 10.0, 1.0)
    fake_job(results, ["workload.tp=4"], 12.0, 1.0)
    sw = sweep.build(
        [
            ["workload.tp=2", f"results={results}", "tracking.enabled=false"],
            ["workload.tp=4", f"results={results}", "tracking.enabled=false"],
        ]
    )
    tp2 = next(j for j in sw.jobs if "workload.tp=2" in j.overrides)
    sweep.finish(sw, "s", error="x: bad (stage fit, log l)", failed=[tp2.plans["fit"].dir])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("no result: this run failed (an earlier run's result is not shown)") and "ES" not in out[0]
    assert "ES 12.00 %" in out[1]  # the other job did not depend on the failing folder
    sweep.finish(sw, "s", error="pipeline failed")  # which folder failed is unknown: no job shows a result
    assert "ES" not in capsys.readouterr().out


def test_a_cut_short_result_is_an_error_and_an_over_budget_result_is_flagged(tmp_path):
    from emo.workflow import sweep

    results = tmp_path / "results"
    over = fake_job(results, ["workload=pp", "budget=0.02"], 20.0, 2.8)
    assert "PL 2.80 % OVER BUDGET (PL 2.80 % > 2 % + 0.5 tolerance)" in sweep.result_line(over)
    ok = fake_job(results, ["workload=pp", "budget=0.05"], 20.0, 2.8)
    assert "OVER BUDGET" not in sweep.result_line(ok)
    Path(ok.result).write_text('{"metrics": {"es')
    assert sweep.result_line(ok).startswith("emo: error: workload=pp budget=0.05: ")
    sw = sweep.build([["workload=pp", "budget=0.05", f"results={results}"]])
    assert sweep.unreadable_results(sw) and "not a complete result" in sweep.unreadable_results(sw)[0]


def test_each_budget_is_scored_against_its_own_static_run_and_one_seed_says_so():
    """Issue 36: the static curve was keyed by seed only, so a 5 % cell showed the 2 % run's static."""
    from emo.cli.compare import table

    def curve(own_es, own_pl):  # the clocks both runs measured, and each run's own pick (sm_mhz -1)
        return pd.DataFrame({"sm_mhz": [1005, 1200, -1], "pl_pct": [9.0, 1.5, own_pl], "es_pct": [20.0, 4.0, own_es]})

    rows = [
        dict(
            gpu="a100",
            workload="TP4",
            method="static",
            budget=0.05,
            seed=0,
            validate_hash="s5",
            es_pct=10.45,
            pl_pct=5.03,
        ),
        dict(
            gpu="a100", workload="TP4", method="static", budget=0.02, seed=0, validate_hash="s2", es_pct=4.0, pl_pct=1.5
        ),
        dict(gpu="a100", workload="TP4", method="emo", budget=0.02, seed=0, validate_hash="e2", es_pct=6.0, pl_pct=1.8),
        dict(
            gpu="a100", workload="TP4", method="emo", budget=0.05, seed=0, validate_hash="e5", es_pct=12.0, pl_pct=4.9
        ),
    ]
    runs = pd.DataFrame(rows)
    t = table(runs, {"s2": curve(4.0, 1.5), "s5": curve(10.45, 5.03)})
    five = t.loc[("a100", "TP4", 0.05)]
    assert five["static"] == "10.4/5.0"  # its own run's pick (was 4.0/1.5 of the 2 % run's curve)
    assert five["EMO ahead"].endswith("(n = 1 seed: no spread)")


def test_compare_and_plots_do_not_import_each_other_both_ways():
    """emo.cli.compare draws with emo.report.plots; emo.report.plots reads runs and stage folders through emo.report.runs, never
    through emo.cli.compare (the two used to import each other)."""
    import ast

    import emo.report.plots

    src = ast.parse(Path(emo.report.plots.__file__).read_text())
    imported = {n.module for n in ast.walk(src) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(src) if isinstance(n, ast.Import) for a in n.names}
    assert "emo.cli.compare" not in imported and "emo.report.runs" in imported


def test_energy_time_points_are_seed_means_with_their_spread():
    from emo.report.plots import point_label, seed_points

    runs = pd.DataFrame(
        {
            "method": ["emo"] * 3 + ["static"],
            "budget": [0.02] * 4,
            "t_opt_s": [0.100, 0.102, 0.104, 0.101],
            "e_opt_j": [10.0, 12.0, 14.0, 11.0],
            "es_pct": [20.0, 18.0, 16.0, 19.0],
            "pl_pct": [1.0, 2.0, 3.0, 1.5],
        }
    )
    pts = seed_points(runs).set_index("method")
    assert pts.loc["emo", "seeds"] == 3 and pts.loc["emo", "e_j"] == pytest.approx(12.0)
    assert pts.loc["emo", "e_sd"] == pytest.approx(2.0) and pts.loc["emo", "t_sd"] == pytest.approx(2.0)  # ms
    assert pts.loc["static", "e_sd"] == 0.0  # one seed: no spread, no bar
    assert point_label(pts.reset_index().iloc[0]) == "emo, budget 2%: ES 18.0±2.0 %, PL 2.0±1.0 % (3 seeds)"
    assert point_label(pts.reset_index().iloc[1]) == "static, budget 2%: ES 19.0 %, PL 1.5 %"


def test_a_timeline_of_one_clock_is_not_drawn():
    import numpy as np

    from emo.report.plots import Timeline

    def tl(clocks):
        return Timeline(pd.DataFrame(), pd.DataFrame(), clocks, 0.0, 1.0, 0, 0.1, None, (705.0, 1410.0))

    assert tl({0: (np.r_[0.0, 1.0], np.r_[1410, 1410]), 1: (np.r_[0.0, 1.0], np.r_[1410, 1410])}).single_clock()
    assert not tl({0: (np.r_[0.0, 1.0], np.r_[1410, 1410]), 1: (np.r_[0.0, 1.0], np.r_[1005, 1005])}).single_clock()
    assert not tl({0: (np.r_[0.0, 0.5, 1.0], np.r_[1410, 990, 990])}).single_clock()
