"""EMO speaks to Snakemake, Hydra, MLflow and the rest through their public APIs only: no import of a
tool's private module (a `_name` part, Hydra's `_internal`), none of snakemake's command-line
internals, and no patching of another package's module."""

import ast
from pathlib import Path

EMO = Path(__file__).resolve().parents[1] / "emo"
# Snakemake's public surface is its command line and snakemake.api; these are the CLI's own insides
SNAKEMAKE_INTERNALS = ("snakemake.cli", "snakemake.scheduling")


def imported(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] != "emo" and (
        any(p.startswith("_") and not p.startswith("__") for p in parts) or module.startswith(SNAKEMAKE_INTERNALS)
    )


def test_no_private_tool_api_and_no_patching_in_the_library():
    found = []
    for f in sorted(EMO.rglob("*.py")):
        text = f.read_text()
        tree = ast.parse(text, filename=str(f))
        found += [f"{f.relative_to(EMO.parent)}: imports {m}" for m in imported(tree) if private(m)]
        found += [
            f"{f.relative_to(EMO.parent)}:{i}: monkeypatch"
            for i, line in enumerate(text.splitlines(), 1)
            if "monkeypatch" in line
        ]
    assert found == []


def test_the_check_finds_what_it_looks_for():
    tree = ast.parse(
        "from hydra._internal.config_loader_impl import ConfigLoaderImpl\n"
        "from snakemake.cli import parse_args\nimport mlflow.store._x\nfrom emo import _y\n"
    )
    assert [m for m in imported(tree) if private(m)] == [
        "hydra._internal.config_loader_impl",
        "hydra._internal.config_loader_impl.ConfigLoaderImpl",
        "snakemake.cli",
        "snakemake.cli.parse_args",
        "mlflow.store._x",
    ]
