"""From the cells' Parquet logs to the papers' figures and a table beside the papers' numbers.

kinds.py     one record per kind of study (main, companion, stability, horizon, arms): the files its rules declare
pipeline.py  the one analysis: shared steps (read, judge, summary table, Markdown, files, figures), and per kind
             an `Analysis` record of what differs
config.py    a study's `analysis:` section (window, EMA span, collapse rule), defined once
cell_logs.py read many cells' metrics.parquet (pyarrow.dataset over an explicit list, Hive keys as columns)
collapse.py  the EMA, a documented, configurable collapse rule applied to every run, and the degradation verdict
statistics.py Student-t intervals and tests that hold at 2-5 seeds, Holm's correction, the minimum detectable effect
registration.py a study's preregistration (its hypotheses, stated before it runs) and their judging
step_match.py the AdamW lr whose hidden update RMS equals a Muon arm's, measured
summary.py   per-run window means and verdicts; model x recipe x optimizer table with t intervals over seeds
plotting.py  the house style and the drawing and file helpers every figure shares
figures.py   Figures 2-5 and the optimizer diagnostics, as PNG and reproducible PDF
companion.py the companion study: validation metrics per run, estimator x optimizer table, its three figures
stability.py the lr sweep: per-lr success, held-out AUC and collapses, the selected lr per model and optimizer
horizon.py   one model per task length: final success, learning and collapses against the horizon
arms.py      the decisive comparisons: per arm success, collapses and step sizes by role; what predicts collapse;
             the judged preregistration
synthetic.py logs with known shapes for tests, the benchmark and looking at the figures

(Published studies as data and the contrast pooled over them sit above the study, in trainer/published.py and
trainer/meta.py.)

Import a name from the module that defines it: `trainer.analysis.kinds` (read while the workflow builds its DAG)
and the light modules import without matplotlib.
"""
