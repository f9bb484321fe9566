"""The one registry of methods: what `optimizer.name` may be, and where each runs."""

OFFLINE = ("emo", "static", "perseus")  # optimize plans their policy from the trace and the model
ONLINE = ("zeus", "geepafs")  # they tune while validate runs the workload
METHODS = ("emo", "static", "zeus", "perseus", "geepafs")  # the order tables and plots show them in

assert sorted(METHODS) == sorted(OFFLINE + ONLINE)
# The table's rule: a method keeps the budget when its measured PL <= budget + PL_TOLERANCE_PCT points
# (validate's within_budget and its measured static pick use it; so should the tables' scoring).
PL_TOLERANCE_PCT = 0.5
