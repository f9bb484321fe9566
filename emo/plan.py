"""Compose the configuration and plan the content-hashed stage folders (DESIGN.md §2).

Each stage's folder is `results/<stage>/<hash>/`, the hash covering exactly the configuration the stage
depends on, its inputs' hashes and a digest of the code that computes it. The chain is computable before
anything runs, so Snakemake knows every path at parse time: changing the workload moves trace and all
after it to new folders but keeps the calibration; changing the budget moves only optimize and validate.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]  # the repository (conf/, microbench/, Snakefile)

# stage -> (config keys it depends on, upstream stages, code it runs: paths relative to ROOT)
STAGES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "trace": (("gpu", "workload", "trace"), (), ("emo/stages/trace.py", "emo/device", "emo/workloads", "emo/trace")),
    "graph": ((), ("trace",), ("emo/stages/graph.py", "emo/graph", "emo/trace")),
    "calibrate": (("gpu", "model"), (), ("emo/stages/calibrate.py", "emo/device", "emo/microbench.py", "microbench")),
    "pack": (("packing",), ("trace", "graph"), ("emo/stages/pack.py", "emo/pack", "emo/graph")),
    "profile": (("gpu", "workload", "trace", "model"), ("trace", "pack"), ("emo/stages/profile.py", "emo/device", "emo/workloads", "emo/pack")),
    "fit": (("gpu",), ("calibrate", "trace", "pack", "profile"), ("emo/stages/fit.py", "emo/model", "emo/pack", "emo/graph", "emo/policy.py", "emo/runtime.py")),
    "optimize": (("optimizer", "budget"), ("pack", "fit"), ("emo/stages/optimize.py", "emo/optimize", "emo/model", "emo/graph", "emo/policy.py", "emo/runtime.py")),
    "validate": (("optimizer", "budget", "validate"), ("optimize",), ("emo/stages/validate.py", "emo/baselines", "emo/device", "emo/workloads", "emo/policy.py")),
}


def compose(overrides: list[str] | tuple[str, ...] = (), config_dir: Path | None = None) -> dict:
    """The resolved configuration as a plain dict; a bad override raises ValueError with one line."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from emo.config import check, register

    register()
    try:
        with initialize_config_dir(config_dir=str(config_dir or ROOT / "conf"), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
        out = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(f"bad configuration: {_one_line(e)}") from None
    check(out)
    return out


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
                opts = [o.strip() for o in raw[i + 1:] if o.startswith("\t") and not o.strip().endswith("_schema")]
                opts = opts[:next((k for k, o in enumerate(opts) if "=" in o), len(opts))]
                parts.append(f"{ln.rstrip(':')}: {', '.join(opts)}")
    return "; ".join(dict.fromkeys(parts)) or type(e).__name__


@functools.cache
def code_digest(paths: tuple[str, ...]) -> str:
    """Digest of the source files under `paths` (relative to ROOT): a code change re-runs the stage."""
    h = hashlib.sha256()
    for rel in paths:
        p = ROOT / rel
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in {".py", ".cu", ".yaml"}) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
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
    """The folder of every stage for this configuration."""
    results = Path(cfg["results"])
    plans: dict[str, StagePlan] = {}
    for stage, (keys, upstream, code) in STAGES.items():
        covers = {
            "config": {k: cfg[k] for k in keys},
            "inputs": {u: plans[u].hash for u in upstream},
            "code": code_digest(code),
        }
        digest = hashlib.sha256(json.dumps(covers, sort_keys=True).encode()).hexdigest()[:12]
        plans[stage] = StagePlan(stage, digest, results / stage / digest, covers)
    return plans
