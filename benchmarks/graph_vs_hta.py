"""EMO vs Holistic Trace Analysis: build the graph and its critical path on the same traces.

Tiles a real trace (DLRM rank 0 from ../shared/data/traces, 3.4k events) into traces of 1k to
500k+ events and, per size, runs in fresh processes (best of --repeat, both tools alike):

- EMO's default analysis: read_trace + build_graph + compile_graph + whatif;
- EMO's HTA-compatible mode: `emo analyze --hta-compatible` (emo.analyze.analyze_trace, which
  also does the default analysis) on rank 0 ("hta-c"), and HTA's own job alone in that mode
  (read_trace + hta_critical_path on rank 0, "path");
- HTA 0.5.0 (TraceAnalysis + critical_path_analysis on rank 0) in its own virtual environment (it
  needs pandas<3; created on first use under ~/.cache/emo/hta-venv).

Times are end to end without interpreter start-up and imports (each EMO process first analyses a
small real trace and the untiled source so its compiled kernels are loaded); peak RSS (MB) is the process's maximum
resident set plus that of its largest child. Then the same for a folder of 8 ranks (each DLRM rank
tiled, --ranks-events events in all): EMO reads every rank and builds the cross-rank graph, HTA
reads every rank and analyses rank 0. The last three lines are `what-if nodes/s: N` (the compiled
pass alone, on the largest graph), `hta-compatible speedup vs HTA: Y` and `speedup vs HTA: X` (for
the largest single-file trace both finished).

Usage: python benchmarks/graph_vs_hta.py [--sizes 1000,10000,100000,500000] [--ranks-events 500000]
       [--hta-timeout 1800] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from emo import benchreport

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("graph-vs-hta",)
HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[0].parent / "shared" / "data" / "traces"
RANKS = sorted((SHARED / "dlrm_8rank").glob("worker*_*.json.gz")) if (SHARED / "dlrm_8rank").exists() else []
SOURCE = RANKS[0] if RANKS else None
WARM = SHARED / "hta_alexnet_a100_2stream_cudasync.json.gz"
VENV = Path(os.environ.get("EMO_HTA_VENV", Path.home() / ".cache" / "emo" / "hta-venv"))


def hta_python() -> Path:
    py = VENV / "bin" / "python"
    ok = py.exists() and subprocess.run([py, "-c", "import hta"], capture_output=True).returncode == 0
    if not ok:
        print(f"creating HTA venv in {VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "HolisticTraceAnalysis==0.5.0", "pandas<3"], check=True)
    return py


def peak_rss_mb() -> float:
    """This process's peak resident set plus its largest child's (Linux reports KiB)."""
    return (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    ) / 1024


def span_of(events: list[dict]) -> float:
    xs = [e for e in events if e.get("ph") in ("X", "s", "f")]
    return max(e["ts"] + e.get("dur", 0) for e in xs) - min(e["ts"] for e in xs) + 1000


def tile(events: list[dict], copies: int, span: float | None = None) -> list[dict]:
    """`copies` back-to-back repetitions of one trace, ids shifted so each copy stays distinct
    (ranks of one run tiled with one common `span` stay aligned)."""
    xs = [e for e in events if e.get("ph") in ("X", "s", "f")]
    meta = [e for e in events if e.get("ph") == "M"]
    span = span or span_of(events)
    corr_max = (
        max(
            [e.get("args", {}).get("correlation", 0) for e in xs]
            + [e.get("id", 0) for e in xs if isinstance(e.get("id"), int)]
        )
        + 1
    )
    ext_max = max(e.get("args", {}).get("External id", 0) for e in xs) + 1
    out = list(meta)
    for i in range(copies):
        for e in xs:
            c = dict(e)
            c["ts"] = e["ts"] + i * span
            if "args" in e:
                a = dict(e["args"])
                for k in ("correlation", "wait_on_cuda_event_record_corr_id"):
                    if isinstance(a.get(k), int) and a[k] >= 0:
                        a[k] += i * corr_max
                if isinstance(a.get("External id"), int):
                    a["External id"] += i * ext_max
                c["args"] = a
            if isinstance(e.get("id"), int):
                c["id"] = e["id"] + i * corr_max
            out.append(c)
    return out


def emo_run(path: str, mode: str, rate: bool) -> dict:
    """One timed EMO analysis in this (fresh) process; printed as one JSON line."""
    from emo.analyze import analyze_trace
    from emo.graph import build_graph
    from emo.graph.whatif import compile_graph, whatif
    from emo.trace import read_trace

    for warm in (WARM, SOURCE):  # load the compiled kernels (numba caches them on disk)
        analyze_trace(warm, hta_compatible=True)
    t = time.perf_counter()
    if mode == "hta":
        a = analyze_trace(path, rank=0, hta_compatible=True)
        out = {"total_s": time.perf_counter() - t, "cp_us": a.summary["critical_path_us"]}
        from emo.graph.hta import hta_critical_path

        t = time.perf_counter()  # HTA's own job alone: read the trace, its critical path on rank 0
        hta_critical_path(read_trace(path), 0)
        out["path_s"] = time.perf_counter() - t
    else:
        events = read_trace(path)
        t_read = time.perf_counter() - t
        g = build_graph(events)
        c = compile_graph(g)
        r = whatif(c)
        out = {
            "total_s": time.perf_counter() - t,
            "read_s": t_read,
            "nodes": len(g.nodes),
            "replay_error_ns": int(r.replay_error_ns),
        }
        if rate:
            out["whatif_nodes_per_s"] = whatif_rate(c)
    out["rss_mb"] = peak_rss_mb()
    return out


def emo_time(path: Path, mode: str, repeat: int, rate: bool = False) -> dict:
    runs = []
    for _ in range(repeat):
        p = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--emo-run", mode, str(path)]
            + (["--rate"] if rate else []),
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            raise SystemExit(f"EMO failed on {path}: {p.stderr.strip().splitlines()[-1:]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["total_s"])
    assert best.get("replay_error_ns", 0) == 0
    return best


def hta_time(py: Path, folder: Path, timeout: float, repeat: int) -> dict | None:
    runs = []
    for _ in range(repeat):
        try:
            p = subprocess.run(
                [str(py), str(HERE / "hta_runner.py"), str(folder), "0", "", "0"],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None
        if p.returncode != 0:
            print(f"  HTA failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
            return None
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda h: h["parse_s"] + h["cp_s"])


def whatif_rate(compiled, repeats: int = 20) -> float:
    from emo.graph.whatif import whatif

    rng = np.random.default_rng(0)
    dur = compiled.dur[compiled.pos]  # per node id
    scaled = [(dur * rng.uniform(0.8, 1.25, dur.shape)).astype(np.int64) for _ in range(repeats)]
    whatif(compiled, scaled[0])
    t = time.perf_counter()
    for d in scaled:
        whatif(compiled, d)
    return compiled.n * repeats / (time.perf_counter() - t)


HEADER = (
    f"{'events':>9} {'nodes':>8} {'EMO s':>7} {'EMO MB':>7} {'HTA s':>7} {'HTA MB':>7} {'HTA/EMO':>7}  "
    f"{'EMO read':>8} {'EMO g+cp':>8} {'HTA read':>8} {'HTA g+cp':>8}  {'EMO hta-c s':>11} {'MB':>6} {'HTA/hta-c':>9}"
    f"  {'path s':>7} {'HTA/path':>8}"
)


def row(n_ev: int, emo: dict, hc: dict, h: dict | None) -> str:
    head = f"{n_ev:>9} {emo['nodes']:>8} {emo['total_s']:>7.3f} {emo['rss_mb']:>7.0f} "
    if h is None:
        return head + f"{'timeout':>7}"
    hta_s = h["parse_s"] + h["cp_s"]
    return (
        head + f"{hta_s:>7.2f} {h['rss_mb']:>7.0f} {hta_s / emo['total_s']:>7.1f}  "
        f"{emo['read_s']:>8.3f} {emo['total_s'] - emo['read_s']:>8.3f} {h['parse_s']:>8.2f} {h['cp_s']:>8.2f}  "
        f"{hc['total_s']:>11.3f} {hc['rss_mb']:>6.0f} {hta_s / hc['total_s']:>9.1f}"
        f"  {hc['path_s']:>7.3f} {hta_s / hc['path_s']:>8.1f}"
    )


def write_trace(path: Path, base: dict, events: list[dict]) -> None:
    path.write_text(json.dumps({**{k: v for k, v in base.items() if k != "traceEvents"}, "traceEvents": events}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--sizes", default="1000,10000,100000,500000", help="approximate event counts")
    ap.add_argument("--ranks-events", type=int, default=500000, help="events in the 8-rank folder (0: skip)")
    ap.add_argument("--hta-timeout", type=float, default=1800, help="seconds per HTA run")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool and size; the best is kept")
    ap.add_argument("--emo-run", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--rate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.emo_run:
        print(json.dumps(emo_run(args.emo_run[1], args.emo_run[0], args.rate)))
        return 0
    if SOURCE is None:
        print(f"no source trace under {SHARED}", file=sys.stderr)
        return 1
    from emo.trace.kineto import load_json

    base = load_json(SOURCE)
    n_base = sum(1 for e in base["traceEvents"] if e.get("ph") in ("X", "s", "f"))
    py = hta_python()
    print(f"source: {SOURCE.name} ({n_base} events), HTA venv: {VENV}, {os.cpu_count()} CPUs")
    print(HEADER)
    best = None
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "trace"
            folder.mkdir()
            evs = (
                tile(base["traceEvents"], max(1, round(size / n_base)))
                if size >= n_base
                else _head(base["traceEvents"], size)
            )
            path = folder / "rank0.json"
            write_trace(path, base, evs)
            del evs
            emo = emo_time(path, "default", args.repeat, rate=size == sizes[-1])
            hc = emo_time(path, "hta", args.repeat)
            h = hta_time(py, folder, args.hta_timeout, args.repeat)
            n_ev = sum(1 for _ in load_json(path)["traceEvents"])
            print(row(n_ev, emo, hc, h), flush=True)
            if h is not None:
                hta_s = h["parse_s"] + h["cp_s"]
                best = (n_ev, hta_s / emo["total_s"], hta_s / hc["total_s"], emo.get("whatif_nodes_per_s"))
    if args.ranks_events and len(RANKS) > 1:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "ranks"
            folder.mkdir()
            docs = [load_json(f) for f in RANKS]
            span = max(span_of(d["traceEvents"]) for d in docs)
            copies = max(1, round(args.ranks_events / sum(len(d["traceEvents"]) for d in docs)))
            n_ev = 0
            for f, d in zip(RANKS, docs):
                evs = tile(d["traceEvents"], copies, span)
                n_ev += len(evs)
                write_trace(folder / f.name.replace(".gz", ""), d, evs)
            del docs, evs
            emo = emo_time(folder, "default", args.repeat)
            hc = emo_time(folder, "hta", args.repeat)
            h = hta_time(py, folder, args.hta_timeout, args.repeat)
            print(f"{len(RANKS)} ranks, {n_ev} events in all (EMO: every rank, cross-rank graph; HTA: rank 0):")
            print(row(n_ev, emo, hc, h), flush=True)
    if best and best[3]:
        print(f"what-if nodes/s: {best[3]:.0f}")
    print(f"hta-compatible speedup vs HTA: {best[2]:.1f}" if best else "hta-compatible speedup vs HTA: n/a")
    print(f"speedup vs HTA: {best[1]:.1f}" if best else "speedup vs HTA: n/a")
    return 0


def _head(events: list[dict], n: int) -> list[dict]:
    """A smaller trace: the first events in time (with all metadata), kept whole per correlation."""
    xs = sorted((e for e in events if e.get("ph") in ("X", "s", "f")), key=lambda e: e["ts"])[:n]
    return [e for e in events if e.get("ph") == "M"] + xs


if __name__ == "__main__":
    with benchreport.recording("graph-vs-hta"):
        sys.exit(main())
