# summary: the sweep's shareable summary (emo.cli.compare.write_summary), registered for `snakemake --report`
rule summary:
    input:
        [job.result for job in SWEEP.jobs],
    output:
        table=report(str(SWEEP.summary / "compare.tsv"), caption="../report/compare.rst", category="Comparison"),
        jobs=report(str(SWEEP.summary / "jobs.tsv"), caption="../report/jobs.rst", category="Comparison"),
        plots=report(
            directory(str(SWEEP.summary / "plots")),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Plots",
        ),
        index=str(SWEEP.summary / "plots.json"),
    log:
        str(SWEEP.results / "summary" / "logs" / f"{SWEEP.summary.name}.log"),
    params:
        jobs=[(job.name, job.plans["validate"].hash) for job in SWEEP.jobs],
    script:
        "../scripts/summary.py"
