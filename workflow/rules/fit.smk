rule fit:
    input:
        bench=up("fit", "calibrate", "bench.parquet"),
        metrics=up("fit", "profile", "metrics.parquet"),
        baseline=up("fit", "profile", "baseline.json"),
        packs=up("fit", "pack", "packs.parquet"),
        pack_nodes=up("fit", "pack", "nodes.parquet"),
        iterations=up("fit", "pack", "iterations.parquet"),
        measured=up("fit", "trace", "measured.json"),
    output:
        model=out("fit", "model.parquet"),
        check=out("fit", "check.json"),
        config=out("fit", "config.json"),
    params:
        emo=params("fit"),
    log:
        log_of("fit"),
    script:
        "../scripts/stage.py"
