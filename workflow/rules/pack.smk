rule pack:
    input:
        nodes=up("pack", "graph", "nodes.parquet"),
        edges=up("pack", "graph", "edges.parquet"),
        events=up("pack", "trace", "events.parquet"),
    output:
        packs=out("pack", "packs.parquet"),
        nodes=out("pack", "nodes.parquet"),
        edges=out("pack", "edges.parquet"),
        iterations=out("pack", "iterations.parquet"),
        config=out("pack", "config.json"),
    params:
        emo=params("pack"),
    log:
        log_of("pack"),
    script:
        "../scripts/stage.py"
