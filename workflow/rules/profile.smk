rule profile:
    input:
        unpack(stage_inputs("profile")),
        outside_files("profile"),
    output:
        **stage_outputs("profile"),
    params:
        emo=params("profile"),
    log:
        log_of("profile"),
    resources:
        gpu=gpus("profile"),
        gpu_model=gpu_model("profile"),
    script:
        "../scripts/stage.py"
