"""A built wheel carries the pipeline's own files beside the library: `emo run` needs the Snakefile,
its rules and scripts, the Hydra configuration, the workflow profiles and the microbenchmarks'
sources, which live at the top of the repository (docs/design.md §3). They are copied into
emo/_project at build time (emo.paths finds them there); an editable install reads them in place."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROJECT_FILES = ("Snakefile", "workflow", "conf", "profiles", "microbench")  # as emo.paths.PROJECT_FILES


class BuildWithProject(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        dest = Path(self.build_lib) / "emo" / "_project"
        dest.mkdir(parents=True, exist_ok=True)
        for name in PROJECT_FILES:
            src = Path(name)
            if src.is_dir():
                shutil.copytree(
                    src,
                    dest / name,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".snakemake"),
                )
            else:
                shutil.copy2(src, dest / name)


setup(cmdclass={"build_py": BuildWithProject})
