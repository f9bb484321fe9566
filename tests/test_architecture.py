"""The models never see the virtual GPU's internals: an import-linter contract (pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_models_do_not_import_the_virtual_gpu():
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert cmd, "import-linter is not installed (pip install -e '.[test]')"
    r = subprocess.run([cmd, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def sibling_import_graph(graph) -> dict[str, set[str]]:
    """Edges between siblings: an import of emo.a.x.y by emo.a.z.w is the edge emo.a.z -> emo.a.x (the
    children of their deepest common package), at every depth. Imports inside functions and under
    TYPE_CHECKING count (grimp reads them all): a lazy import hides a circle from Python, not from here."""
    edges: dict[str, set[str]] = {}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = importer.split("."), imported.split(".")
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            if k < len(a) and k < len(b):  # not a package importing its own child, or a child its package
                edges.setdefault(".".join(a[: k + 1]), set()).add(".".join(b[: k + 1]))
    return edges


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    import networkx as nx

    g = nx.DiGraph([(a, b) for a, bs in edges.items() for b in bs])
    return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def test_no_import_cycles_between_sibling_modules():
    import grimp

    cycles = import_cycles(sibling_import_graph(grimp.build_graph("emo", include_external_packages=False)))
    assert cycles == []


def test_the_cycle_check_finds_a_lazy_cycle():
    # emo.a imports emo.b at module level; emo.b imports emo.a.x inside a function
    edges = {"emo.a": {"emo.b"}, "emo.b": {"emo.a"}, "emo.a.x": {"emo.a.y"}}
    assert import_cycles(edges) == [["emo.a", "emo.b"]]
    assert import_cycles({"emo.a": {"emo.b"}}) == []
