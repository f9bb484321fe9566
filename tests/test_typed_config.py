"""Configuration sections are typed at the library boundaries (emo.config.typed).

The rule the walk below checks: in emo/, outside the code that holds the composed configuration as
plain data (emo/stages/ and emo/workflow/: it is hashed and handed over by Snakemake; emo/config.py
and emo/schema.py: they check it; emo/workloads/: the workload section, whose schema is its kind's,
stays a dict; emo/device/sim/: the virtual GPU reads its plain config), no function parameter and no
dataclass field named like a configuration section (CONFIG_NAMES: the names the code gives a
section, `cfg`, `opt`, `gpu_cfg`, `tracking_cfg`, ...) is annotated `dict`, `Mapping` or `Any`,
alone or in a union: it takes the section's dataclass (GpuConfig, OptimizerConfig, ZeusOptions, ...,
Config). `**kwargs` are not sections. PLAIN lists the few parameters that take the plain section on
purpose, each with its reason.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from emo.config import (
    Config,
    GpuConfig,
    OptimizerConfig,
    TrackingConfig,
    ValidateConfig,
    ZeusOptions,
    typed,
)
from emo.errors import ConfigError

EMO = Path(__file__).resolve().parents[1] / "emo"
OUTSIDE = ("stages/", "workflow/", "device/sim/", "workloads/", "config.py", "schema.py")
CONFIG_NAMES = {
    "cfg",
    "config",
    "opt",
    "opts",
    "opt_cfg",
    "ocfg",
    "vcfg",
    "options",
    "optimizer",
    "gpu",
    "gpu_cfg",
    "tracking",
    "tracking_cfg",
    "model_cfg",
    "trace_cfg",
}
UNTYPED = {"dict", "Dict", "Mapping", "MutableMapping", "Any"}
PLAIN = {
    # opening a device takes the section as composed: the virtual GPU reads its plain config
    ("device/backends.py", "open_device", "gpu_cfg"),
    ("device/nvml.py", "__init__", "gpu_cfg"),
}


def untyped(annotation: ast.expr | None) -> bool:
    """dict, Mapping or Any (bare, subscripted, dotted, or one member of a union)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return untyped(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return untyped(annotation.left) or untyped(annotation.right)
    if isinstance(annotation, ast.Subscript):
        name = annotation.value
        if isinstance(name, ast.Name | ast.Attribute) and _name(name) in ("Optional", "Union"):
            inner = annotation.slice
            members = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            return any(untyped(m) for m in members)
        return untyped(name)
    return isinstance(annotation, ast.Name | ast.Attribute) and _name(annotation) in UNTYPED


def _name(node: ast.Name | ast.Attribute) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr


def violations(root: Path = EMO) -> list[str]:
    """file:line function(parameter: annotation) of every section parameter the rule refuses."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(OUTSIDE):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]  # *args and **kwargs carry no section
                where = node.name
            elif isinstance(node, ast.ClassDef):  # a dataclass's fields (PlanContext.opt, ...)
                params = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                where = node.name
            else:
                continue
            for p in params:
                name = p.arg if isinstance(p, ast.arg) else p.target.id  # type: ignore[union-attr]
                if name in CONFIG_NAMES and untyped(p.annotation) and (rel, where, name) not in PLAIN:
                    found.append(f"emo/{rel}:{p.lineno} {where}({name}: {ast.unparse(p.annotation)})")
    return found


def test_no_library_function_takes_a_config_section_as_a_plain_dict():
    assert violations() == []


def test_the_walk_finds_a_plain_section(tmp_path):
    (tmp_path / "lib.py").write_text(
        "from typing import Any, Mapping\n"
        "def a(cfg: dict, n: int): ...\n"
        "def b(opt: 'dict | None' = None): ...\n"
        "def c(gpu: GpuConfig, options: Mapping[str, Any]): ...\n"
        "def d(x: dict, **options: Any): ...\n"
        "class Ctx:\n    opt: Any\n    name: dict\n"
    )
    assert [v.split(" ", 1)[1] for v in violations(tmp_path)] == [
        "a(cfg: dict)",
        "b(opt: 'dict | None')",
        "c(options: Mapping[str, Any])",
        "Ctx(opt: Any)",
    ]


def test_a_missing_key_takes_the_schema_default_and_sections_nest():
    opt = typed(OptimizerConfig, {"name": "zeus", "zeus": {"pl_step_w": 5}})
    assert opt.name == "zeus" and opt.budget_solves == OptimizerConfig().budget_solves
    assert isinstance(opt.zeus, ZeusOptions) and opt.zeus.pl_step_w == 5
    assert opt.zeus.max_steps == ZeusOptions().max_steps and opt.geepafs == OptimizerConfig().geepafs
    assert typed(OptimizerConfig, opt) is opt  # already typed: as it is


def test_an_unknown_key_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"^bad configuration: optimizer\.budget_solvs is not a key"):
        typed(OptimizerConfig, {"budget_solvs": 3})
    with pytest.raises(ConfigError, match=r"optimizer\.zeus\.pl_step is not a key"):
        typed(OptimizerConfig, {"zeus": {"pl_step": 5}})
    with pytest.raises(ConfigError, match=r"^bad configuration: gpu\.default_mhz is required"):
        typed(GpuConfig, {"name": "a100", "tdp_w": 400.0})


def test_the_composed_configuration_types_whole_and_keeps_the_workload_a_dict():
    from emo.workflow.plan import compose

    cfg = compose(["workload=pp", "workload.pp=2"])
    c = typed(Config, cfg)
    assert isinstance(c.gpu, GpuConfig) and isinstance(c.tracking, TrackingConfig)
    assert c.workload == cfg["workload"] and isinstance(c.workload, dict)
    for name in ("gpu", "optimizer", "trace", "model", "validate", "tracking", "packing"):
        assert dataclasses.asdict(getattr(c, name)) == cfg[name]  # nothing lost, in the same key order
        assert list(dataclasses.asdict(getattr(c, name))) == list(cfg[name])


def test_a_stage_handed_some_sections_reads_no_default_of_the_others():
    """A stage is handed only the sections its hash covers (emo.stages): typed leaves the rest None,
    so a library that reads one fails instead of silently reading the schema's default."""
    from emo.workflow.plan import compose

    cfg = compose([])
    c = typed(Config, {k: cfg[k] for k in ("gpu", "workload", "budget", "validate")})
    assert isinstance(c.validate, ValidateConfig) and c.budget == cfg["budget"] and c.workload == cfg["workload"]
    assert c.trace is None and c.optimizer is None and c.results is None
    with pytest.raises(AttributeError):
        c.model.level_fractions  # noqa: B018
