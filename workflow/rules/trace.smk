rule trace:
    output:
        events=P["trace"].out("events.parquet"),
        measured=P["trace"].out("measured.json"),
        config=P["trace"].out("config.json"),
    params:
        emo=stage_params("trace"),
    log:
        P["trace"].log,
    resources:
        gpu=1,
    script:
        "../scripts/stage.py"
