"""From the cells' Parquet logs to the papers' figures and a table beside the paper's numbers.

logs.py      read many cells' metrics.parquet (pyarrow.dataset over an explicit list, Hive keys as columns)
collapse.py  the EMA and a documented, configurable collapse rule applied to every run
summary.py   per-run window means and verdicts; model x recipe x optimizer table with bootstrap intervals
figures.py   Figures 2-5 and the optimizer diagnostics, as PNG and reproducible PDF
synthetic.py logs with known shapes for tests, the benchmark and looking at the figures
companion.py the companion study: validation metrics per run, estimator x optimizer table, its three figures
stability.py the lr sweep: per-lr success, held-out AUC and collapses, the selected lr per model and optimizer
horizon.py   one model per task length: final success, learning and collapses against the horizon

The workflow's scripts (workflow/scripts/summarize.py, plot_figures.py) only unpack `snakemake.*` and call, by
the study's kind, `summarize` / `plot` below, `summarize_companion` / `plot_companion`, `summarize_stability` /
`plot_stability` or `summarize_horizon` / `plot_horizon`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from trainer.analysis.collapse import CollapseCriterion, CollapseVerdict, detect_collapse, ema, first_sustained
from trainer.analysis.companion import (companion_run_table, companion_summary_table, plot_companion,
                                        summarize_companion)
from trainer.analysis.figures import DIAGNOSTICS, FIGURES, add_ema, draw_figure, save_figure, write_figures
from trainer.analysis.horizon import plot_horizon, summarize_horizon
from trainer.analysis.logs import (DEFAULT_MODELS, NONFINITE_COLUMNS, RUN_KEYS, check_no_lr_axis, load_metrics,
                                   paper_model)
from trainer.analysis.stability import plot_stability, summarize_stability
from trainer.analysis.summary import (bootstrap_interval, coverage_notes, load_paper_numbers, run_table,
                                      summary_markdown, summary_table, window_size, write_tables)

SUMMARY_COLUMNS = ("update", "success_rate", "eval_success", "entropy", "baseline_informed_frac", "cheat_rate",
                   *NONFINITE_COLUMNS)
"""The metrics `summarize` reads (window means, held-out success, every collapse rule)."""
PLOT_COLUMNS = ("update", "success_rate", *(column for column, _, _ in DIAGNOSTICS))
"""The metrics `plot` reads (success curves and the diagnostics panels)."""

__all__ = ["DEFAULT_MODELS", "FIGURES", "RUN_KEYS", "CollapseCriterion", "CollapseVerdict", "add_ema",
           "bootstrap_interval", "companion_run_table", "companion_summary_table", "coverage_notes",
           "detect_collapse", "draw_figure", "ema", "first_sustained", "load_metrics", "load_paper_numbers",
           "paper_model", "plot", "plot_companion", "plot_horizon", "plot_stability", "run_table", "save_figure",
           "summarize", "summarize_companion", "summarize_horizon", "summarize_stability", "summary_markdown",
           "summary_table", "window_size", "write_figures"]


def summarize(metrics_paths: Sequence[str | os.PathLike], base_dir: str | os.PathLike, csv: str | os.PathLike,
              md: str | os.PathLike, runs_path: str | os.PathLike, collapse: Mapping[str, Any] | None = None,
              models: Mapping[str, str] | None = None, window_fraction: float = 0.1,
              bootstrap_seed: int = 0) -> list[str]:
    """Read the logs, judge every run, write the summary CSV and Markdown and the per-run Parquet table.

    Returns notes for the log (counts, collapsed runs, what the grid lacks)."""
    models = dict(DEFAULT_MODELS if models is None else models)
    criterion = CollapseCriterion.from_dict(collapse)
    metrics = load_metrics(metrics_paths, base_dir, SUMMARY_COLUMNS)
    check_no_lr_axis(metrics, "main")
    runs = run_table(metrics, criterion, window_fraction, models)
    summary = summary_table(runs, load_paper_numbers(), bootstrap_seed, models)
    notes = coverage_notes(runs, models)
    write_tables(summary, summary_markdown(summary, notes, window_fraction), runs, csv, md, runs_path)
    return [f"{len(metrics_paths)} metrics files, {len(runs)} runs, {len(summary)} cells",
            f"collapse criterion: {criterion}",
            f"{int(runs['collapsed'].sum())} collapsed run(s)", *notes]


def plot(metrics_paths: Sequence[str | os.PathLike], base_dir: str | os.PathLike, runs_path: str | os.PathLike,
         outputs: Sequence[str | os.PathLike], models: Mapping[str, str] | None = None, ema_span: int = 5,
         bootstrap_seed: int = 0) -> list[str]:
    """Read the logs and the per-run table (`summarize`'s), draw and write exactly `outputs`; returns log notes."""
    models = dict(DEFAULT_MODELS if models is None else models)
    metrics = load_metrics(metrics_paths, base_dir, PLOT_COLUMNS)
    check_no_lr_axis(metrics, "main")
    runs = pd.read_parquet(runs_path)
    return write_figures(outputs, metrics, runs, models, ema_span, bootstrap_seed)
