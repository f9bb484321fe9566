rule graph:
    input:
        unpack(stage_inputs("graph")),
        outside_files("graph"),
    output:
        **stage_outputs("graph"),
    log:
        log_of("graph"),
    params:
        emo=params("graph"),
    script:
        "../scripts/stage.py"
