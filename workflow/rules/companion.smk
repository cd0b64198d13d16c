# The companion study's analysis ("When Does Muon Help Agentic RL?"): from the cells' Parquet logs to its summary
# table and figures (trainer/analysis/companion.py). Same rule names as the main study's analysis.smk, so the
# users' commands (`snakemake figures`, `snakemake summarize`) are the same for both studies.


rule summarize:
    input:
        metrics=metrics_files(),
        paper_numbers=PAPER_NUMBERS,
    output:
        csv=report("results/summary.csv", caption="../report/companion_summary.rst", category="Summary"),
        md=report("results/summary.md", caption="../report/companion_summary.rst", category="Summary"),
        runs="results/runs.parquet",
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
        paper_numbers=PAPER_NUMBERS,
        runs="results/runs.parquet",
    output:
        report("figures/companion_curves.png", caption="../report/companion_curves.rst", category="Curves"),
        report("figures/companion_curves.pdf", caption="../report/companion_curves.rst", category="Curves"),
        report("figures/companion_bars.png", caption="../report/companion_bars.rst", category="Bars"),
        report("figures/companion_bars.pdf", caption="../report/companion_bars.rst", category="Bars"),
        report(
            "figures/companion_diagnostics.png",
            caption="../report/companion_diagnostics.rst",
            category="Diagnostics",
        ),
        report(
            "figures/companion_diagnostics.pdf",
            caption="../report/companion_diagnostics.rst",
            category="Diagnostics",
        ),
    params:
        base_dir=cells_dir,
        **analysis_params(),
    log:
        "results/logs/figures.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/plot_figures.py"
