# validate: max clock vs the method, measured on the device. Offline methods (emo, static, the ablations)
# bring optimize's policy; online baselines (zeus, geepafs) tune while validate runs them.
rule validate:
    input:
        unpack(stage_inputs("validate")),
        outside_files("validate"),
    output:
        **stage_outputs("validate"),
    log:
        log_of("validate"),
    resources:
        gpu=gpus("validate"),
        gpu_model=gpu_model("validate"),
    params:
        emo=params("validate"),
    script:
        "../scripts/stage.py"
