"""Every command of the README works as written (issue 46), checked without running the pipeline: the
commands are read out of README.md's code blocks, so this test follows the README when it changes.

- `emo SUB ...`: SUB exists and its own parser takes the arguments; `emo run` (and `emo ui`, `emo
  compare`) overrides compose and pass EMO's config check, with `-m` every combination of the sweep;
- `snakemake ...`: Snakemake's parser takes it and its `--config overrides=[...]` compose;
- install, test and lint commands: the extras, markers, tools and paths they name exist;
- the Python snippet compiles, and what it uses of `emo` exists with the arguments it passes;
- a command this file has no check for fails, so a new kind of README command gets one.

Inline code spans that start with `emo ` are checked for their sub-command only (they carry
placeholders such as `<model>` and `...`). Running every command for real, from a clone and from a
wheel, is a manual check (docs/design.md, "README commands")."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import io
import re
import shlex
import tomllib
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Names in the Python snippet that are the reader's own (their data and training step).
USER_NAMES = {"loader", "train_step"}
# The lint tools the Development block runs, by the distribution the test extra installs them from.
TOOLS = {"ruff": "ruff", "mypy": "mypy", "snakefmt": "snakefmt", "lint-imports": "import-linter"}
ENV_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def shell_commands(text: str) -> list[list[str]]:
    """The commands of the bash blocks as argument lists: comments dropped, `a && b` split."""
    out: list[list[str]] = []
    for lang, body in code_blocks(text):
        if lang != "bash":
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                out.append(words[:cut])
                words = words[cut + 1 :]
    return [drop_env(c) for c in out if c]


def inline_emo_commands(text: str) -> list[list[str]]:
    """The inline code spans that are `emo` commands (`emo run -n`, `EMO_FAKE_GPU=2 emo apply ...`)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = (" ".join(m.split()) for m in re.findall(r"`([^`]+)`", prose))
    return [c for c in (drop_env(s.split()) for s in spans) if c[:1] == ["emo"] and len(c) > 1]


def drop_env(words: list[str]) -> list[str]:
    while words and ENV_ASSIGNMENT.fullmatch(words[0]):
        words = words[1:]
    return words


def python_snippets(text: str) -> list[str]:
    return [body for lang, body in code_blocks(text) if lang == "python"]


def extra(name: str) -> set[str]:
    """The distributions an extra installs, its `emo[...]` references followed."""
    out: set[str] = set()
    for req in PYPROJECT["project"]["optional-dependencies"][name]:
        dist = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()
        if dist == "emo":
            for sub in re.search(r"\[(.*)\]", req).group(1).split(","):
                out |= extra(sub.strip())
        else:
            out.add(dist)
    return out


