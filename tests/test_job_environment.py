"""Issue 48 item 3: under `emo apply` / `emo trace` the job's environment is its own, except for one
folder holding only EMO's hook (emo/_site): its own modules of any name (even `emo`) win, its own
sitecustomize still runs, and a link to emo/_site already on its PYTHONPATH does not recurse.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from emo.device import launcher

ROOT = Path(launcher.__file__).resolve().parents[2]


def _run(env: dict, code: str) -> subprocess.CompletedProcess:
    cwd = "/"  # not the repository: its emo would come first as the current folder
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


def _user_site(tmp_path: Path) -> Path:
    """A user's folder: a patched `tqdm`, a package of their own named `emo`, their own sitecustomize."""
    mine = tmp_path / "mine"
    (mine / "emo").mkdir(parents=True)
    (mine / "tqdm.py").write_text("PATCHED = True\n")
    (mine / "emo" / "__init__.py").write_text("USERS = True\n")
    (mine / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    return mine


def test_only_emo_s_hook_folder_is_added_to_the_job_s_path(tmp_path):
    env = launcher.inject_env({"PYTHONPATH": os.pathsep.join(["/a", "/b"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(launcher.SITE_DIR), "/a", "/b"]
    assert str(ROOT) not in env["PYTHONPATH"].split(os.pathsep)


def test_the_job_s_own_modules_and_sitecustomize_win(tmp_path):
    mine = _user_site(tmp_path)
    env = launcher.inject_env({**os.environ, "PYTHONPATH": str(mine)})
    code = "import os, tqdm, emo; print(getattr(tqdm, 'PATCHED', False), getattr(emo, 'USERS', False), os.environ.get('USER_SITE_RAN'))"
    r = _run(env, code)
    assert r.returncode == 0 and r.stdout.split() == ["True", "True", "1"], r.stderr


def test_a_job_s_own_emo_turns_the_hooks_off_in_one_line(tmp_path):
    mine = _user_site(tmp_path)
    env = launcher.inject_env({**os.environ, "PYTHONPATH": str(mine)})
    env["EMO_POLICY"] = str(tmp_path / "policy.json")
    r = _run(env, "import emo; print(getattr(emo, 'USERS', False))")
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emo: ")]
    assert r.returncode == 0 and r.stdout.split() == ["True"], r.stderr
    assert len(lines) == 1 and "shadows EMO's" in lines[0] and str(mine / "emo") in lines[0]


def test_emo_s_hooks_arm_when_the_job_has_no_emo_of_its_own(tmp_path):
    env = launcher.inject_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    env["EMO_POLICY"] = str(tmp_path / "policy.json")
    r = _run(env, "import sys; print('emo.capture' in sys.modules, sys.modules['emo'].__file__)")
    assert r.returncode == 0 and r.stdout.split() == ["True", str(ROOT / "emo" / "__init__.py")], r.stderr


def test_a_link_to_emo_s_hook_folder_on_the_path_does_not_recurse(tmp_path):
    mine = _user_site(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(launcher.SITE_DIR)
    for path in (os.pathsep.join([str(link), str(mine)]), os.pathsep.join([str(mine), str(link)])):
        for env in (launcher.inject_env({**os.environ, "PYTHONPATH": path}), {**os.environ, "PYTHONPATH": path}):
            env.pop("EMO_POLICY", None)
            r = _run(env, "import os; print(os.environ.get('USER_SITE_RAN'))")
            assert r.returncode == 0 and r.stdout.split() == ["1"] and "RecursionError" not in r.stderr, r.stderr
