"""The orchestration: planning stage folders, running Snakemake, tracking in MLflow."""
