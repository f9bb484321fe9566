rule trace:
    output:
        events=P["trace"].out("events.parquet"),
        measured=P["trace"].out("measured.json"),
        config=P["trace"].out("config.json"),
    params:
        emo=P["trace"].params,
    log:
        P["trace"].log,
    resources:
        gpu=1,
    script:
        "../scripts/stage.py"
