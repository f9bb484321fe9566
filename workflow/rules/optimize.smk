# optimize: the policy of an offline method (emo, static, an ablation) within the budget, from the pack
# graph and the fitted model. Its hash covers optimizer + budget: a new budget re-runs only this and validate.
rule optimize:
    input:
        unpack(stage_inputs("optimize")),
        outside_files("optimize"),
    output:
        **stage_outputs("optimize"),
    params:
        emo=params("optimize"),
    log:
        log_of("optimize"),
    threads: share_of_cores
    script:
        "../scripts/stage.py"
