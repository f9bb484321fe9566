rule graph:
    input:
        events=rules.trace.output.events,
    output:
        nodes=P["graph"].out("nodes.parquet"),
        edges=P["graph"].out("edges.parquet"),
        summary=P["graph"].out("summary.json"),
        config=P["graph"].out("config.json"),
    params:
        emo=P["graph"].params,
    log:
        P["graph"].log,
    script:
        "../scripts/stage.py"
