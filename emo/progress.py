"""Progress of a long stage step (benchmarks x clocks, packs profiled, optimizer iterations).

One mechanism for every stage: a tqdm bar with an ETA on the terminal (stderr), and a line in the
stage log (logger "emo") at every tenth of the work, so a log file shows progress too. Progress is
only shown, never used: it cannot change a result.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

log = logging.getLogger("emo")
T = TypeVar("T")


class Progress:
    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.done, self._next_log = max(int(total), 0), desc, 0, 1
        self._bar = tqdm(
            total=self.total, desc=desc, file=sys.stderr, disable=None, leave=False, dynamic_ncols=True, mininterval=0.5
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        self._bar.update(n)
        if self.total and self.done * 10 >= self._next_log * self.total:
            self._next_log = self.done * 10 // self.total + 1
            rate = self._bar.format_dict.get("rate")
            eta = f", ETA {tqdm.format_interval((self.total - self.done) / rate)}" if rate else ""
            log.info("%s: %d/%d%s", self.desc, self.done, self.total, eta)

    def close(self) -> None:
        self._bar.close()


@contextmanager
def progress(total: int, desc: str) -> Iterator[Progress]:
    p = Progress(total, desc)
    try:
        yield p
    finally:
        p.close()


def track(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """`items`, advancing a progress bar for each."""
    if total is None:
        items = list(items)
        total = len(items)
    with progress(total, desc) as p:
        for x in items:
            yield x
            p.update()
