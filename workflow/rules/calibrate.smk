rule calibrate:
    output:
        bench=out("calibrate", "bench.parquet"),
        config=out("calibrate", "config.json"),
    params:
        emo=params("calibrate"),
    log:
        log_of("calibrate"),
    resources:
        gpu=gpus("calibrate"),
        gpu_model=gpu_model("calibrate"),
    script:
        "../scripts/stage.py"
