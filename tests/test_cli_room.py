"""Every command in emo/cli/, and nothing outside emo/cli/ imports it: the library (and the code that
runs inside the user's job: emo.capture, emo.loop, emo.runtime) works without the command line."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMO = ROOT / "emo"
CLI = EMO / "cli"


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module `path` (a file under `root`) imports, at any depth: inside functions and under
    TYPE_CHECKING too."""
    package = ".".join(path.relative_to(root).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from its package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)  # `from emo import cli`
    return found


def is_cli(module: str) -> bool:
    return module == "emo.cli" or module.startswith("emo.cli.")


def test_nothing_outside_emo_cli_imports_it():
    offenders = {
        str(f.relative_to(ROOT)): sorted(m for m in imports_of(f) if is_cli(m))
        for f in EMO.rglob("*.py")
        if CLI not in f.parents
    }
    assert {f: ms for f, ms in offenders.items() if ms} == {}


def test_the_import_walk_sees_every_form(tmp_path):
    pkg = tmp_path / "emo" / "x"
    pkg.mkdir(parents=True)
    f = pkg / "m.py"
    f.write_text("import emo.cli.apply\nfrom emo import cli\ndef f():\n    from ..cli.trace import register\n")
    assert {"emo.cli.apply", "emo.cli", "emo.cli.trace"} <= {m for m in imports_of(f, tmp_path) if is_cli(m)}


def test_in_job_code_loads_no_cli():
    """What the injected sitecustomize and emo.apply import, in a fresh interpreter: no emo.cli."""
    code = (
        "import sys, emo, emo.capture, emo.loop, emo.runtime\n"
        "print(sorted(m for m in sys.modules if m == 'emo.cli' or m.startswith('emo.cli.')))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def handlers(parser) -> list:
    """The `func` of `parser` and of every sub-command below it (`emo model fit`, `emo calibration show`)."""
    import argparse

    found = [parser.get_default("func")] if parser.get_default("func") else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [f for p in action.choices.values() for f in handlers(p)]
    return found


def test_every_listed_subcommand_is_defined_under_emo_cli():
    from emo.cli import COMMANDS, build_parser

    parser = build_parser()  # every command module imported, each registering its sub-command(s)
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)  # what `emo --help` lists
    help_text = parser.format_help()
    for name, p in sub.choices.items():
        assert name in help_text and is_cli(COMMANDS[name][0]), name
        funcs = handlers(p)
        assert funcs, name
        for func in funcs:
            module = sys.modules[func.__module__]
            assert is_cli(func.__module__) and CLI in Path(module.__file__ or "").parents, (name, func.__module__)
