"""Read the per-rank files of a folder, in parallel where the machine has cores for it.

Where one process reads them all (small folders, machines with fewer than MIN_CORES cores), several
files are read at once by threads (as many as cores, at most MAX_THREADS): the compiled scan of each
file's JSON text, most of a read, runs without the GIL (emo.trace.kineto_scan). Otherwise this
process reads one share of the files; each other share goes to a fresh
`python -m emo.trace.ranks` process that reads its files one at a time and hands each table back as
an Arrow (Feather) file, so memory is bounded by the tables themselves plus one file being parsed
per reader. Fresh processes rather than a fork: the
caller may hold threads (a progress bar, a tracking client), and a forked lock is a deadlock; and
unlike multiprocessing's spawn, no caller's main module is re-imported."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from emo.errors import InputError
from emo.trace.kineto import no_gc, read_kineto

# Folders of at least this many bytes are read by several processes, on machines with at least
# MIN_CORES cores: a worker's start (an interpreter importing numpy and pandas) costs about as much
# as parsing a 60k-event file, so on two cores the pool only breaks even.
PARALLEL_BYTES = 32 << 20
MIN_CORES = 4
MAX_READERS = 8
MAX_THREADS = 8


def readers(files: list[Path]) -> int:
    """How many processes read `files`: one per core, at most one per file and MAX_READERS; one
    (this process) for small folders and small machines."""
    cores = len(os.sched_getaffinity(0))
    if cores < MIN_CORES or sum(f.stat().st_size for f in files) < PARALLEL_BYTES:
        return 1
    return max(1, min(len(files), cores, MAX_READERS))


def read_ranks(files: list[Path]) -> list[pd.DataFrame]:
    """One event table per file, in file order (the file's index is its rank unless it says one)."""
    n = readers(files)
    if n < 2:
        return read_here(list(enumerate(files)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    share = [i % n for i in range(len(files))]  # this process reads share 0 while the workers read theirs
    with tempfile.TemporaryDirectory(prefix="emo-ranks-") as tmp:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "emo.trace.ranks",
                    tmp,
                    *(f"{i}={f}" for i, f in enumerate(files) if share[i] == w),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for w in range(1, n)
        ]
        try:
            mine = {i: read_kineto(f, rank=i) for i, f in enumerate(files) if share[i] == 0}
        finally:
            errors = [p.communicate()[1].strip() for p in procs]
        for p, err in zip(procs, errors):
            if p.returncode == 2 and err:  # the worker's InputError, its one line as the worker said it
                raise InputError(err.splitlines()[-1])
            if p.returncode != 0:
                raise ValueError(err.splitlines()[-1] if err else f"a trace reader exited with {p.returncode}")
        return [mine[i] if share[i] == 0 else pd.read_feather(Path(tmp) / f"{i}.feather") for i in range(len(files))]


def read_here(jobs: list[tuple[int, Path]]) -> list[pd.DataFrame]:
    """The tables of (rank, file) jobs, in their order, read by threads in this process (the first
    failing file's error is raised, as when they are read one after another)."""
    threads = min(len(jobs), len(os.sched_getaffinity(0)), MAX_THREADS)
    if threads < 2:
        return [read_kineto(f, rank=i) for i, f in jobs]
    with no_gc(), ThreadPoolExecutor(threads, thread_name_prefix="emo-read") as pool:
        return list(pool.map(lambda job: read_kineto(job[1], rank=job[0]), jobs))


def _worker(out: str, jobs: list[str]) -> int:
    for job in jobs:
        i, path = job.split("=", 1)
        try:
            table = read_kineto(Path(path), rank=int(i))
        except ValueError as e:  # the one-line message, passed on as it is, and its type by the status
            print(e, file=sys.stderr)
            return e.exit_code if isinstance(e, InputError) else 1
        table.to_feather(Path(out) / f"{i}.feather")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2:]))
