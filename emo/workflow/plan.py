"""Compose the configuration and plan the content-hashed stage folders (docs/design.md §4).

Each stage's folder is `results/<stage>/<hash>/`, the hash covering exactly the configuration the stage
depends on, its inputs' hashes and a digest of the code that computes it. The chain is computable before
anything runs, so Snakemake knows every path at parse time: changing the workload moves trace and all
after it to new folders but keeps the calibration; changing the budget moves only optimize and validate.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import json
import os
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from emo.errors import ConfigError
from emo.paths import PACKAGE_PARENT, ROOT  # the pipeline's files; where the package's sources are
from emo.stages import STAGES, declaration  # what each stage reads and writes: the stages own it

SOURCE_SUFFIXES = {".py", ".cu", ".cuh", ".yaml"}
MODULE_NAME = re.compile(r"emo(\.[A-Za-z_]\w*)+(:\w+)?")  # "emo.device.sim:SimDevice"
# The stage runner (emo/stages/__init__.py) is hashed but its imports (tracking, logging) are not
# followed: they record a stage's result, they do not decide it.
RUNNER = "emo.stages"


def compose(overrides: list[str] | tuple[str, ...] = (), config_dir: Path | None = None) -> dict:
    """The resolved configuration as a plain dict; a bad override raises ValueError with one line.

    Hydra builds the defaults list from the group choices (`gpu=h100`) and then sets each plain
    value (`budget=0.05`) on the merged tree. The merged tree is cached per set of group choices,
    so a sweep of hundreds of jobs over a few workloads and methods builds only a few of them;
    the values are set with Hydra's own override code, so the result is what `compose` gives."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from emo.config import check
    from emo.workloads.arch import check_virtual_command

    conf = Path(config_dir or ROOT / "conf")
    cfg = None
    try:
        parsed = _parse(list(overrides))
        sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
        if sweeps:
            raise ConfigError(f"bad configuration: {sweeps[0]}: several values are a sweep; run it with -m")
        removed = [o.input_line for o in parsed if o.is_delete()]
        if removed:  # `~key`: every stage reads the whole configuration
            raise ConfigError(f"bad configuration: {removed[0]}: {removed[0][1:]} is required; set it instead")
        groups = tuple(o.input_line for o in parsed if not _plain_value(o, conf))
        cfg = copy.deepcopy(_merged(str(conf), groups))
        _apply_values([o for o in parsed if _plain_value(o, conf)], cfg)
        _expand_home(cfg)
        out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        assert isinstance(out, dict)  # a DictConfig becomes a dict
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"bad configuration: {_unknown_key(e, cfg) or _one_line(e)}") from None
    check(out)
    check_virtual_command(out["gpu"], out["workload"])
    return out


def _parse(overrides: list[str], config_dir: Path | None = None) -> list:
    """Hydra's parse of the overrides; a value its grammar cannot read is named, with what to do.
    `config_dir`: the config tree a `glob(...)` sweep lists its group's options from."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if config_dir is not None:
        return _parse_with_loader(overrides, config_dir)
    parser = OverridesParser.create()
    try:
        return parser.parse_overrides(overrides)
    except OverrideParseException as e:
        line = next((ln for ln in overrides if not _parses(parser, ln)), _one_line(e))
        hint = (
            "; give the full path, or leave the ~ outside quotes for the shell to expand"
            if "=~" in line
            else "; quote the value, e.g. 'key=\"a value\"'"
        )
        raise ConfigError(f"bad configuration: {line}: Hydra cannot parse this override{hint}") from None


def _parse_with_loader(overrides: list[str], config_dir: Path) -> list:
    """The parse with Hydra's config loader of `config_dir` attached (what a glob sweep enumerates)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(overrides)


def _parses(parser, line: str) -> bool:
    from hydra.errors import OverrideParseException

    try:
        parser.parse_overrides([line])
        return True
    except OverrideParseException:
        return False


def _unknown_key(e: Exception, cfg) -> str | None:
    """`x.y is not a key of the configuration` (and the nearest keys) for a value set on no key."""
    import difflib
    import re

    m = re.match(r"Could not override '([^']+)'", str(e))
    if not m or "not in" not in str(e.__cause__ or ""):
        return None
    key = m.group(1)
    keys: list[str] = []
    if cfg is not None:
        tree = OmegaConf.to_container(cfg, resolve=False)
        assert isinstance(tree, dict)  # a DictConfig becomes a dict
        keys = [k for k, _ in _leaves(tree)]
    near = difflib.get_close_matches(key, keys, n=3)
    return f"{key} is not a key of the configuration" + (f" (did you mean {', '.join(near)}?)" if near else "")


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _plain_value(o, conf: Path) -> bool:
    """A `key=value` that sets a value: not a group choice, a hydra key, an addition or a deletion."""
    from hydra.core.override_parser.types import OverrideType

    return (
        o.type == OverrideType.CHANGE
        and o.package is None
        and not o.is_sweep_override()
        and not o.is_hydra_override()
        and not (conf / o.key_or_group.replace(".", "/")).is_dir()
    )


