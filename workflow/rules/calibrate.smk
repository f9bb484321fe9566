rule calibrate:
    output:
        bench=out("calibrate", "bench.parquet"),
        calibration=out("calibrate", "calibration.json"),
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
