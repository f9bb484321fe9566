"""`emo analyze PATH`: critical path, its breakdown, slack per GPU and replay error of a trace.

PATH is a Kineto JSON trace (plain or .gz), a folder of per-rank Kineto files, or an Nsight
Systems SQLite export. `--hta-compatible` also reports the critical path under Holistic Trace
Analysis's conventions (per rank), so the two tools can be compared number for number."""

from __future__ import annotations

import argparse
import json

from emo.analyze import analyze_trace


def _text(s: dict) -> str:
    lines = [
        f"critical path   {s['critical_path_us']:.1f} us  ({s['mode']}; makespan {s['makespan_us']:.1f} us, "
        f"{s['critical_path_nodes']} nodes on ranks {s['critical_path_ranks']})"
    ]
    label = "  EMO breakdown " if s["mode"] == "hta-compatible" else "  breakdown     "
    lines.append(label + ", ".join(f"{k} {v:.1f}" for k, v in s["breakdown_us"].items() if v))
    if s["mode"] == "hta-compatible":
        for r, h in s["hta"].items():
            lines.append(
                f"  HTA rank {r}    {h['critical_path_us']} us  "
                + ", ".join(f"{k} {v}" for k, v in h["breakdown_us"].items() if v)
            )
    lines.append(f"replay error    {s['replay_error_us']:.3f} us")
    for w in s["warnings"]:  # what the numbers above may be wrong by
        lines.append(f"warning: {w}")
    lines.append(f"ranks           {s['ranks']}; collectives matched {s['collectives_matched']}/{s['collectives']}")
    for u in s["collectives_unmatched"]:
        lines.append(
            f"  not matched   {u['instances']} x {u['group'][:60]}: {u['why']} "
            "(analysed as one kernel per rank, no wait assumed)"
        )
    for gpu, us in s["slack_us"].items():
        lines.append(f"slack {gpu:12s} {us:.1f} us")
    waited = s["collective_waits"]["waited_for_us_by_rank"]
    if waited:
        lines.append(
            "collective waits: ranks waited for " + ", ".join(f"rank {r}: {us:.1f} us" for r, us in waited.items())
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from emo.errors import signals_raise

    if args.perfetto:  # before the analysis: a refused path costs nothing
        from emo.io import check_output

        check_output(args.perfetto, "--perfetto", inputs={"PATH": args.path}, force=args.force)
    with signals_raise():  # SIGTERM, SIGHUP: as Ctrl-C, so the copy of a pipe is removed
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    a = analyze_trace(
        args.path,
        rank=args.rank,
        annotation=args.annotation,
        instance=args.instance,
        hta_compatible=args.hta_compatible,
    )
    if args.perfetto:
        from emo.graph.perfetto import write_perfetto

        try:  # written atomically: a failed write leaves nothing behind
            write_perfetto(args.perfetto, args.path, a.events, a.graph, a.result, a.t0_ns)
        except OSError as e:
            raise ValueError(f"{args.perfetto}: cannot write ({e.strerror or e})") from None
    text = json.dumps(a.summary, default=str) if args.json else _text(a.summary)
    from emo.errors import write_stdout

    write_stdout(text + "\n")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="critical path, slack and replay error of a trace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="Kineto JSON (.json/.json.gz), folder of per-rank files, or nsys .sqlite")
    p.add_argument("--rank", type=int, default=None, help="analyse this rank only")
    p.add_argument("--annotation", default=None, help="restrict to an annotation, e.g. ProfilerStep")
    p.add_argument("--instance", type=int, default=0, help="which instance of the annotation (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--perfetto",
        metavar="OUT",
        default=None,
        help="write the trace with critical-path and slack tracks (.json or .json.gz)",
    )
    p.add_argument("--force", action="store_true", help="let --perfetto replace an existing file")
    p.add_argument(
        "--hta-compatible",
        action="store_true",
        help="also compute the critical path with Holistic Trace Analysis's conventions",
    )
    p.set_defaults(func=run)
