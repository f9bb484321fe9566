"""Reader for the CSV format of hpc-ulisboa/gpupowermodel (Guerreiro et al., HPCA'18, TPDS'19).

Every file starts with a 4-line header: the number of clock domains; the default clock of each
domain (core, memory, MHz); how many components belong to each domain (e.g. "7,1": seven core-side
units and DRAM); the component names. The "all frequencies" files then hold one row per
configuration x (core, memory) clock pair: name, power (W), core MHz, memory MHz, one utilisation
per component (measured at the default clocks, so repeated on every row of a configuration).
Names are not unique (the suite reuses "1", "8", ... across families); a configuration is a run of
consecutive rows, and a new one starts when the name changes or a clock pair repeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class PowerCurves:
    """J configurations x C clock pairs."""

    names: list[str]
    components: list[str]
    default_mhz: tuple[int, int]  # (core, memory)
    clocks: np.ndarray  # [C, 2] (core, memory) MHz, in file order
    util: np.ndarray  # [J, U]
    power_w: np.ndarray  # [J, C]

    @property
    def default_index(self) -> int:
        hit = np.nonzero((self.clocks[:, 0] == self.default_mhz[0]) & (self.clocks[:, 1] == self.default_mhz[1]))[0]
        return int(hit[0])


def read_power_curves(path: str | Path) -> PowerCurves:
    """Read a gpupowermodel "all frequencies" CSV (micro or real applications)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found")
    head = path.read_text().splitlines()[:4]
    try:
        domains = int(head[0])
        default = tuple(int(v) for v in head[1].split(","))
        per_domain = [int(v) for v in head[2].split(",")]
        components = [c.strip() for c in head[3].split(",")]
    except (IndexError, ValueError):
        raise ValueError(
            f"{path}: not a gpupowermodel CSV (want a 4-line header: domains, default clocks, "
            "components per domain, component names)"
        ) from None
    if len(default) != domains or domains != 2 or sum(per_domain) != len(components):
        raise ValueError(
            f"{path}: header says {domains} domains, defaults {default}, {per_domain} components "
            f"but names {len(components)} (want 2 domains: core, memory)"
        )
    df = pd.read_csv(path, skiprows=4, header=None)
    if df.shape[1] != 4 + len(components):
        raise ValueError(
            f"{path}: rows have {df.shape[1]} fields, want name, power, core MHz, memory MHz "
            f"and {len(components)} utilisations"
        )
    pair = list(zip(df[2].astype(int), df[3].astype(int)))
    cfg, seen, ids = -1, set[tuple[int, int]](), list[int]()
    prev = None
    for name, p in zip(df[0].astype(str), pair):
        if name != prev or p in seen:
            cfg, seen, prev = cfg + 1, set(), name
        seen.add(p)
        ids.append(cfg)
    df["cfg"] = ids
    first = df[df["cfg"] == 0]
    clocks = first[[2, 3]].to_numpy(np.int64)
    n_c = len(clocks)
    sizes = df.groupby("cfg").size()
    if (sizes != n_c).any():
        bad = int(sizes[sizes != n_c].index[0])
        raise ValueError(
            f"{path}: configuration {bad} ({df[df['cfg'] == bad][0].iloc[0]}) has "
            f"{int(sizes[bad])} rows, want one per clock pair ({n_c})"
        )
    j = len(sizes)
    if not (df[[2, 3]].to_numpy(np.int64).reshape(j, n_c, 2) == clocks).all():
        raise ValueError(f"{path}: configurations list their clock pairs in different orders")
    util = df.iloc[:, 4 : 4 + len(components)].to_numpy(np.float64).reshape(j, n_c, len(components))
    if not np.allclose(util, util[:, :1, :]):
        raise ValueError(f"{path}: utilisations change within a configuration (want the default-clock vector repeated)")
    if tuple(default) not in set(map(tuple, clocks.tolist())):
        raise ValueError(f"{path}: the default clocks {default} are not among the measured pairs")
    return PowerCurves(
        list(df.groupby("cfg")[0].first().astype(str)),
        components,
        (default[0], default[1]),
        clocks,
        util[:, 0, :],
        df[1].to_numpy(np.float64).reshape(j, n_c),
    )


def long_table(curves: PowerCurves, mem_mhz: int | None = None) -> pd.DataFrame:
    """The curves as the open calibration interface's long table (emo.model.kernels): one row per
    configuration x core clock at one memory clock (default: the default memory clock), with
    `name`, `sm_mhz`, `power_w` and one column per component under the file's own name (SP, INT,
    ..., the `gpupowermodel` counter source). Repeated names get a `#k` suffix."""
    mem = curves.default_mhz[1] if mem_mhz is None else int(mem_mhz)
    cols = np.nonzero(curves.clocks[:, 1] == mem)[0]
    if not len(cols):
        raise ValueError(f"no measurements at memory clock {mem} MHz")
    seen: dict[str, int] = {}
    names = []
    for n in curves.names:
        seen[n] = seen.get(n, 0) + 1
        names.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    j, c = len(names), len(cols)
    out = pd.DataFrame(
        {
            "name": np.repeat(names, c),
            "sm_mhz": np.tile(curves.clocks[cols, 0], j),
            "power_w": curves.power_w[:, cols].ravel(),
        }
    )
    util = pd.DataFrame(np.repeat(curves.util, c, axis=0), columns=curves.components)
    return pd.concat([out, util], axis=1)
