rule fit:
    input:
        unpack(stage_inputs("fit")),
        outside_files("fit"),
    output:
        **stage_outputs("fit"),
    params:
        emo=params("fit"),
    log:
        log_of("fit"),
    script:
        "../scripts/stage.py"
