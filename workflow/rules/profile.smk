rule profile:
    input:
        packs=rules.pack.output.packs,
        events=rules.trace.output.events,
        measured=rules.trace.output.measured,
        graph_nodes=rules.graph.output.nodes,
    output:
        metrics=P["profile"].out("metrics.parquet"),
        baseline=P["profile"].out("baseline.json"),
        config=P["profile"].out("config.json"),
    params:
        emo=P["profile"].params,
    log:
        P["profile"].log,
    resources:
        gpu=1,
    script:
        "../scripts/stage.py"
