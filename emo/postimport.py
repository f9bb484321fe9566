"""Run a function right after a module is imported, without importing it (the injected
sitecustomize must not import torch into every Python process of a job, a launcher's included)."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


class _After(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the others find the real module
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run, fn = spec.loader.exec_module, self.fn

                def exec_module(module, run=run, fn=fn):
                    run(module)
                    fn(module)

                spec.loader.exec_module = exec_module  # this module's loader only
                return spec
        return None


def when_imported(name: str, fn: Callable) -> None:
    """fn(module) once `name` is imported: now if it already is, else right after its import."""
    if name in sys.modules:
        fn(sys.modules[name])
    else:
        sys.meta_path.insert(0, _After(name, fn))
