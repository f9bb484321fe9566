"""Glue to the pipeline: PackTables to a Problem and its windows, a Solution to a FrequencyPolicy,
the predictor's final check, and `solve`, the optimize stage's one call."""
