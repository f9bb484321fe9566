"""EMO's plan in Perseus's own formats (ml-energy/zeus, branch kronos):

- `freqs_pipeline.py`: a Python list, per stage, of the SM clock (MHz) of each forward and backward
  in Merak's order on that stage, as lowtime writes its plans (lowtime/scripts/perseus.py,
  `freqs_pipeline_%05d.py`) and Perseus's `PointSolution` scheduler reads them
  (`solution_path`; perseus/server/scheduler/profilers.py `_read_solution`: `eval` of the file).
- `sched.json`: what Perseus's server hands each rank, `[{"rank": r, "power_states": [...]}]`
  (perseus/models.py `PowerStateSchedule`), one power state per command of Merak's pipe schedule:
  a compute command takes the next clock of its stage's list, every other command keeps the last
  one (the first one before any compute), as `PowerStateScheduler._config_to_schedule` expands a
  plan (perseus/server/scheduler/interface.py). Ranks are stages (one GPU per stage).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from emo.perseus.merak import BACKWARD, FORWARD, pipe_schedule

FREQS_FILE = "freqs_pipeline.py"
SCHED_FILE = "sched.json"


def stage_clocks(stage: np.ndarray, mhz: np.ndarray) -> list[list[int]]:
    """Per stage, the clocks of its instructions in the caller's order (stage by stage, Merak's order)."""
    return [[int(x) for x in mhz[stage == s]] for s in range(int(stage.max()) + 1)]


def power_states(pipe: list[str], clocks: list[int]) -> list[int]:
    """One stage's clocks spread over its commands, as `_config_to_schedule` does."""
    if not clocks:
        raise ValueError("perseus schedule: a stage with no compute instruction")
    out, state, used = [], clocks[0], 0
    for cmd in pipe:
        if cmd in (FORWARD, BACKWARD):
            if used == len(clocks):
                raise ValueError(f"perseus schedule: more compute commands than the {len(clocks)} clocks given")
            state = clocks[used]
            used += 1
        out.append(state)
    if used != len(clocks):
        raise ValueError(f"perseus schedule: {used} compute commands but {len(clocks)} clocks")
    return out


def rank_schedules(clocks: list[list[int]], n_microbatches: int) -> list[dict]:
    S = len(clocks)
    return [{"rank": s, "power_states": power_states(pipe_schedule(s, S, n_microbatches), clocks[s])} for s in range(S)]


def freqs_text(clocks: list[list[int]], comment: str = "") -> str:
    """lowtime's plan file: a list literal, one stage per line, then `# ...` comment lines."""
    body = "[\n" + "".join(f"{c},\n" for c in clocks) + "]\n"
    return body + "".join(f"# {line}\n" for line in comment.splitlines())


def write(out_dir: str | Path, clocks: list[list[int]], n_microbatches: int, comment: str = "") -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    freqs = out / FREQS_FILE
    freqs.write_text(freqs_text(clocks, comment))
    sched = out / SCHED_FILE
    sched.write_text(json.dumps(rank_schedules(clocks, n_microbatches)) + "\n")
    return [freqs, sched]
