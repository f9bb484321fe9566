rule pack:
    input:
        unpack(stage_inputs("pack")),
        outside_files("pack"),
    output:
        **stage_outputs("pack"),
    params:
        emo=params("pack"),
    log:
        log_of("pack"),
    script:
        "../scripts/stage.py"
