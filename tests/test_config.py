"""The schema checks every value when the configuration is composed (one line naming the key and its
allowed range), and holds the one copy of every default."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emo import config
from emo.workflow.plan import compose
from emo.workloads import discover, workload_kind

ROOT = Path(__file__).resolve().parents[1]

# (overrides, the key the message must name, a word of the allowed range): every case of issue 13
BAD = [
    ("budget=-0.1", "budget", "[0, 1)"),
    ("budget=1.5", "budget", "[0, 1)"),
    ("workload.tp=3", "workload.tp", "2, 4, 8"),
    ("workload.tp=0", "workload.tp", "2, 4, 8"),
    ("workload=pp workload.pp=0", "workload.pp", "2, 4, 8"),
    ("packing.delta_max_ms=0", "packing.delta_max_ms", "> 0"),
    ("gpu.seed=-1", "gpu.seed", ">= 0"),
    ("trace.seed=-1", "trace.seed", ">= 0"),
    ("gpu.counters=xyz", "gpu.counters", "ncu, dcgm, none"),
    ("model.level_fractions=[5]", "model.level_fractions", "(0, 1]"),
    ("optimizer=geepafs optimizer.geepafs.probe_fractions=[-1]", "optimizer.geepafs.probe_fractions", "(0, 1]"),
    ("optimizer.change_interval_ms=0", "optimizer.change_interval_ms", "> 0"),
    ("optimizer.change_interval_ms=5", "optimizer.change_interval_ms", "min_interval_ms"),
    ("trace.iterations=0", "trace.iterations", ">= 1"),
    ("validate.iterations=0", "validate.iterations", ">= 5"),
    ("gpu.backend=foo", "gpu.backend", "sim, nvml"),
    ("model.clocks_stride=0", "model.clocks_stride", ">= 1"),
    ("model.repeats=0", "model.repeats", ">= 1"),
    ("workload=pp workload.partition=weird", "workload.partition", "uniform, parameter"),
    ("results=", "results", "non-empty"),
    ("gpu.clocks_mhz=[]", "gpu.clocks_mhz", "ascending"),
    ("gpu.clocks_mhz=[900,600]", "gpu.clocks_mhz", "ascending"),
    ("gpu.default_mhz=1234", "gpu.default_mhz", "gpu.clocks_mhz"),
    ("optimizer.transition_ms=[15,5]", "optimizer.transition_ms", "min <= max"),
    ("optimizer.transition_ms=[5]", "optimizer.transition_ms", "min <= max"),
    ("optimizer.min_clock_fraction=1.5", "optimizer.min_clock_fraction", "[0, 1]"),
    ("workload.model.heads=0", "workload.model.heads", ">= 1"),
    ("workload.model.dtype=fp8", "workload.model.dtype", "bf16"),
    ("workload=command workload.nproc=0", "workload.nproc", ">= 1"),
    ("workload=recorded workload.path=", "workload.path", "non-empty"),
    ("optimizer.change_points=fixed", "optimizer.change_points", "passes, grid"),
    # keys that must agree with each other
    ("workload.chunks=3", "workload.chunks", "divisor of workload.model.batch (4)"),
    ("workload.model.vocab=50257", "workload.model.vocab", "divisible by workload.tp (2)"),
    ("workload=pp workload.microbatches=2", "workload.microbatches", ">= workload.pp (4)"),
    ("workload=offload workload.top_k=65", "workload.top_k", "<= workload.experts (64)"),
]


@pytest.mark.parametrize("overrides, key, allowed", BAD)
def test_a_value_out_of_range_is_one_line_naming_key_and_range(overrides, key, allowed):
    with pytest.raises(ValueError) as e:
        compose(overrides.split())
    msg = str(e.value)
    assert "\n" not in msg and f"{key} must be" in msg and allowed in msg, msg


def test_the_defaults_and_every_shipped_choice_pass():
    for overrides in (
        [],
        ["workload=pp"],
        ["workload=offload"],
        ["gpu=nvml", "workload=command"],
        ["gpu=h100"],
        ["gpu=v100"],
        ["gpu=rtx3080ti"],
        ["optimizer=static"],
        ["budget=0"],
    ):
        compose(overrides)


@pytest.mark.parametrize(
    "override, key",
    [
        ("+nosuchkey=1", "nosuchkey"),
        ("+workload.foo=2", "workload.foo"),
        ("++optimizer.zeus.steps=3", "optimizer.zeus.steps"),
    ],
)
def test_an_added_key_no_stage_reads_is_one_line(override, key):
    with pytest.raises(ValueError, match=rf"^bad configuration: {re.escape(key)} is not a key of the configuration$"):
        compose([override])


def test_a_home_path_hydra_quoted_is_the_home_not_a_folder_named_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = compose(["workload=recorded", 'workload.path="~/t.json"', 'results="~/r"'])
    assert (cfg["workload"]["path"], cfg["results"]) == (f"{tmp_path}/t.json", f"{tmp_path}/r")
    assert cfg["tracking"]["uri"] == f"sqlite:///{tmp_path}/r/mlflow.db"  # interpolated after


@pytest.mark.parametrize("override, key", [("~tracking", "tracking"), ("~budget", "budget")])
def test_a_key_an_override_removed_is_one_line(override, key):
    with pytest.raises(
        ValueError, match=rf"^bad configuration: {re.escape(override)}: {key} is required; set it instead$"
    ):
        compose([override])


@pytest.mark.parametrize(
    "override, says",
    [
        ("nosuchkey=1", "nosuchkey is not a key of the configuration"),
        ("budgte=0.1", "budgte is not a key of the configuration (did you mean budget?)"),
        ("budget=0.02,0.05", "budget=0.02,0.05: several values are a sweep; run it with -m"),
        (
            "workload.path=~/x.json",
            "workload.path=~/x.json: Hydra cannot parse this override; give the full path, or "
            "leave the ~ outside quotes for the shell to expand",
        ),
        ("budget=[1", "budget=[1: Hydra cannot parse this override; quote the value"),
    ],
)
def test_an_override_hydra_cannot_use_says_what_to_do(override, says):
    with pytest.raises(ValueError, match=rf"^bad configuration: {re.escape(says)}"):
        compose(["workload=recorded", override])


def test_unknown_group_choice_lists_the_choices():
    with pytest.raises(ValueError) as e:
        compose(["gpu=nosuch"])
    msg = str(e.value)
    assert "gpu/nosuch" in msg and "a100, h100, nvml, rtx3080ti, v100" in msg and "\n" not in msg
    assert "schema" not in msg and "provider" not in msg


def test_emo_run_dry_run_rejects_a_range_error_before_anything_runs(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "emo.cli", "run", "-n", "budget=1.5", f"results={tmp_path / 'r'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "budget must be in [0, 1)" in r.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / ".snakemake").exists()


def _defaults(schema) -> dict:
    out = {}
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
            out[f.name] = _defaults(type(v)) if dataclasses.is_dataclass(v) else v
    return out


def _repeats(values: dict, defaults: dict, prefix: str = "") -> list[str]:
    found = []
    for k, v in values.items():
        if k == "defaults" or k not in defaults:
            continue
        if isinstance(v, dict) and isinstance(defaults[k], dict):
            found += _repeats(v, defaults[k], f"{prefix}{k}.")
        elif v == defaults[k] and k != "kind":
            found.append(prefix + k)
    return found


@pytest.mark.parametrize(
    "path, schema",
    [("config.yaml", config.Config)] + [(f"workload/{k}.yaml", workload_kind(k).schema) for k in discover()],
)
def test_one_source_of_defaults_yaml_repeats_no_schema_default(path, schema):
    """A value typed both in a YAML file and in the schema drifts (model.min_seconds did: 1.0 vs 0.3)."""
    values = yaml.safe_load((ROOT / "conf" / path).read_text()) or {}
    assert _repeats(values, _defaults(schema)) == []


def test_the_schema_defaults_are_what_a_run_uses():
    cfg = compose([])
    assert cfg["model"] == _defaults(config.ModelConfig) and cfg["trace"] == _defaults(config.TraceConfig)
    assert cfg["budget"] == _defaults(config.Config)["budget"] and cfg["results"] == "results"


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["workload=pp", "workload.pp=8", "workload.partition=parameter", "optimizer=perseus", "budget=0"],
        ["gpu=h100", "gpu.seed=3", "workload=hybrid", "workload.tp=2", "workload.pp=2", "workload.dp=2"],
        ["budget=0.05", "workload=offload", "optimizer=geepafs", "optimizer.budget_solves=3"],
        ["optimizer.transition_ms=[5,15]", "++budget=0.03", "hydra.job.name=x", "workload.tp=4"],
    ],
)
def test_compose_is_hydras_composition_whatever_was_cached_before(overrides):
    # the merged group choices are cached: composing other jobs first must not change this one
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from emo.workflow.plan import ROOT

    for other in (["budget=0.04", "gpu.seed=1"], ["workload=pp", "workload.pp=2"], overrides):
        compose(other)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        plain = OmegaConf.to_container(hydra_compose(config_name="config", overrides=overrides), resolve=True)
    assert compose(overrides) == plain
    assert compose(overrides) == plain  # and a second time, from the cache
