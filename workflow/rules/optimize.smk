# optimize: the policy of an offline method (emo, static, an ablation) within the budget, from the pack
# graph and the fitted model. Its hash covers optimizer + budget: a new budget re-runs only this and validate.
rule optimize:
    input:
        unpack(stage_inputs("optimize")),
        outside_files("optimize"),
    output:
        **stage_outputs("optimize"),
    log:
        log_of("optimize"),
    threads: share_of_cores
    params:
        emo=params("optimize"),
    script:
        "../scripts/stage.py"
