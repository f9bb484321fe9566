# optimize: the policy of an offline method (emo, static, an ablation) within the budget, from the pack
# graph and the fitted model. Its hash covers optimizer + budget: a new budget re-runs only this and validate.
rule optimize:
    input:
        packs=up("optimize", "pack", "packs.parquet"),
        nodes=up("optimize", "pack", "nodes.parquet"),
        edges=up("optimize", "pack", "edges.parquet"),
        iterations=up("optimize", "pack", "iterations.parquet"),
        model=up("optimize", "fit", "model.parquet"),
        check=up("optimize", "fit", "check.json"),  # one iteration's measured spread: the budget's tolerance
        calibration=up("optimize", "calibrate", "calibration.json"),  # the measured clock-request latency
    output:
        policy=out("optimize", "policy.json"),
        summary=out("optimize", "summary.json"),
        config=out("optimize", "config.json"),
    params:
        emo=params("optimize"),
    log:
        log_of("optimize"),
    threads: share_of_cores
    script:
        "../scripts/stage.py"