def _parse(parser, args: list[str]):
    """argparse's namespace, or its one-line refusal as ValueError (not a SystemExit)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit:
        raise ValueError(err.getvalue().strip().splitlines()[-1]) from None


@functools.cache
def _compose(overrides: tuple[str, ...]) -> dict:
    from emo.workflow.plan import compose

    return compose(list(overrides))


def check_emo(args: list[str]) -> None:
    from emo.cli import COMMANDS, build_parser

    if not args or args[0] not in COMMANDS:
        raise ValueError(f"no such sub-command (one of {', '.join(COMMANDS)})")
    ns = _parse(build_parser(args), args)
    if ns.command == "run":
        from emo.cli.run import check_flags
        from emo.workflow import sweep

        check_flags(ns)
        jobs = sweep.expand(ns.overrides, ns.multirun)
        roots = {_compose(tuple(job))["results"] for job in jobs}  # every job of a sweep
        assert len(roots) == 1, f"a sweep writes into one results folder, not {sorted(roots)}"
    elif ns.command in ("ui", "compare"):
        _compose(tuple(ns.overrides))  # the overrides that select the tracking store
    elif ns.command == "analyze" and ns.perfetto:
        assert re.search(r"\.json(\.gz)?$", ns.perfetto), f"--perfetto {ns.perfetto}: not .json or .json.gz"


def check_python_m(args: list[str]) -> None:
    module, rest = args[1], args[2:]
    if module == "pip":
        assert rest[0] == "install", f"pip {rest[0]}: not an install"
        for target in rest[1:]:
            if target.startswith("-"):
                continue
            path, extras = re.fullmatch(r"([^\[]+)(?:\[(.*)\])?", target).groups()
            assert (REPO / path / "pyproject.toml").exists(), f"{path}: not this project"
            missing = set((extras or "").split(",")) - {""} - set(PYPROJECT["project"]["optional-dependencies"])
            assert not missing, f"no extra {', '.join(sorted(missing))} in pyproject.toml"
    elif module == "pytest":
        if "-n" in rest:
            assert "pytest-xdist" in extra("test"), "-n needs pytest-xdist, which the test extra lacks"
        if "-m" in rest:
            declared = {m.split(":")[0] for m in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
            used = set(re.findall(r"\w+", rest[rest.index("-m") + 1])) - {"not", "and", "or"}
            assert used <= declared, f"-m: no marker {', '.join(sorted(used - declared))}"
    else:
        raise ValueError(f"no check for `python3 -m {module}`: add one to {Path(__file__).name}")


def check_snakemake(args: list[str]) -> None:
    from snakemake.cli import get_argument_parser, parse_config

    ns = _parse(get_argument_parser(), args)
    assert (REPO / "Snakefile").exists()
    overrides = parse_config(ns.config or []).get("overrides", [])
    _compose(tuple(str(o) for o in overrides))


def check_tool(args: list[str]) -> None:
    assert TOOLS[args[0]] in extra("test"), f"{args[0]}: not in the test extra (README: Development)"
    for word in args[1:]:
        if not word.startswith("-") and word not in ("check", "format"):
            assert (REPO / word).exists(), f"{word}: no such path"


def check_script(args: list[str]) -> None:
    script = REPO / (args[1] if args[0] == "bash" else args[0])
    assert script.is_file(), f"{script.relative_to(REPO)}: no such script"


def check_command(words: list[str]) -> None:
    """Raise (AssertionError, ValueError) with what is wrong with one README command."""
    prog = words[0]
    if prog == "emo":
        check_emo(words[1:])
    elif prog in ("python", "python3") and words[1:2] == ["-m"]:
        check_python_m(words[1:])
    elif prog == "snakemake":
        check_snakemake(words[1:])
    elif prog in TOOLS:
        check_tool(words)
    elif prog == "bash" or prog.startswith(".ci/"):
        check_script(words)
    else:
        raise ValueError(f"no check for this command: add one to {Path(__file__).name}")


def check_snippet(source: str) -> None:
    """It compiles; each name it reads is the reader's, a builtin or an importable module; each
    `emo.X(...)` exists and takes the arguments given; `with emo.X(...) as v` gives a `v` with
    the attributes the snippet uses."""
    import builtins
    import importlib

    tree = ast.parse(source)
    compile(tree, "<README python>", "exec")
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    free = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound
    modules = {name: importlib.import_module(name) for name in free - USER_NAMES if not hasattr(builtins, name)}
    returns: dict[str, type] = {}  # `with m.f(...) as v`: the class of v
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
        owner = call.func.value
        if isinstance(owner, ast.Name) and owner.id in modules:
            fn = getattr(modules[owner.id], call.func.attr, None)
            assert callable(fn), f"{owner.id}.{call.func.attr}: no such function"
            args = [a.value if isinstance(a, ast.Constant) else None for a in call.args]
            inspect.signature(fn).bind(*args, **{k.arg: None for k in call.keywords if k.arg})
    for item in (i for n in ast.walk(tree) if isinstance(n, ast.With) for i in n.items):
        call, var = item.context_expr, item.optional_vars
        if isinstance(var, ast.Name) and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            fn = getattr(modules[call.func.value.id], call.func.attr)
            module, _, name = str(inspect.signature(fn).return_annotation).strip("'\"").rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            returns[var.id] = typing.get_type_hints(cls.__enter__)["return"]
    for attr in (n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)):
        owner = attr.value.id
        if owner in returns:
            assert hasattr(returns[owner], attr.attr), f"{owner}.{attr.attr}: {returns[owner].__name__} has none"
        elif owner in modules:
            assert hasattr(modules[owner], attr.attr), f"{owner}.{attr.attr}: no such attribute"


def problems(text: str) -> list[str]:
    """One line per README command that would not work as written."""
    out = []
    for words in shell_commands(text):
        try:
            check_command(words)
        except (AssertionError, ValueError) as e:
            out.append(f"`{shlex.join(words)}`: {e}")
    from emo.cli import COMMANDS

    for words in inline_emo_commands(text):
        if words[1] not in COMMANDS:
            out.append(f"`{' '.join(words)}`: no sub-command {words[1]}")
    for source in python_snippets(text):
        try:
            check_snippet(source)
        except (AssertionError, SyntaxError, ImportError, TypeError) as e:
            out.append(f"python snippet: {e}")
    return out


@pytest.mark.parametrize("words", shell_commands(README.read_text()), ids=shlex.join)
def test_each_readme_command_works_as_written(words):
    check_command(words)


def test_the_readme_has_the_commands_it_promises():
    text = README.read_text()
    subs = {c[1] for c in shell_commands(text) if c[0] == "emo"}
    assert {"run", "compare", "ui", "analyze"} <= subs
    assert any(c[:3] == ["emo", "run", "-m"] for c in shell_commands(text))
    assert python_snippets(text)


def test_the_readme_inline_commands_and_python_snippet():
    assert problems(README.read_text()) == []


@pytest.mark.parametrize(
    "good, bad, named",
    [
        ("emo run optimizer=static ", "emo run optimizer=statik ", "optimizer=statik"),
        ("emo run workload=pp workload.pp=4 ", "emo run workload=pp workload.ppp=4 ", "workload.ppp"),
        ("budget=0.02,0.05 workload=tp", "budget=0.02,-0.05 workload=tp", "budget"),
        ("emo compare   ", "emo compair   ", "emo compair"),
        ("emo run --until trace", "emo run --until traces", "--until traces"),
        ("--annotation ProfilerStep --json", "--annotation ProfilerStep --jsn", "--jsn"),
        ("--perfetto with_critical_path.json.gz", "--perfetto with_critical_path.png", "--perfetto"),
        ("'overrides=[\"workload=pp\"]'", "'overrides=[\"workload=ppp\"]'", "workload=ppp"),
        ("install -e '.[test]'", "install -e '.[tests]'", "no extra tests"),
        ('pytest -m "not slow"', 'pytest -m "not sloow"', "sloow"),
        ("`emo reset-clocks`", "`emo reset-clock`", "reset-clock"),
        ("emo.apply(", "emo.aply(", "emo.aply"),
        ("clocks.step()", "clocks.stepp()", "clocks.stepp"),
        ("mypy      ", "mipy      ", "mipy"),
    ],
)
def test_a_broken_readme_command_is_named(good, bad, named):
    text = README.read_text()
    assert good in text, f"the README no longer has {good!r}: update this case"
    found = problems(text.replace(good, bad, 1))
    assert found and any(named in p for p in found), found
