# optimize: the policy of an offline method (emo, static, perseus) within the budget, from the pack
# graph and the fitted model. Its hash covers optimizer + budget: a new budget re-runs only this and validate.
rule optimize:
    input:
        packs=rules.pack.output.packs,
        nodes=rules.pack.output.nodes,
        edges=rules.pack.output.edges,
        iterations=rules.pack.output.iterations,
        model=rules.fit.output.model,
    output:
        policy=P["optimize"].out("policy.json"),
        summary=P["optimize"].out("summary.json"),
        config=P["optimize"].out("config.json"),
    params:
        emo=P["optimize"].params,
    log:
        P["optimize"].log,
    script:
        "../scripts/stage.py"
