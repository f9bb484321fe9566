rule pack:
    input:
        unpack(stage_inputs("pack")),
        outside_files("pack"),
    output:
        **stage_outputs("pack"),
    log:
        log_of("pack"),
    params:
        emo=params("pack"),
    script:
        "../scripts/stage.py"
