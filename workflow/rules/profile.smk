rule profile:
    input:
        unpack(stage_inputs("profile")),
        outside_files("profile"),
    output:
        **stage_outputs("profile"),
    log:
        log_of("profile"),
    resources:
        gpu=gpus("profile"),
        gpu_model=gpu_model("profile"),
    params:
        emo=params("profile"),
    script:
        "../scripts/stage.py"
