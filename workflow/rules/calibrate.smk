rule calibrate:
    input:
        unpack(stage_inputs("calibrate")),
        outside_files("calibrate"),
    output:
        **stage_outputs("calibrate"),
    log:
        log_of("calibrate"),
    # a sweep's long pole (every fit waits on it): start it before the jobs that do not need it
    priority: 10
    resources:
        gpu=gpus("calibrate"),
        gpu_model=gpu_model("calibrate"),
    params:
        emo=params("calibrate"),
    script:
        "../scripts/stage.py"
