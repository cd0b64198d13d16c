# From the cells' Parquet logs to the study's summary table and figures (scripts by trainer/analysis). One pair of
# rules for every kind of study: `params.study` picks the analysis in the scripts (main: Figures 2-5 and the
# Figure-2 table; companion: its validation table and three figures; stability: the lr sweep and the selected
# lrs; horizon: success and collapses per task length), and FIGURES / SUMMARY_CAPTION / EXTRA_SUMMARY_OUTPUTS
# (common.smk) name its files, so the users' commands (`snakemake figures`, `snakemake summarize`) are the same.


rule summarize:
    input:
        metrics=metrics_files(),
        episodes=episode_files(),
        **PAPER_NUMBERS,
    output:
        csv=summary_report("results/summary.csv"),
        md=summary_report("results/summary.md"),
        runs="results/runs.parquet",
        **EXTRA_SUMMARY_OUTPUTS,
    params:
        base_dir=cells_dir,
        **analysis_params(),
    log:
        "results/logs/summarize.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/summarize.py"


rule figures:
    input:
        metrics=metrics_files(),
        runs="results/runs.parquet",
        **PAPER_NUMBERS,
    output:
        *figure_reports(),
    params:
        base_dir=cells_dir,
        **figure_params(),
    log:
        "results/logs/figures.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/plot_figures.py"
