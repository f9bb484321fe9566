"""docs/workloads.md's recipe for a new kind, followed as written: a module `emo/workloads/<kind>.py`
(its SCHEMA, rules, label and build) and `conf/workload/<kind>.yaml`, and nothing registered by hand.
The module lies in a folder added to the package's search path (emo.workloads.__path__), so it is
`emo.workloads.toy` as a file in emo/workloads/ would be, without writing into the source tree."""

from __future__ import annotations

import shutil
import sys

import pandas as pd
import pytest

import emo.workloads
from emo.cli.compare import runs_table
from emo.workflow.plan import ROOT, compose
from emo.workflow.tracking import flatten
from emo.workloads import _REGISTRY, build_program

TOY = '''"""toy: tp's program at a toy size, one small layer."""

from dataclasses import dataclass, field

from emo.schema import WorkloadConfig, at_least, bad, one_of
from emo.workloads import tp
from emo.workloads.transformer import TransformerShape


@dataclass
class ToyWorkload(WorkloadConfig):
    kind: str = "toy"
    tp: int = field(default=2, metadata=one_of(2, 4))
    heads: int = field(default=8, metadata=at_least(1))


SCHEMA = ToyWorkload


def rules(w: dict) -> None:
    if w["heads"] % w["tp"]:
        bad("workload.heads", f"divisible by workload.tp ({w['tp']})", w["heads"])


def label(params: dict) -> str:
    return f"toy TP{params.get('tp', '?')}"


def build(w, arch):
    shape = TransformerShape(layers=1, hidden=1024, heads=w.heads, seq=512, batch=2)
    return tp.build(tp.TPWorkload(tp=w.tp, model=shape), arch)
'''

YAML = """# A toy TP job: tp's program, one small layer.
defaults:
  - toy_schema
  - _self_
"""


@pytest.fixture
def conf(tmp_path, monkeypatch):
    """A conf/ with workload/toy.yaml, and emo/workloads/toy.py on the package's path."""
    modules = tmp_path / "workloads"
    modules.mkdir()
    (modules / "toy.py").write_text(TOY)
    monkeypatch.setattr(emo.workloads, "__path__", [*emo.workloads.__path__, str(modules)])
    out = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", out)
    (out / "workload" / "toy.yaml").write_text(YAML)
    yield out
    _REGISTRY.pop("toy", None)
    sys.modules.pop("emo.workloads.toy", None)


def test_a_new_kind_composes_checks_builds_and_traces_as_the_docs_say(conf, tmp_path, run_stage):
    cfg = compose(["workload=toy", "tracking.enabled=false", "trace.iterations=2"], config_dir=conf)
    assert cfg["workload"] == {"kind": "toy", "tp": 2, "heads": 8}
    with pytest.raises(ValueError, match=r"workload.tp must be one of 2, 4 \(got 8\)"):  # its schema's ranges
        compose(["workload=toy", "workload.tp=8"], config_dir=conf)
    with pytest.raises(ValueError, match=r"workload.heads must be divisible by workload.tp \(4\) \(got 6\)"):
        compose(["workload=toy", "workload.tp=4", "workload.heads=6"], config_dir=conf)  # its rules
    from emo.workloads import kind_of  # the workload objects (absent before them: the test fails at compose)

    assert kind_of(cfg["workload"]).synthetic and build_program(cfg["workload"]).ranks == 2
    run_stage("trace", cfg, {}, tmp_path / "trace")
    events = pd.read_parquet(tmp_path / "trace/events.parquet")
    assert sorted(events["rank"].unique()) == [0, 1]


def test_emo_compare_labels_a_new_kind_by_its_own_label(conf):
    cfgs = [compose(["workload=toy", *extra], config_dir=conf) for extra in ([], ["workload.tp=4"])]
    runs = pd.DataFrame(
        [{"run_id": str(i), **{f"params.{k}": v for k, v in flatten(c).items()}} for i, c in enumerate(cfgs)]
    )
    assert list(runs_table(runs)["workload"]) == ["toy TP2", "toy TP4"]


def test_a_kind_without_a_label_is_named_by_its_keys_away_from_their_defaults(conf, monkeypatch):
    from emo.workloads import kind_of

    cfg = compose(["workload=toy", "workload.tp=4", "workload.heads=16"], config_dir=conf)
    monkeypatch.delattr(sys.modules["emo.workloads.toy"], "label")
    _REGISTRY.pop("toy")
    assert kind_of(cfg["workload"]).label(flatten(cfg["workload"])) == "toy heads=16 tp=4"
