rule graph:
    input:
        events=up("graph", "trace", "events.parquet"),
    output:
        nodes=out("graph", "nodes.parquet"),
        edges=out("graph", "edges.parquet"),
        summary=out("graph", "summary.json"),
        config=out("graph", "config.json"),
    params:
        emo=params("graph"),
    log:
        log_of("graph"),
    script:
        "../scripts/stage.py"
