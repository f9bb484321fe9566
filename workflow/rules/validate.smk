# validate: max clock vs the method, measured on the device. Offline methods (emo, static, the ablations)
# bring optimize's policy; online baselines (zeus, geepafs) tune while validate runs them.
rule validate:
    input:
        unpack(validate_inputs),
    output:
        result=out("validate", "result.json"),
        config=out("validate", "config.json"),
    params:
        emo=params("validate"),
    log:
        log_of("validate"),
    resources:
        gpu=gpus("validate"),
        gpu_model=gpu_model("validate"),
    script:
        "../scripts/stage.py"
