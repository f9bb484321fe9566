rule calibrate:
    output:
        bench=P["calibrate"].out("bench.parquet"),
        config=P["calibrate"].out("config.json"),
    params:
        emo=P["calibrate"].params,
    log:
        P["calibrate"].log,
    resources:
        gpu=1,
    script:
        "../scripts/stage.py"
