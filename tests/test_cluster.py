"""A sweep through Snakemake's cluster-generic executor, end to end: every rule is submitted to
profiles/cluster-generic/submit.sh (a detached job on this machine), polled with status.sh, and the
results and MLflow runs are what a local run gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emo.cli import main as cli_main

pytest.importorskip(
    "snakemake_executor_plugin_cluster_generic",
    reason="pip install snakemake-executor-plugin-cluster-generic (the test extra has it)",
)

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "workload=tp",
    "workload.tp=2",
    "workload.model.layers=1",
    "model.clocks_stride=8",
    "model.repeats=1",
    "model.min_seconds=0.2",
    "trace.iterations=2",
    "validate.min_seconds=0.5",
]


@pytest.mark.slow
def test_a_sweep_runs_through_the_cluster_generic_executor(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    assert (
        cli_main(["run", "--profile", "cluster-generic", "-m", f"results={results}", *SMALL, "optimizer=emo,zeus"]) == 0
    )
    out = capfd.readouterr().out
    assert len([ln for ln in out.splitlines() if ln.startswith("emo: optimizer=")]) == 2
    submitted = sorted((tmp_path / ".snakemake" / "cluster-generic").glob("*.rc"))
    # every rule but `all` went through submit.sh: calibrate, trace, graph, pack, profile, fit, optimize, 2 validate, summary
    assert len(submitted) == 10 and all(p.read_text().strip() == "0" for p in submitted)
    results_json = sorted(results.glob("validate/*/result.json"))
    assert {json.loads(p.read_text())["method"] for p in results_json} == {"emo", "zeus"}

    from emo.workflow.tracking import search

    df = search(f"sqlite:///{results}/mlflow.db", "emo")
    children = df[df["tags.mlflow.parentRunId"].notna()]
    assert len(df) == 3 and len(children) == 2 and children["metrics.validate.es_pct"].notna().all()


def test_an_unknown_profile_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["run", "--profile", "nosuch", "tracking.enabled=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--profile nosuch: no such workflow profile" in err and "slurm" in err


def profile_args(name: str):
    """The workflow profile as Snakemake itself reads it: its parser rejects a key that is neither one
    of its own options nor a setting of an installed plugin (`unrecognized arguments: --key`)."""
    from snakemake.cli import parse_args

    _, args = parse_args(["--snakefile", str(ROOT / "Snakefile"), "--workflow-profile", str(ROOT / "profiles" / name)])
    return args


@pytest.mark.parametrize("name", ["default", "cluster-generic", "slurm", "kubernetes"])
def test_every_profile_is_one_snakemake_accepts(name):
    plugin = {"slurm": "snakemake_executor_plugin_slurm", "kubernetes": "snakemake_executor_plugin_kubernetes"}.get(
        name
    )
    if plugin:
        pytest.importorskip(plugin, reason=f"pip install 'emo[{name}]': its keys are the plugin's settings")
    if name == "kubernetes":
        pytest.importorskip(
            "snakemake_storage_plugin_s3", reason="pip install 'emo[kubernetes]' (the S3 storage plugin)"
        )
    args = profile_args(name)
    assert args.executor == (None if name == "default" else name)
    if name == "kubernetes":
        # what the plugin reads: the namespace setting, the image, the bucket (pods share no disk), and
        # gpu_manufacturer, without which it refuses every rule that asks for a GPU
        assert args.kubernetes_namespace == "default" and args.container_image
        assert args.default_storage_provider == "s3" and args.default_storage_prefix.startswith("s3://")
        assert args.default_resources["gpu_manufacturer"].raw == "nvidia"
