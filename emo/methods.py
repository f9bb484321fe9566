"""The one registry of methods: what `optimizer.name` may be, and where each runs."""

OFFLINE = ("emo", "static")  # optimize plans their policy from the trace and the model
ONLINE = ("zeus", "geepafs", "perseus")  # they tune (perseus: profile, then plan) while validate runs the workload
METHODS = ("emo", "static", "zeus", "perseus", "geepafs")  # the order tables and plots show them in
# Ablations (offline, docs/baselines.md): a labelled variant of a method, never the method itself.
# Each names the planner solve runs for it; its optimizer config (conf/optimizer/<name>.yaml) sets the rest.
ABLATIONS = {
    "perseus+emo-search": "perseus",  # Perseus's lowtime walk inside EMO's budget search, polish and lead
    "emo-dp": "emo",  # EMO's DP alone: no budget search, repair, uniform start, polish or single clock
    "emo-pass": "emo",  # EMO with one window per pass (change_points=pass)
    "emo-grid": "emo",  # EMO on the paper's 20 ms grid (change_points=grid)
}
OFFLINE = OFFLINE + tuple(ABLATIONS)
ALL_METHODS = METHODS + tuple(ABLATIONS)  # what optimizer.name may be

assert sorted(ALL_METHODS) == sorted(OFFLINE + ONLINE)
# The table's rule: a method keeps the budget when its measured PL <= budget + PL_TOLERANCE_PCT points
# (validate's within_budget and its measured static pick use it; so should the tables' scoring).
PL_TOLERANCE_PCT = 0.5
