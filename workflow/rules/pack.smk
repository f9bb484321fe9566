rule pack:
    input:
        nodes=rules.graph.output.nodes,
        edges=rules.graph.output.edges,
        events=rules.trace.output.events,
    output:
        packs=P["pack"].out("packs.parquet"),
        nodes=P["pack"].out("nodes.parquet"),
        edges=P["pack"].out("edges.parquet"),
        iterations=P["pack"].out("iterations.parquet"),
        config=P["pack"].out("config.json"),
    params:
        emo=P["pack"].params,
    log:
        P["pack"].log,
    script:
        "../scripts/stage.py"
