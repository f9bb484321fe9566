"""Solvers over a Problem: EMO's DP (Algorithm 2), the static and Perseus (lowtime) baselines, and
the LP/MILP formulation (the DP's LP start and its exact reference)."""
