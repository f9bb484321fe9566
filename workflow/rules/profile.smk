rule profile:
    input:
        packs=up("profile", "pack", "packs.parquet"),
        events=up("profile", "trace", "events.parquet"),
        measured=up("profile", "trace", "measured.json"),
        graph_nodes=up("profile", "graph", "nodes.parquet"),
    output:
        metrics=out("profile", "metrics.parquet"),
        baseline=out("profile", "baseline.json"),
        config=out("profile", "config.json"),
    params:
        emo=params("profile"),
    log:
        log_of("profile"),
    resources:
        gpu=gpus("profile"),
        gpu_model=gpu_model("profile"),
    script:
        "../scripts/stage.py"
