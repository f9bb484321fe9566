"""The README's test command from a fresh venv (`pip install -e '.[test]' && pytest -n 2`): the `test`
extra brings everything the suite needs, so nothing fails for a missing build tool and no test of the
GPU user's path (torch, the trainers and launchers) skips for a package the extra could have brought."""

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


def extra(name: str) -> set[str]:
    """The distributions an extra installs, its `emo[...]` references followed."""
    out: set[str] = set()
    for req in PYPROJECT["project"]["optional-dependencies"][name]:
        if _name(req) == "emo":
            for sub in re.search(r"\[(.*)\]", req).group(1).split(","):
                out |= extra(sub.strip())
        else:
            out.add(_name(req))
    return out


def test_the_test_extra_builds_the_wheel_without_build_isolation():
    # test_wheel builds with --no-build-isolation: the build backend must come from the test extra
    needed = {_name(r) for r in PYPROJECT["build-system"]["requires"]} | {"wheel"}
    assert needed <= extra("test")


def test_the_test_extra_brings_the_gpu_users_path():
    assert {"torch", "lightning", "transformers", "accelerate", "zeus", "lowtime"} <= extra("test")
