rule graph:
    input:
        unpack(stage_inputs("graph")),
        outside_files("graph"),
    output:
        **stage_outputs("graph"),
    params:
        emo=params("graph"),
    log:
        log_of("graph"),
    script:
        "../scripts/stage.py"
