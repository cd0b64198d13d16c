# From the cells' Parquet logs to the summary table and the papers' figures (scripts by trainer/analysis).


rule summarize:
    input:
        metrics=metrics_files(),
        paper_numbers=PAPER_NUMBERS,
    output:
        csv=report("results/summary.csv", caption="../report/summary.rst", category="Summary"),
        md=report("results/summary.md", caption="../report/summary.rst", category="Summary"),
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
        report("figures/fig2.png", caption="../report/fig2.rst", category="Figure 2"),
        report("figures/fig2.pdf", caption="../report/fig2.rst", category="Figure 2"),
        report("figures/fig3.png", caption="../report/fig3.rst", category="Figure 3"),
        report("figures/fig3.pdf", caption="../report/fig3.rst", category="Figure 3"),
        report("figures/fig4.png", caption="../report/fig4.rst", category="Figure 4"),
        report("figures/fig4.pdf", caption="../report/fig4.rst", category="Figure 4"),
        report("figures/fig5.png", caption="../report/fig5.rst", category="Figure 5"),
        report("figures/fig5.pdf", caption="../report/fig5.rst", category="Figure 5"),
        report("figures/diagnostics.png", caption="../report/diagnostics.rst", category="Diagnostics"),
        report("figures/diagnostics.pdf", caption="../report/diagnostics.rst", category="Diagnostics"),
    params:
        base_dir=cells_dir,
        ema_span=config["analysis"]["ema_span"],
        **analysis_params(),
    log:
        "results/logs/figures.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/plot_figures.py"
