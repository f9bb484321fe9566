rule trace:
    input:
        unpack(stage_inputs("trace")),
        outside_files("trace"),
    output:
        **stage_outputs("trace"),
    log:
        log_of("trace"),
    resources:
        gpu=gpus("trace"),
        gpu_model=gpu_model("trace"),
    params:
        emo=params("trace"),
    script:
        "../scripts/stage.py"
