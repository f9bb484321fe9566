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


@pytest.mark.parametrize("name", ["slurm", "kubernetes"])
def test_the_cluster_profiles_parse_without_their_plugins(name, tmp_path, monkeypatch, capfd):
    """Where neither SLURM nor Kubernetes nor their plugins are installed (this development machine):
    every key of the profile but the executor and the plugin's own `<name>-*` settings is one
    Snakemake's own parser accepts, and with the executor left out the SLURM profile plans a sampled
    1,024-GPU job's DAG (a dry run: nothing submitted, nothing run; the Kubernetes one would need the
    S3 storage plugin for that)."""
    import yaml

    profile = yaml.safe_load((ROOT / "profiles" / name / "config.yaml").read_text())
    plugin = {k for k in profile if k == "executor" or k.startswith(f"{name}-")}
    assert plugin and profile["executor"] == name
    local = tmp_path / name
    local.mkdir()
    (local / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in profile.items() if k not in plugin}))
    from snakemake.cli import parse_args

    _, args = parse_args(["--snakefile", str(ROOT / "Snakefile"), "--workflow-profile", str(local)])
    assert args.executor is None and args.default_resources
    if name == "kubernetes":  # its stage folders go through S3: a dry run needs the storage plugin too
        assert args.default_storage_provider == "s3"
        return
    monkeypatch.chdir(tmp_path)
    job = ["workload=hybrid", "workload.tp=8", "workload.pp=8", "workload.dp=16", "workload.microbatches=8"]
    job.append("trace.ranks=replica")
    assert cli_main(["run", "-n", "--profile", str(local), f"results={tmp_path / 'results'}", *job]) == 0
    out = capfd.readouterr().out
    assert "optimize" in out and "validate" in out
