rule calibrate:
    # a sweep's long pole (every fit waits on it): start it before the jobs that do not need it
    priority: 10
    input:
        unpack(stage_inputs("calibrate")),
        outside_files("calibrate"),
    output:
        **stage_outputs("calibrate"),
    params:
        emo=params("calibrate"),
    log:
        log_of("calibrate"),
    resources:
        gpu=gpus("calibrate"),
        gpu_model=gpu_model("calibrate"),
    script:
        "../scripts/stage.py"
