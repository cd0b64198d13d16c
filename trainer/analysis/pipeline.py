"""One analysis for every kind of study: the shared steps, and what each kind supplies as data.

`summarize_study` reads the cells' logs, judges every run, makes the summary table, writes it as CSV and Markdown
beside the per-run table, writes the kind's extra files and returns the log's notes; `plot_study` draws each
figure the outputs name once and writes them. Each kind (`study:` main, companion, stability, horizon, arms) is one
`Analysis` record in `ANALYSES`: the metric columns it reads, the folder axis its cells have, and the callables
for what differs (its run table, its summary table, its report, its figures). A new kind is a `StudyKind` in
kinds.py (what the workflow declares), an `Analysis` record here and the code that is new about it; the rules,
the scripts and these steps stay as they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainer.analysis import arms, companion, figures, horizon, stability, summary
from trainer.analysis.cell_logs import RUN_KEYS, check_no_axes, load_metrics, lr_label
from trainer.analysis.collapse import CollapseCriterion
from trainer.analysis.config import EMA_SPAN, WINDOW_FRACTION
from trainer.analysis.kinds import STUDY_KINDS, StudyKind
from trainer.analysis.plotting import outputs_by_figure, save_figures
from trainer.analysis.registration import HYPOTHESIS_COLUMNS, Preregistration, judge_hypotheses
from trainer.atomic import atomic_path
from trainer.knobs import build_config


@dataclass(frozen=True)
class Settings:
    """The study's analysis settings, as the rules pass them (`analysis:` and the models' names and labels)."""

    models: Mapping[str, str]
    """Model name -> the paper's name (a call that gives none gets the kind's stand-ins, `StudyKind.default_models`)."""
    criterion: CollapseCriterion = field(default_factory=CollapseCriterion)
    window_fraction: float = WINDOW_FRACTION
    numbers: str | os.PathLike | None = None
    """The reference numbers the kind compares with (`StudyKind.numbers`)."""
    horizons: Mapping[str, float] | None = None
    """Model name -> its horizon label (the horizon study)."""
    preregistration: Mapping[str, Any] | None = None
    """The study's stated hypotheses (an arms study), as a mapping."""
    ema_span: int = EMA_SPAN
    """The figures' EMA span, where the kind draws one."""
    metrics_paths: tuple[str, ...] = ()
    """The logs in grid order (the arms study orders its arms by it)."""


