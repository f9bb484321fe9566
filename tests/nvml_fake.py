"""The NVML fake (emo.device.nvml_fake, shipped so that a user without a GPU can try the GPU path) and
what the tests do with it: patch it in for one test, hand it to a clock owner or a subprocess, read
the calls a process logged."""

from __future__ import annotations

import json

from emo.device.nvml_fake import GRAPHICS, MEM_CLOCKS, FakeNVML, _real  # noqa: F401 - the tests' names for them


def install(monkeypatch, **kw) -> FakeNVML:
    """Patch a FakeNVML in for `pynvml` for one test."""
    import sys

    fake = FakeNVML(**kw)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


FAKE_ENV = "EMO_FAKE_NVML"  # JSON keyword arguments of FakeNVML, for a process the test does not run itself


def from_env() -> FakeNVML:
    """The fake the clock owner uses in tests (EMO_CLOCK_OWNER_NVML=nvml_fake:from_env)."""
    import os

    return FakeNVML(**json.loads(os.environ.get(FAKE_ENV, "{}")))


def owner_env(log_path=None, **kw) -> dict:
    """Environment under which a process's clock owner (emo.device.clock_owner) uses a FakeNVML(**kw)
    that logs its calls to log_path: merge it into a subprocess's env, or monkeypatch it in."""
    import os
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    # each fake is a node of its own: its GPU lock records too (a shared log_path: the same node)
    locks = f"{log_path}.locks" if log_path is not None else tempfile.mkdtemp(prefix="emo-fake-locks-")
    return {
        "EMO_CLOCK_OWNER_NVML": "nvml_fake:from_env",
        "PYTHONPATH": path,
        "EMO_GPU_LOCK_DIR": locks,
        FAKE_ENV: json.dumps({**kw, "log_path": None if log_path is None else str(log_path)}),
    }


def read_log(path) -> list[tuple]:
    """The calls a FakeNVML logged to `path` (none if it was never written)."""
    import os

    if not os.path.exists(path):
        return []
    return [tuple(json.loads(ln)) for ln in open(path).read().splitlines() if ln.strip()]


class Owned:
    """The in-process fake (what this process reads) and its clock owner's fake (the calls that set
    and reset clocks, made by the owner process and read from its log) seen as one `calls` list."""

    def __init__(self, fake: FakeNVML, log):
        self.fake, self.log = fake, log

    @property
    def calls(self) -> list[tuple]:
        return [*self.fake.calls, *read_log(self.log)]

    def __getattr__(self, name):
        return getattr(self.fake, name)


def install_owned(monkeypatch, log_path, **kw):
    """install() plus a fresh clock owner for this test whose own FakeNVML(**kw) logs to log_path.
    Yields the Owned view; closes the owner afterwards (use from a fixture: `yield from`)."""
    from emo.device import clock_owner

    fake = install(monkeypatch, **kw)
    for k, v in owner_env(log_path, **kw).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(clock_owner, "_OWNER", None)
    yield Owned(fake, log_path)
    if clock_owner._OWNER is not None:
        clock_owner._OWNER.close()


def for_loop_api(monkeypatch, log_path, gpus: int):
    """install_owned plus what the training-loop API's tests share: no restore handlers inside pytest,
    root (NVML directly), no launcher's rank variables, no policy applied yet. A fixture's body:
    `yield from nvml_fake.for_loop_api(...)`."""
    from emo import loop
    from emo.device import nvml as nv

    owned = install_owned(monkeypatch, log_path, gpus=gpus)
    fake = next(owned)
    guard = type(nv._GUARD)()
    monkeypatch.setattr(nv, "_GUARD", guard)
    monkeypatch.setattr(guard, "_install", lambda: setattr(guard, "_installed", True))
    monkeypatch.setattr(nv.os, "geteuid", lambda: 0)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(loop, "_ACTIVE", None)
    yield fake
    next(owned, None)  # closes the clock owner
