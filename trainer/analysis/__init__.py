"""From the cells' Parquet logs to the papers' figures and a table beside the papers' numbers.

kinds.py     one record per kind of study (main, companion, stability, horizon, arms): its functions and files
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

The names below are imported from their modules on first use, so that `trainer.analysis.kinds` (read while the
workflow builds its DAG) and the light modules import without matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kinds": ("DEFAULT_MODELS", "STUDY_KINDS", "StudyKind"),
    "cell_logs": ("NONFINITE_COLUMNS", "RUN_KEYS", "check_no_axes", "load_metrics", "paper_model"),
    "collapse": ("CollapseCriterion", "CollapseVerdict", "detect_collapse", "ema", "first_sustained"),
    "statistics": ("t_interval",),
    "summary": (
        "SUMMARY_COLUMNS",
        "coverage_notes",
        "load_paper_numbers",
        "run_table",
        "summarize",
        "summary_markdown",
        "summary_table",
        "window_size",
        "write_tables",
    ),
    "plotting": ("FORMATS", "save_figure"),
    "figures": ("DIAGNOSTICS", "FIGURES", "PLOT_COLUMNS", "add_ema", "draw_figure", "plot", "write_figures"),
    "companion": ("companion_run_table", "companion_summary_table", "plot_companion", "summarize_companion"),
    "stability": ("plot_stability", "stability_summary_table", "summarize_stability"),
    "horizon": ("horizon_summary_table", "plot_horizon", "summarize_horizon"),
    "arms": ("arms_run_table", "arms_summary_table", "plot_arms", "predictor_table", "summarize_arms"),
}
_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE)


def __getattr__(name: str) -> Any:
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE})
