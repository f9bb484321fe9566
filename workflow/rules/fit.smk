rule fit:
    input:
        unpack(stage_inputs("fit")),
        outside_files("fit"),
    output:
        **stage_outputs("fit"),
    log:
        log_of("fit"),
    params:
        emo=params("fit"),
    script:
        "../scripts/stage.py"
