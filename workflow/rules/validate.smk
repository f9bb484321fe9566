# validate: max clock vs the method, measured on the device. Offline methods (emo, static, perseus)
# bring optimize's policy; online baselines (zeus, geepafs) tune while validate runs them.
ONLINE_METHODS = ("zeus", "geepafs")


rule validate:
    input:
        **({} if EMO["optimizer"]["name"] in ONLINE_METHODS else {"policy": P["optimize"].out("policy.json")}),
    output:
        result=P["validate"].out("result.json"),
        config=P["validate"].out("config.json"),
    params:
        emo=P["validate"].params,
    log:
        P["validate"].log,
    resources:
        gpu=1,
    script:
        "../scripts/stage.py"
