"""Run Holistic Trace Analysis's critical path on one trace; print one JSON line.

Runs inside HTA's own virtual environment (HTA 0.5.0 needs pandas<3), so it imports nothing
from emo. Usage: python hta_runner.py TRACE_DIR RANK [ANNOTATION INSTANCE]
(an empty ANNOTATION means the whole trace)."""

import json
import logging
import resource
import sys
import time

logging.disable(logging.WARNING)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):  # (argv, not argparse: the runner stays minimal)
        print(__doc__, file=sys.stderr if len(sys.argv) < 2 else sys.stdout)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    trace_dir, rank = sys.argv[1], int(sys.argv[2])
    annotation = sys.argv[3] if len(sys.argv) > 3 else ""
    instance = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t_import = time.perf_counter()
    analyzer = TraceAnalysis(trace_dir=trace_dir)
    t_parse = time.perf_counter()
    graph, ok = analyzer.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance)
    t_cp = time.perf_counter()
    cp = sum(graph.edges[u, v]["weight"] for u, v in zip(graph.critical_path_nodes, graph.critical_path_nodes[1:]))
    bd = graph.get_critical_path_breakdown()
    by_type = {}
    if bd is not None:
        for k, v in bd.groupby("type")["duration"].sum().items():
            by_type[str(k)] = int(v)
    print(
        json.dumps(
            {
                "ok": bool(ok),
                "cp_us": int(cp),
                "path_nodes": len(graph.critical_path_nodes),
                "graph_nodes": graph.number_of_nodes(),
                "graph_edges": graph.number_of_edges(),
                "import_s": t_import - t0,
                "parse_s": t_parse - t_import,
                "cp_s": t_cp - t_parse,
                "breakdown_us": by_type,
                # peak resident set (MB) of this process plus its largest child (HTA parses ranks in a pool)
                "rss_mb": (
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                    + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                )
                / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
