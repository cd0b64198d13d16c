# From the cells' Parquet logs to the study's summary table and figures (scripts by trainer/analysis). One pair of
# rules for every kind of study: KIND (common.smk; the records are in trainer/analysis/kinds.py) names its
# functions, figures, captions, extra outputs and reference numbers, so the users' commands (`snakemake figures`,
# `snakemake summarize`) are the same for every study and a new kind needs no new rule.


rule summarize:
    input:
        **PAPER_NUMBERS,
        metrics=metrics_files(),
        episodes=episode_files(),
    output:
        **KIND.extra_outputs,
        csv=summary_report("results/summary.csv"),
        md=summary_report("results/summary.md"),
        runs="results/runs.parquet",
    log:
        "results/logs/summarize.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        **summarize_params(),
        base_dir=cells_dir,
    script:
        "../scripts/summarize.py"


rule figures:
    input:
        **PAPER_NUMBERS,
        metrics=metrics_files(),
        runs="results/runs.parquet",
    output:
        *figure_reports(),
    log:
        "results/logs/figures.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        **figure_params(),
        base_dir=cells_dir,
    script:
        "../scripts/plot_figures.py"