@dataclass(frozen=True)
class Report:
    """What a kind writes beside its summary table: the Markdown, its own log notes, and its extra files (keyword of
    `StudyKind.extra_outputs` -> a function that writes that file)."""

    markdown: str
    notes: list[str]
    files: Mapping[str, Callable[[Path], None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Analysis:
    """What one kind of study does differently; `summarize_study` and `plot_study` do the rest."""

    columns: tuple[str, ...]
    """Metric columns the summary reads (the folders' keys come with them)."""
    axis: str | None
    """The folder axis its cells have beside model, recipe, optimizer and seed: None, "lr" or "arm"."""
    run_table: Callable[[pd.DataFrame, Settings], pd.DataFrame]
    """Metrics -> one row per run, judged (collapse, window means, gains)."""
    summary_table: Callable[[pd.DataFrame, Settings], pd.DataFrame]
    """Runs -> the summary table (also what `published recompute` calls on a published runs.csv)."""
    report: Callable[[pd.DataFrame, pd.DataFrame, Settings], Report]
    """(runs, summary) -> the Markdown, notes and extra files."""
    figures: Callable[[Sequence[str], str | os.PathLike, str | os.PathLike, Sequence[str], Settings], tuple]
    """(metrics paths, base dir, runs path, figure names asked for, settings) -> (notes, draw), where draw(name)
    returns that figure."""


def settings_for(
    kind: StudyKind,
    collapse: Mapping[str, Any] | None = None,
    models: Mapping[str, str] | None = None,
    window_fraction: float = WINDOW_FRACTION,
    numbers: str | os.PathLike | None = None,
    horizons: Mapping[str, float] | None = None,
    preregistration: Mapping[str, Any] | None = None,
    ema_span: int = EMA_SPAN,
    metrics_paths: Sequence[str | os.PathLike] = (),
) -> Settings:
    """The `Settings` of a kind from the rules' params (left-out models and numbers: the kind's own)."""
    return Settings(
        models=dict(kind.default_models if models is None else models),
        criterion=CollapseCriterion.from_dict(collapse),
        window_fraction=window_fraction,
        numbers=kind.numbers if numbers is None else numbers,
        horizons=None if horizons is None else dict(horizons),
        preregistration=None if not preregistration else dict(preregistration),
        ema_span=ema_span,
        metrics_paths=tuple(str(p) for p in metrics_paths),
    )


def check_axis(metrics: pd.DataFrame, kind: str, axis: str | None) -> None:
    """ValueError where the cells' folders lack the kind's axis or carry another: an analysis keyed without it
    would pool the runs of different learning rates or arms. The arms kind's run table checks its own folders
    (`arms._arm_metrics`, which its figures share)."""
    if axis is None:
        check_no_axes(metrics, kind)
    elif axis == "lr":
        if "lr" not in metrics.columns:
            raise ValueError(f"{kind} analysis: the cells' folders name no lr=...: the grid has no `lrs`")
        if "arm" in metrics.columns:
            raise ValueError(f"{kind} analysis: these cells' folders name arm=...: analyse arms as `study: arms`")


def judge_runs(
    study: str, metrics_paths: Sequence[str | os.PathLike], base_dir: str | os.PathLike, settings: Settings
) -> pd.DataFrame:
    """The kind's run table of these logs: one row per run, judged (what runs.parquet holds)."""
    analysis = ANALYSES[study]
    metrics = load_metrics(metrics_paths, base_dir, analysis.columns)
    check_axis(metrics, study, analysis.axis)
    return analysis.run_table(metrics, settings)


def summarize_study(
    study: str,
    metrics_paths: Sequence[str | os.PathLike],
    base_dir: str | os.PathLike,
    csv: str | os.PathLike,
    md: str | os.PathLike,
    runs_path: str | os.PathLike,
    extra_outputs: Mapping[str, str | os.PathLike] | None = None,
    collapse: Mapping[str, Any] | None = None,
    **options: Any,
) -> list[str]:
    """Read the logs, judge every run, write the summary (CSV and Markdown), the per-run table (Parquet) and the
    kind's extra files (`extra_outputs`: keyword -> path, every one of `StudyKind.extra_outputs`); `collapse`
    and `options` are `settings_for`'s. Returns the log's notes: what was read and found, and the collapse rule's
    false-positive rate where the kind states it."""
    kind, analysis = STUDY_KINDS[study], ANALYSES[study]
    settings = settings_for(kind, collapse, metrics_paths=metrics_paths, **options)
    extra_outputs = dict(extra_outputs or {})
    missing = set(kind.extra_outputs) - set(extra_outputs)
    if missing:
        raise ValueError(f"{study} analysis: no path for its output(s) {sorted(missing)}")
    runs = judge_runs(study, metrics_paths, base_dir, settings)
    table = analysis.summary_table(runs, settings)
    report = analysis.report(runs, table, settings)
    summary.write_tables(table, report.markdown, runs, csv, md, runs_path)
    for name, write in report.files.items():
        write(Path(extra_outputs[name]))
    notes = summary.summary_notes(metrics_paths, runs, table, settings.criterion, report.notes)
    if kind.collapse_note:
        notes.append(summary.write_collapse_note(metrics_paths, base_dir, md, collapse=collapse))
    return notes


def plot_study(
    study: str,
    metrics_paths: Sequence[str | os.PathLike],
    base_dir: str | os.PathLike,
    runs_path: str | os.PathLike,
    outputs: Sequence[str | os.PathLike],
    **options: Any,
) -> list[str]:
    """Read the logs and the per-run table (`summarize_study`'s), draw each figure the `outputs` name (by file
    stem, e.g. figures/fig4.pdf) once and write exactly those files; `options` are `settings_for`'s. An unknown
    stem or format is a ValueError before anything is read. Returns the log's notes (where the kind draws an EMA
    with another span than the collapse rule's, a note saying so first)."""
    kind, analysis = STUDY_KINDS[study], ANALYSES[study]
    settings = settings_for(kind, metrics_paths=metrics_paths, **options)
    by_name = outputs_by_figure(outputs, tuple(kind.figures))
    notes = []
    if kind.ema_span and settings.criterion.ema_span != settings.ema_span:
        notes.append(
            f"note: figures smooth with span {settings.ema_span}, the collapse rule with span "
            f"{settings.criterion.ema_span}"
        )
    more, draw = analysis.figures(metrics_paths, base_dir, runs_path, list(by_name), settings)
    return notes + more + save_figures(by_name, draw)


# -- main: the paper's Figure 2-5 ------------------------------------------------------------------------------
def _main_summary(runs: pd.DataFrame, s: Settings) -> pd.DataFrame:
    return summary.summary_table(runs, summary.load_paper_numbers(s.numbers), s.models)


def _main_report(runs: pd.DataFrame, table: pd.DataFrame, s: Settings) -> Report:
    notes = summary.coverage_notes(runs, s.models)
    return Report(summary.summary_markdown(table, notes, s.window_fraction), notes)


def _main_figures(paths, base_dir, runs_path, names, s: Settings):
    metrics = load_metrics(paths, base_dir, figures.PLOT_COLUMNS)
    check_no_axes(metrics, "main")
    runs = pd.read_parquet(runs_path)
    return figures.main_figures(names, metrics, runs, s.models, s.ema_span, summary.load_paper_numbers(s.numbers))


# -- companion: estimators x optimizers, validation success ---------------------------------------------------
def _companion_summary(runs: pd.DataFrame, s: Settings) -> pd.DataFrame:
    return companion.companion_summary_table(runs, companion.load_companion_numbers(s.numbers), s.models)


def _companion_report(runs: pd.DataFrame, table: pd.DataFrame, s: Settings) -> Report:
    notes = companion.companion_coverage_notes(runs, companion.load_companion_numbers(s.numbers), s.models)
    return Report(companion.companion_markdown(table, notes, s.window_fraction), notes)


def _companion_figures(paths, base_dir, runs_path, names, s: Settings):
    metrics = load_metrics(paths, base_dir, companion.COMPANION_COLUMNS)
    check_no_axes(metrics, "companion")
    runs = pd.read_parquet(runs_path)
    return [], companion.companion_figures(metrics, runs, s.models, companion.load_companion_numbers(s.numbers))


# -- stability: the lr sweep and the selected lrs ----------------------------------------------------------------
def _stability_report(runs: pd.DataFrame, table: pd.DataFrame, s: Settings) -> Report:
    selection, pooled = stability.select_lrs(table), stability.select_pooled_lrs(table)
    notes = stability.evaluation_notes(runs)
    chosen = [
        f"{r.model}/{r.optimizer}: {lr_label(r.selected_lr) if np.isfinite(r.selected_lr) else 'none'}"
        for r in selection.itertuples(index=False)
    ]
    return Report(
        stability.stability_markdown(table, selection, notes, s.window_fraction, pooled),
        ["selected lr: " + "; ".join(chosen), f"one lr per optimizer: {pooled}", *notes],
        {"selected": lambda path: path.write_text(stability.selected_lr_yaml(selection, pooled))},
    )


def _stability_figures(paths, base_dir, runs_path, names, s: Settings):
    runs = summary.read_judged_runs(paths, base_dir, runs_path)
    table = stability.stability_summary_table(runs, models=s.models)
    fig = stability.figure_stability(runs, table, stability.select_lrs(table), s.models)
    return [], lambda name: fig


# -- horizon: one model per task length --------------------------------------------------------------------------
def _horizon_report(runs: pd.DataFrame, table: pd.DataFrame, s: Settings) -> Report:
    notes = horizon.horizon_notes(runs, s.horizons)
    return Report(horizon.horizon_markdown(table, notes, s.window_fraction), notes)


def _horizon_figures(paths, base_dir, runs_path, names, s: Settings):
    runs = summary.read_judged_runs(paths, base_dir, runs_path)
    if not set(RUN_KEYS) <= set(runs.columns) or "horizon" not in runs.columns:
        raise ValueError("the runs table is not the horizon study's (no `horizon` column): rebuild runs.parquet")
    fig = horizon.figure_horizon(horizon.horizon_summary_table(runs, models=s.models), s.models)
    return [], lambda name: fig


# -- arms: the decisive comparisons, what predicts collapse, the stated hypotheses ------------------------------
def _arms_report(runs: pd.DataFrame, table: pd.DataFrame, s: Settings) -> Report:
    predictors = arms.predictor_table(runs)
    markdown = arms.arms_markdown(table, predictors, max(1, s.criterion.warmup), (), s.window_fraction)
    judged = pd.DataFrame(columns=HYPOTHESIS_COLUMNS)
    if s.preregistration:
        registration = build_config(Preregistration, dict(s.preregistration), "preregistration")
        judged = judge_hypotheses(runs, registration)
        markdown += arms.hypotheses_markdown(judged, registration)

    def write_judged(path: Path) -> None:
        with atomic_path(path) as tmp:
            judged.to_csv(tmp, index=False, float_format="%.6g")

    return Report(
        markdown,
        [f"{r.predictor}: AUC {r.auc:.3f}" for r in predictors.itertuples(index=False)],
        {
            "predictors": lambda path: predictors.to_csv(path, index=False, float_format="%.6g"),
            "hypotheses": write_judged,
        },
    )


def _arms_figures(paths, base_dir, runs_path, names, s: Settings):
    runs = summary.read_judged_runs(paths, base_dir, runs_path)
    metrics = load_metrics(paths, base_dir, ("update", "success_rate", "eval_success"))
    draw = {
        "arms_curves": lambda: arms.figure_curves(metrics, runs, s.models, s.ema_span),
        "arms_predictors": lambda: arms.figure_predictors(runs, arms.predictor_table(runs)),
    }
    return [], lambda name: draw[name]()


ANALYSES: dict[str, Analysis] = {
    "main": Analysis(
        summary.SUMMARY_COLUMNS,
        None,
        lambda metrics, s: summary.run_table(metrics, s.criterion, s.window_fraction, s.models),
        _main_summary,
        _main_report,
        _main_figures,
    ),
    "companion": Analysis(
        companion.COMPANION_COLUMNS,
        None,
        lambda metrics, s: companion.companion_run_table(metrics, s.criterion, s.window_fraction, s.models),
        _companion_summary,
        _companion_report,
        _companion_figures,
    ),
    "stability": Analysis(
        stability.STABILITY_COLUMNS,
        "lr",
        lambda metrics, s: stability.sweep_run_table(metrics, s.criterion, s.window_fraction, s.models),
        lambda runs, s: stability.stability_summary_table(runs, models=s.models),
        _stability_report,
        _stability_figures,
    ),
    "horizon": Analysis(
        stability.STABILITY_COLUMNS,
        None,
        lambda metrics, s: horizon.horizon_run_table(metrics, s.horizons, s.criterion, s.window_fraction, s.models),
        lambda runs, s: horizon.horizon_summary_table(runs, models=s.models),
        _horizon_report,
        _horizon_figures,
    ),
    "arms": Analysis(
        arms.ARMS_COLUMNS,
        "arm",
        lambda metrics, s: arms.arms_run_table(
            metrics, s.criterion, s.window_fraction, s.models, arms.arm_order(s.metrics_paths)
        ),
        lambda runs, s: arms.arms_summary_table(runs, models=s.models),
        _arms_report,
        _arms_figures,
    ),
}
"""Every kind's analysis, by the name a study's `study:` gives (the same names as kinds.STUDY_KINDS)."""
