rule trace:
    input:
        unpack(read_files("trace")),  # a recorded workload.path
    output:
        events=out("trace", "events.parquet"),
        measured=out("trace", "measured.json"),
        config=out("trace", "config.json"),
    params:
        emo=params("trace"),
    log:
        log_of("trace"),
    resources:
        gpu=gpus("trace"),
        gpu_model=gpu_model("trace"),
    script:
        "../scripts/stage.py"
