"""The one registry of methods: what `optimizer.name` may be, and where each runs."""

OFFLINE = ("emo", "static", "perseus")  # optimize plans their policy from the trace and the model
ONLINE = ("zeus", "geepafs")  # they tune while validate runs the workload
METHODS = ("emo", "static", "zeus", "perseus", "geepafs")  # the order tables and plots show them in

assert sorted(METHODS) == sorted(OFFLINE + ONLINE)