@functools.lru_cache(maxsize=64)
def _merged(conf: str, groups: tuple[str, ...]):
    """Hydra's composition of the group choices, before any plain value is set."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from emo.config import register

    register()
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(groups))


PATH_KEYS = ("results", "workload.path")


def _expand_home(cfg) -> None:
    """`~` in a path value Hydra quoted (`'results="~/r"'`), which no shell expanded: as the user's
    home, not a folder named `~` (before interpolation, so tracking.uri's ${results} sees it too)."""
    for key in PATH_KEYS:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        if isinstance(value, str) and value.startswith("~"):
            OmegaConf.update(cfg, key, os.path.expanduser(value))


def _apply_values(values, cfg) -> None:
    """Set plain values as Hydra's compose does once the defaults are merged: OmegaConf.update on the
    struct-mode tree (an unknown key is an error), failures worded as Hydra words them."""
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    for o in values:
        try:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        except (ConfigAttributeError, ConfigKeyError) as e:
            raise ConfigCompositionException(f"Could not override '{o.key_or_group}'.") from e
        except OmegaConfBaseException as e:
            raise ConfigCompositionException(f"Error merging override {o.input_line}") from e


def _one_line(e: Exception) -> str:
    """Hydra's message, with the typed-config cause (which key, what is wrong) when there is one."""
    parts = []
    for err in (e, e.__cause__):
        if err is None:
            continue
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        if lines:
            parts.append(lines[0])
        parts += [ln for ln in lines if ln.startswith("full_key:")]
        raw = str(err).splitlines()
        for i, ln in enumerate(raw):  # an unknown group choice: name the ones there are
            if ln.startswith("Available options in"):
                opts = [o.strip() for o in raw[i + 1 :] if o.startswith("\t") and not o.strip().endswith("_schema")]
                opts = opts[: next((k for k, o in enumerate(opts) if "=" in o), len(opts))]
                parts.append(f"{ln.rstrip(':')}: {', '.join(opts)}")
    return "; ".join(dict.fromkeys(parts)) or type(e).__name__


def module_file(name: str) -> Path | None:
    """The source file of module `name` (a package's __init__.py), None if there is none."""
    base = PACKAGE_PARENT.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


@functools.cache  # stages share most modules; each is parsed once per process (as code_digest is cached)
def _imported(name: str, f: Path) -> frozenset[str]:
    """The emo modules `f` (module `name`) may import: import statements anywhere in it (also inside
    functions, where heavy imports are deferred), relative ones resolved, and "emo.x.y" strings
    naming a module (backends loaded by name, e.g. emo.device.BACKENDS)."""
    tree = ast.parse(f.read_bytes(), filename=str(f))
    package = name if f.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            found.add(node.value.split(":")[0])
    return frozenset(m for m in found if m.split(".")[0] == "emo" and module_file(m) is not None)


def imported_modules(root: str) -> list[str]:
    """`root` and every emo module it imports, transitively, with the packages above each (importing
    emo.a.b runs emo/__init__.py and emo/a/__init__.py): what a stage's code is."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        if name != RUNNER:
            todo += sorted(_imported(name, module_file(name)))
    return sorted(seen)


def package_modules(package: str) -> list[str]:
    """The modules and sub-packages in emo package `package`'s folder, as it holds them now."""
    init = module_file(package)
    assert init is not None and init.name == "__init__.py", package
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(init.parent)]) if not m.name.startswith("_")]


def stage_modules(stage: str) -> list[str]:
    """The modules a stage's code is: what emo.stages.<stage> imports, and every module of the packages
    it declares it loads by name (Stage.discovers), with what they import in turn."""
    roots = [f"emo.stages.{stage}"]
    for package in declaration(stage).discovers if stage in STAGES else ():
        roots += package_modules(package)
    return sorted({m for root in roots for m in imported_modules(root)})


@functools.cache
def code_digest(stage: str) -> str:
    """Digest of the code of `stage`: the source of every module emo.stages.<stage> imports and the
    repository files it declares (Stage.code), so a code change re-runs exactly the stages that run that code."""
    files: list[Path] = []
    for m in stage_modules(stage):
        f = module_file(m)
        assert f is not None, m  # imported_modules lists modules that have a source file
        files.append(f)
    for rel in declaration(stage).code if stage in STAGES else ():
        p = ROOT / rel
        files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SOURCE_SUFFIXES) if p.is_dir() else [p]
    h = hashlib.sha256()
    # each file named as in a checkout (emo/..., microbench/...), wherever emo is installed
    named = {str(f.relative_to(ROOT if f.is_relative_to(ROOT) else PACKAGE_PARENT)): f for f in files}
    for name in sorted(named):
        h.update(name.encode())
        h.update(named[name].read_bytes())
    return h.hexdigest()[:16]


def content_digest(path: str | Path) -> str:
    """Digest of a file's bytes, or of every file under a folder (names and bytes): a recorded trace
    replaced at the same path is a new input. One line naming the path when it cannot be read."""
    p = Path(path)
    try:
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        h = hashlib.sha256()
        for f in files:
            h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
            with open(f, "rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    except OSError as e:
        raise ValueError(f"{p}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class StagePlan:
    stage: str
    hash: str
    dir: Path
    covers: dict  # what the hash covers: config subset, input hashes, code digest

    def out(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def params(self) -> dict:
        """A rule's params: exactly what the hash covers (Snakemake re-runs a rule when they change)."""
        return {"hash": self.hash, "covers": self.covers}

    @property
    def log(self) -> str:
        return str(self.dir.parent / "logs" / f"{self.hash}.log")


def plan(cfg: dict) -> dict[str, StagePlan]:
    """The folder of every stage for this configuration: each stage's hash covers what its
    declaration (emo.stages.Stage) names: its config sections, its upstream stages' hashes, its
    code, and the content of the outside files it reads."""
    results = Path(cfg["results"])
    plans: dict[str, StagePlan] = {}
    for stage in STAGES:
        decl = declaration(stage)
        covers = {
            "config": decl.seen(cfg),
            "inputs": {u: plans[u].hash for u in decl.upstream(cfg)},
            "code": code_digest(stage),
        }
        files = decl.outside_for(cfg)
        if files:
            covers["files"] = {key: content_digest(path) for key, path in files.items()}
        digest = hashlib.sha256(json.dumps(covers, sort_keys=True).encode()).hexdigest()[:12]
        plans[stage] = StagePlan(stage, digest, results / stage / digest, covers)
    return plans
