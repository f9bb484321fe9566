"""Re-run the trace fuzz corpus (tests/test_fuzz_traces.py: the same seeded mutations of the bundled
traces) and count what `emo analyze --json` made of each damaged trace: a traceback, a hang (past
--timeout seconds), a one-line refusal, or an answer; and of the answers, which differ from the
undamaged trace's (total slack, critical path or its gpu_compute by more than 1 %) and which carry
a warning. A differing answer without a warning is a confident wrong number.

    python3 benchmarks/fuzz_flags.py [--cases 300] [--timeout 60]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import signal
import sys
import tempfile
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_fuzz_traces as corpus  # noqa: E402  (the corpus is the test's, not a copy)

from emo import benchreport  # noqa: E402
from emo.cli import main  # noqa: E402

# the sections of docs/results.md this script writes with --write-results (emo.benchreport)
RESULTS_SECTIONS = ("fuzz-flags",)


class Hang(Exception):
    pass


def answer(path: Path, timeout: int) -> tuple[int, str]:
    def alarm(*_):
        raise Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    try:
        out = io.StringIO()
        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            code = main(["analyze", str(path), "--json"])
        return code, out.getvalue()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def numbers(s: dict) -> tuple[float, float, float]:
    return sum(s["slack_us"].values()), s["critical_path_us"], s["breakdown_us"]["gpu_compute"]


def same(a, b) -> bool:
    return all(abs(x - y) <= 0.01 * max(abs(y), 1.0) for x, y in zip(a, b))


def classify(n_cases: int, timeout: int, tmp: Path) -> tuple[Counter, list[str]]:
    rng = random.Random(corpus.SEED)
    docs = [json.loads(gzip.decompress(p.read_bytes())) for p in corpus.BUNDLED]
    clean = []
    for i, d in enumerate(docs):
        p = tmp / f"clean{i}.json"
        p.write_text(json.dumps(d))
        clean.append(numbers(json.loads(answer(p, timeout)[1])))
    counts: Counter = Counter()
    wrong = []
    for i in range(n_cases):
        path = corpus._write(corpus.mutate(docs[i % len(docs)], rng), tmp / f"case{i}.json", rng)
        try:
            code, out = answer(path, timeout)
        except Hang:
            counts["hang"] += 1
            continue
        except BaseException as e:  # what the user must never see
            counts["traceback"] += 1
            wrong.append(f"case {i}: {type(e).__name__}: {e}"[:200])
            continue
        finally:
            path.unlink()
        if code != 0:
            counts["refused"] += 1
            continue
        s = json.loads(out)
        differs = not same(numbers(s), clean[i % len(docs)])
        flagged = bool(s["warnings"])
        counts[f"answered, {'differs' if differs else 'same'}, {'warned' if flagged else 'no warning'}"] += 1
        if differs and not flagged:
            wrong.append(f"case {i}: {numbers(s)} (undamaged: {clean[i % len(docs)]}), no warning")
    return counts, wrong


def run(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_flag(ap)
    ap.add_argument("--cases", type=int, default=corpus.CASES)
    ap.add_argument("--timeout", type=int, default=60, help="seconds before a case counts as a hang")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="emo-fuzz-") as tmp:
        counts, wrong = classify(args.cases, args.timeout, Path(tmp))
    answered = sum(v for k, v in counts.items() if k.startswith("answered"))
    differ = sum(v for k, v in counts.items() if k.startswith("answered, differs"))
    warned = sum(v for k, v in counts.items() if k.startswith("answered") and k.endswith(", warned"))
    differ_warned = counts["answered, differs, warned"]
    print(
        f"{args.cases} damaged traces: {counts['traceback']} tracebacks, {counts['hang']} hangs, "
        f"{counts['refused']} refused in one line, {answered} answered"
    )
    print(
        f"answered: {warned} of {answered} carry a warning; {differ} differ from the undamaged trace's "
        f"answer, {differ_warned} of them with a warning"
    )
    for k, v in sorted(counts.items()):
        print(f"  {k}: {v}")
    for w in wrong:
        print("  " + w)
    return 1 if counts["traceback"] or counts["hang"] or differ > differ_warned else 0


if __name__ == "__main__":
    with benchreport.recording("fuzz-flags"):
        sys.exit(run())
