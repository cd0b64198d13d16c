"""The companion study ("When Does Muon Help Agentic Reinforcement Learning?", Ruan et al.): validation metrics
per run, an estimator x optimizer table beside the companion's numbers, and three figures.

The companion grid uses the main study's Hive layout. Its `recipe` key is the advantage estimator (grpo, gigpo,
graphgpo) and its `optimizer` is adam (AdamW), muon (Muon on hidden matrices, AdamW on the rest) or
adam_high_lr (AdamW on every parameter at Muon's learning rate). adam_high_lr is the control that separates a
better optimizer from a bigger step. The companion's headline numbers are about *validation* success on
held-out games, not training success, so they get their own definitions here. Everything else reuses the
main study's code: `load_metrics`, and `run_table` for the final window, the training-success mean and the
collapse verdict. Intervals come from `seed_stats` (Student's t); the figures use the house style and `save_figure`.

Definitions, all for one run. Updates are the logged 0-based `update` values.

* **Validation curve**: the run's (update, eval_success) rows that have an evaluation (eval_success not NaN),
  in update order.
* **Final-window validation success**: the mean eval_success of the evaluations that fall in the run's final
  window. The window is the main study's (`summary.window_size`): the last max(1, ceil(n * window_fraction))
  logged updates, i.e. updates 90..99 of 100 at 0.1. With evaluations every 10 or 20 updates, the window
  often holds only the final evaluation, which the trainer always runs. If the window holds no evaluation (a
  run that stopped between two), the last evaluation stands in. A run that was never evaluated gets NaN.
* **Normalised validation AUC**: the trapezoidal area under the validation curve divided by its update span
  (last evaluated update minus first). This is the curve's time average: it lies in [0, 1], equals the level
  of a flat curve, and can be compared across runs of different lengths. It rewards learning early and
  penalises collapsing late, which the final window alone cannot show. One evaluation gives its own value;
  none gives NaN.

Choices and why:

* **grad_snr is summarised by its median** over the updates where it was measured (a cell: the mean of its
  runs' medians). The trainer's estimate (trainer/update.py `gradient_snr`) is unbiased, so it is near 0 and
  often negative when the per-episode gradients agree no more than noise, and it swings by orders of magnitude
  from update to update: a mean would be decided by a few updates, a geometric mean is undefined. NaN (not
  measured) and +-inf are left out. A log without the column reads as all-NaN.
  update_rms and update_spectral_norm use arithmetic means over the run's finite values: they vary little,
  and this is the main study's convention.
* **Percent**, as in the main summary. The summary table is in percent, AUC included (it is a time-averaged
  success). The companion's fractions are multiplied by 100, and the differences (ours - theirs) are in
  percentage points. The per-run table keeps the trainer's fractions.
* **The companion's numbers** ship with the package as `companion_numbers.csv`, every row the companion
  reports; the workflow passes the file as the rules' declared input. Two of its metrics are compared:
  "final-window validation success" and "normalized validation AUC". Its optimizer names adamw /
  adamw_high_lr are our adam / adam_high_lr. Numbers are matched on the paper model name (`models` maps our
  tiny stand-in to it), the estimator and the optimizer. The companion ran ALFWorld with
  Qwen2.5-0.5B-Instruct; a tiny stand-in on the text game will differ from it, so a difference measures how far
  the result transfers, not an error.
* **Intervals** are the main summary's Student-t interval over a cell's evaluated seeds (`seed_stats`). The
  bar figure draws the summary table's own numbers, so the figure and the table cannot disagree.
* **Figures**. `companion_curves` has one panel per estimator (one row per model family): for each optimizer,
  every seed's validation curve is drawn thin and the mean over the seeds evaluated at each update is drawn
  bold, with a red X on a collapsed run's curve at its collapse update. `companion_bars` shows final-window
  success and AUC, grouped by estimator and optimizer: mean bar, 95% interval, a dot per seed (red if it
  collapsed), and the companion's value as a hollow diamond beside our bar. A hollow diamond shows a reported
  0.0, which a hatched bar could not. `companion_diagnostics` has rows grad_snr, update RMS, update spectral
  norm and grad norm, and one column per estimator: the median over seeds per update, with the seed range
  (min..max) shaded. A row is on a log scale when all its values are positive (grad_snr otherwise on a
  symmetric log scale, linear within +-0.01), and a panel with no finite value says "not measured". Colours
  and line styles per optimizer: `plotting`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from trainer.analysis.cell_logs import RUN_KEYS
from trainer.analysis.collapse import CollapseCriterion
from trainer.analysis.figures import DIAGNOSTICS
from trainer.analysis.kinds import COMPANION, COMPANION_MODELS, COMPANION_NUMBERS
from trainer.analysis.plotting import (
    COLLAPSE_HANDLE,
    COLLAPSED_SEED_HANDLE,
    LINE_STYLES,
    MUTED,
    OPTIMIZER_COLORS,
    OPTIMIZER_LABELS,
    OPTIMIZER_STYLES,
    SEED_HANDLE,
    STYLE,
    curve_axes,
    empty,
    error_bars,
    family_handles,
    family_title,
    grid,
    label_outer,
    legend,
    lines,
    log_y,
    mark_collapses,
    median_band,
    seed_dots,
    suptitle,
)
from trainer.analysis.summary import (
    CELL_KEYS,
    WINDOW_FRACTION,
    check_same_runs,
    ci_text,
    collapsed_text,
    markdown_head,
    ordered,
    pct,
    read_numbers,
    run_bounds,
    run_table,
    seed_stats,
    sort_rows,
    table_head,
    table_row,
    window_size,
)

ESTIMATORS: tuple[str, ...] = ("grpo", "gigpo", "graphgpo")
"""The companion's advantage estimators (the `recipe` key), in its order."""
ESTIMATOR_LABELS = {"grpo": "GRPO", "gigpo": "GiGPO", "graphgpo": "GraphGPO"}
OPTIMIZERS: tuple[str, ...] = ("adam", "muon", "adam_high_lr")

NUMBER_OPTIMIZERS = {"adamw": "adam", "muon": "muon", "adamw_high_lr": "adam_high_lr"}
NUMBER_METRICS = {"final-window validation success": "final", "normalized validation AUC": "auc"}
"""The companion's metric names -> the summary's column prefixes; its other metrics are not compared."""

COMPANION_COLUMNS: tuple[str, ...] = (
    "update",
    "success_rate",
    "n_trajectories",
    "eval_success",
    "entropy",
    "loss",
    "grad_norm",
    "update_rms",
    "update_spectral_norm",
    "grad_snr",
)
"""The metrics the companion reads (entropy, loss and grad_norm also feed the collapse rules)."""
REQUIRED_COLUMNS: tuple[str, ...] = ("update", "success_rate", "eval_success", "update_rms", "update_spectral_norm")

_TITLES = {column: title for column, title, _ in DIAGNOSTICS}
DIAGNOSTIC_ROWS: tuple[tuple[str, str], ...] = (
    ("grad_snr", "Gradient SNR"),
    *((c, _TITLES[c]) for c in ("update_rms", "update_spectral_norm", "grad_norm")),
)
"""(column, title) of the diagnostics figure's rows; titles shared with the main diagnostics figure."""

COMPANION_FIGURES: tuple[str, ...] = tuple(COMPANION.figures)
BAR_PANELS: tuple[tuple[str, str], ...] = (
    ("final", "Final-window validation success (%)"),
    ("auc", "Normalised validation AUC (%)"),
)


# -- reading and checking ----------------------------------------------------------------------------------
def with_grad_snr(metrics: pd.DataFrame) -> pd.DataFrame:
    """`metrics` with an all-NaN `grad_snr` column when it has none. `load_metrics` already reads a log without
    the column as null; this covers a table built another way."""
    return metrics if "grad_snr" in metrics.columns else metrics.assign(grad_snr=np.nan)


def check_companion(frame: pd.DataFrame, required: Sequence[str] = REQUIRED_COLUMNS) -> None:
    """ValueError naming a missing column, an unknown estimator or an unknown optimizer."""
    missing = [c for c in (*RUN_KEYS, *required) if c not in frame.columns]
    if missing:
        raise ValueError(f"companion analysis: the metrics table lacks column(s) {missing}")
    if len(frame) == 0:
        raise ValueError("companion analysis: the metrics table is empty")
    for key, what, known in (("recipe", "estimator", ESTIMATORS), ("optimizer", "optimizer", OPTIMIZERS)):
        unknown = sorted(set(frame[key]) - set(known))
        if unknown:
            raise ValueError(
                f"companion analysis: unknown {what}(s) {unknown} in the {key!r} key; known: {list(known)}"
            )


def sort_companion(
    frame: pd.DataFrame, models: Mapping[str, str] | None = None, extra: Sequence[str] = ()
) -> pd.DataFrame:
    """Rows in reading order: models as in `models`, then the estimator order, the optimizer order and `extra`."""
    return sort_rows(
        frame,
        {"model": ordered(frame["model"], list(models or {})), "recipe": ESTIMATORS, "optimizer": OPTIMIZERS},
        extra,
    )


# -- definitions -------------------------------------------------------------------------------------------
def validation_curve(run: pd.DataFrame) -> pd.DataFrame:
    """One run's (update, eval_success) rows that have an evaluation, in update order."""
    curve = run.loc[run["eval_success"].notna(), ["update", "eval_success"]]
    return curve.sort_values("update", kind="stable", ignore_index=True)


def final_window_success(run: pd.DataFrame, window_fraction: float = WINDOW_FRACTION) -> float:
    """Mean validation success of the evaluations in the run's final window; the last evaluation if the window
    holds none; NaN if the run was never evaluated."""
    updates = np.sort(run["update"].to_numpy())
    first = updates[len(updates) - window_size(len(updates), window_fraction)]
    curve = validation_curve(run)
    if curve.empty:
        return math.nan
    inside = curve.loc[curve["update"] >= first, "eval_success"]
    return float(inside.mean()) if len(inside) else float(curve["eval_success"].iloc[-1])


def validation_auc(run: pd.DataFrame) -> float:
    """Trapezoidal area under the validation curve over its update span (one evaluation: its value; none: NaN)."""
    curve = validation_curve(run)
    x, y = curve["update"].to_numpy(dtype=float), curve["eval_success"].to_numpy(dtype=float)
    if len(x) < 2:
        return float(y[0]) if len(y) else math.nan
    return float(np.trapezoid(y, x) / (x[-1] - x[0]))


def finite_median(values: Sequence[float] | np.ndarray) -> float:
    """Median of the finite values (NaN, not measured, and +-inf left out); NaN if none."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else math.nan


def finite_mean(values: Sequence[float] | np.ndarray) -> float:
    """Mean of the finite values (a diverged run's inf left out); NaN if none."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else math.nan


# -- tables ------------------------------------------------------------------------------------------------
def companion_run_table(
    metrics: pd.DataFrame,
    criterion: CollapseCriterion | None = None,
    window_fraction: float = WINDOW_FRACTION,
    models: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per run (fractions), as below.

    The columns are the run keys, `paper_model`, `n_updates`, `window_first` and `window_last`,
    `train_success_window` (mean training success over the window), `collapsed`, `collapse_update` and
    `collapse_reason` (all from `run_table`, with the same window and collapse rule as the main study), and
    `final_window_success`, `n_window_evals`, `n_evals`, `val_auc`, `grad_snr_median`, `update_rms_mean` and
    `update_spectral_norm_mean`.
    """
    models = COMPANION_MODELS if models is None else models
    check_companion(metrics)
    frame = with_grad_snr(metrics).sort_values([*RUN_KEYS, "update"], kind="stable", ignore_index=True)
    runs = run_table(frame, criterion, window_fraction, models)
    rows = []
    for key, a, b in run_bounds(frame):
        run = frame.iloc[a:b]
        window_first = int(run["update"].iloc[len(run) - window_size(len(run), window_fraction)])
        evaluated = run["eval_success"].notna()
        rows.append(
            {
                **dict(zip(RUN_KEYS, key)),
                "final_window_success": final_window_success(run, window_fraction),
                "n_window_evals": int((evaluated & (run["update"] >= window_first)).sum()),
                "n_evals": int(evaluated.sum()),
                "val_auc": validation_auc(run),
                "grad_snr_median": finite_median(run["grad_snr"]),
                "update_rms_mean": finite_mean(run["update_rms"]),
                "update_spectral_norm_mean": finite_mean(run["update_spectral_norm"]),
            }
        )
    runs = runs.drop(columns=["eval_success", "eval_update"]).rename(columns={"window_success": "train_success_window"})
    return sort_companion(runs.merge(pd.DataFrame(rows), on=list(RUN_KEYS), how="left"), models, extra=("seed",))


def load_companion_numbers(path: str | os.PathLike = COMPANION_NUMBERS) -> pd.DataFrame:
    """The companion's compared numbers in our names: model (paper name), recipe, optimizer, metric ("final" or
    "auc"), value (fraction), source_note. The file's other metrics are left out here."""
    table = read_numbers(
        path, ["model", "advantage", "optimizer", "metric", "value", "source_note"], "companion numbers"
    )
    table = table[table["metric"].isin(list(NUMBER_METRICS))]
    unknown = sorted(set(table["optimizer"]) - set(NUMBER_OPTIMIZERS))
    if unknown:
        raise ValueError(f"{path}: unknown optimizer name(s) {unknown}; known: {list(NUMBER_OPTIMIZERS)}")
    numbers = pd.DataFrame(
        {
            "model": table["model"],
            "recipe": table["advantage"],
            "optimizer": table["optimizer"].map(NUMBER_OPTIMIZERS),
            "metric": table["metric"].map(NUMBER_METRICS),
            "value": table["value"].astype(float),
            "source_note": table["source_note"],
        }
    ).reset_index(drop=True)
    if numbers.duplicated(["model", "recipe", "optimizer", "metric"]).any():
        raise ValueError(f"{path}: more than one number for a (model, estimator, optimizer, metric)")
    return numbers


def companion_summary_table(
    runs: pd.DataFrame,
    numbers: pd.DataFrame | None = None,
    models: Mapping[str, str] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per model x estimator x optimizer (percent): for final-window success (`final_`) and AUC (`auc_`)
    the mean over evaluated seeds, its t interval, the companion's number and our difference; plus
    seeds, collapses, training success over the window and the cell's mean of the runs' grad_snr medians."""
    numbers = load_companion_numbers() if numbers is None else numbers
    theirs = numbers.set_index(["model", "recipe", "optimizer", "metric"])
    rows = []
    for (model, recipe, optimizer), cell in runs.groupby(list(CELL_KEYS), sort=False):
        cell = cell.sort_values("seed")
        name = cell["paper_model"].iloc[0]
        row: dict[str, Any] = {
            "model": model,
            "paper_model": name,
            "recipe": recipe,
            "optimizer": optimizer,
            "n_seeds": len(cell),
            "seeds": ",".join(str(s) for s in cell["seed"]),
            "n_evaluated": int(cell["final_window_success"].notna().sum()),
        }
        sources = []
        for metric, column in (("final", "final_window_success"), ("auc", "val_auc")):
            ours, low, high = seed_stats(cell, column, level)
            key = (name, recipe, optimizer, metric)
            companion = 100 * float(theirs.loc[key, "value"]) if key in theirs.index else math.nan
            if key in theirs.index:
                sources.append(f"{metric}: {theirs.loc[key, 'source_note']}")
            row.update(
                {
                    f"{metric}_pct_mean": ours,
                    f"{metric}_pct_ci_low": low,
                    f"{metric}_pct_ci_high": high,
                    f"companion_{metric}_pct": companion,
                    f"{metric}_diff_pp": ours - companion,
                }
            )
        row.update(
            {
                "train_pct_mean": 100 * float(cell["train_success_window"].mean()),
                "n_collapsed": int(cell["collapsed"].sum()),
                "collapsed_seeds": ",".join(str(s) for s in cell.loc[cell["collapsed"].astype(bool), "seed"]),
                "n_degraded": int(cell["degraded"].sum()) if "degraded" in cell else 0,
                "grad_snr_median": finite_mean(cell["grad_snr_median"]),
                "companion_source": "; ".join(sources),
            }
        )
        rows.append(row)
    return sort_companion(pd.DataFrame(rows), models)


def companion_coverage_notes(
    runs: pd.DataFrame, numbers: pd.DataFrame | None = None, models: Mapping[str, str] | None = None
) -> list[str]:
    """What the logs lack: models, estimators, optimizers, evaluations, grad_snr, cells the companion reports."""
    numbers = load_companion_numbers() if numbers is None else numbers
    notes = []
    for key, what, expected in (
        ("model", "model(s)", list(models or {})),
        ("recipe", "estimator(s)", ESTIMATORS),
        ("optimizer", "optimizer(s)", OPTIMIZERS),
    ):
        absent = [v for v in expected if v not in set(runs[key])]
        if absent:
            notes.append(f"no runs of {what} {', '.join(absent)} in these logs")
    label = [f"{r.model}/{r.recipe}/{r.optimizer}/seed={r.seed}" for r in runs.itertuples(index=False)]
    never = [name for name, n in zip(label, runs["n_evals"]) if n == 0]
    if never:
        notes.append(f"{len(never)} run(s) never evaluated (no validation metrics): {', '.join(never)}")
    stand_in = [name for name, n, total in zip(label, runs["n_window_evals"], runs["n_evals"]) if n == 0 < total]
    if stand_in:
        notes.append(
            f"{len(stand_in)} run(s) with no evaluation in the final window (their last evaluation "
            f"stands in): {', '.join(stand_in)}"
        )
    measured = int(runs["grad_snr_median"].notna().sum())
    if measured < len(runs):
        notes.append(f"grad_snr not measured in {len(runs) - measured} of {len(runs)} run(s)")
    cells = set(zip(runs["paper_model"], runs["recipe"], runs["optimizer"]))
    unmatched = sorted(
        {
            (m, r, o)
            for m, r, o in zip(numbers["model"], numbers["recipe"], numbers["optimizer"])
            if (m, r, o) not in cells
        }
    )
    if unmatched:
        notes.append(
            "companion numbers with no run here: "
            + ", ".join("/".join(c) for c in unmatched)
            + " (matched on the paper model name through `models`)"
        )
    return notes


def companion_markdown(
    summary: pd.DataFrame, notes: Sequence[str] = (), window_fraction: float = WINDOW_FRACTION
) -> str:
    """The companion summary as a Markdown page: method, coverage notes, one table row per cell."""
    method = (
        f"Final = mean validation success (`eval_success`) over the evaluations in the last "
        f"{window_fraction:.0%} of each run's updates (the last evaluation if none falls there); AUC = "
        "trapezoidal area under the validation curve divided by its update span (the time-averaged "
        "validation success). Both in percent, averaged over evaluated seeds; interval = 95% Student-t "
        'over seeds (n/a with one seed). Companion = Ruan et al., "When Does Muon Help Agentic '
        'RL?" (ALFWorld, Qwen2.5-0.5B-Instruct); diff = ours - companion, in percentage points (– where it '
        "reports none). Train = training success over the same window. SNR = median of `grad_snr` over "
        "updates (mean over seeds). Collapse = the rule in `trainer/analysis/collapse.py`, on training "
        "success."
    )
    lines = markdown_head(
        "Validation success, ours beside Ruan et al. (When Does Muon Help Agentic RL?)", method, notes
    )
    lines += table_head(
        [
            "model",
            "paper model",
            "estimator",
            "optimizer",
            "seeds",
            "final %",
            "95% CI",
            "companion %",
            "diff (pp)",
            "AUC %",
            "95% CI",
            "companion %",
            "diff (pp)",
            "train %",
            "collapsed",
            "SNR",
        ]
    )
    for row in summary.itertuples(index=False):
        lines.append(
            table_row(
                [
                    row.model,
                    row.paper_model,
                    ESTIMATOR_LABELS[row.recipe],
                    OPTIMIZER_LABELS[row.optimizer],
                    str(row.n_seeds),
                    pct(row.final_pct_mean),
                    ci_text(row.final_pct_ci_low, row.final_pct_ci_high),
                    pct(row.companion_final_pct),
                    pct(row.final_diff_pp),
                    pct(row.auc_pct_mean),
                    ci_text(row.auc_pct_ci_low, row.auc_pct_ci_high),
                    pct(row.companion_auc_pct),
                    pct(row.auc_diff_pp),
                    pct(row.train_pct_mean),
                    collapsed_text(row),
                    "–" if not np.isfinite(row.grad_snr_median) else f"{row.grad_snr_median:.3g}",
                ]
            )
        )
    return "\n".join(lines) + "\n"


# -- figures -----------------------------------------------------------------------------------------------
def _layout(runs: pd.DataFrame, models: Mapping[str, str] | None) -> tuple[list[str], list[str], list[str]]:
    """The model families, estimators and optimizers present, in reading order."""
    return (
        ordered(runs["model"], list(models or {})),
        [e for e in ESTIMATORS if e in set(runs["recipe"])],
        [o for o in OPTIMIZERS if o in set(runs["optimizer"])],
    )


def figure_companion_curves(
    metrics: pd.DataFrame, runs: pd.DataFrame, models: Mapping[str, str] | None = None
) -> Figure:
    """Validation success over updates, one panel per estimator (a row per model family): seeds thin, mean bold,
    collapse points red."""
    evaluated = metrics[metrics["eval_success"].notna()].sort_values([*RUN_KEYS, "update"], kind="stable")
    if evaluated.empty:
        return empty("companion curves: no run in these logs was evaluated (no eval_success)")
    model_list, estimators, optimizers = _layout(runs, models)
    curves = {
        key: np.column_stack(
            [evaluated["update"].to_numpy(dtype=float)[a:b], 100 * evaluated["eval_success"].to_numpy(dtype=float)[a:b]]
        )
        for key, a, b in run_bounds(evaluated.reset_index(drop=True))
    }
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(
            len(model_list), len(estimators), (3.3, 2.5), (0.75, 0.15, 0.7, 1.0), (0.25, 0.55), sharex=True, sharey=True
        )
        marked = False
        for i, model in enumerate(model_list):
            for j, estimator in enumerate(estimators):
                ax = axes[i * len(estimators) + j]
                ax.set_title(
                    ESTIMATOR_LABELS[estimator] + (f" · {family_title(model, models)}" if len(model_list) > 1 else ""),
                    fontsize=10,
                )
                for optimizer in optimizers:
                    mine = {k: c for k, c in curves.items() if k[:3] == (model, estimator, optimizer)}
                    if not mine:
                        continue
                    color, style = OPTIMIZER_COLORS[optimizer], OPTIMIZER_STYLES[optimizer]
                    lines(ax, list(mine.values()), 1, colors=color, linewidths=0.8, alpha=0.3, linestyles=style)
                    stacked = np.concatenate(list(mine.values()))
                    mean = pd.Series(stacked[:, 1]).groupby(stacked[:, 0]).mean()
                    ax.plot(mean.index, mean.to_numpy(), color=color, ls=style, lw=2.0, alpha=0.95)
                    hits = runs[
                        (runs["model"] == model)
                        & (runs["recipe"] == estimator)
                        & (runs["optimizer"] == optimizer)
                        & runs["collapsed"].astype(bool)
                    ]
                    at = [
                        (int(u), float(np.interp(u, mine[k][:, 0], mine[k][:, 1])))
                        for k, u in zip(
                            hits[list(RUN_KEYS)].itertuples(index=False, name=None), hits["collapse_update"]
                        )
                        if k in mine
                    ]
                    # mark_collapses draws at (update, ema_pct); here the height is the validation curve's.
                    marked |= mark_collapses(ax, pd.DataFrame(at, columns=["update", "ema_pct"])) > 0
                curve_axes(ax, float(metrics["update"].max()))
        for ax in axes[:: len(estimators)]:
            ax.set_ylabel("Validation success (%)")
        label_outer(axes, len(estimators))
        suptitle(
            fig,
            "Validation success over updates"
            + (f": {family_title(model_list[0], models)}" if len(model_list) == 1 else ""),
        )
        handles = [
            Line2D([], [], color=OPTIMIZER_COLORS[o], ls=OPTIMIZER_STYLES[o], lw=2, label=OPTIMIZER_LABELS[o])
            for o in optimizers
        ]
        handles += [
            Line2D([], [], color=MUTED, lw=0.8, alpha=0.4, label="one seed"),
            Line2D([], [], color=MUTED, lw=2, label="mean over seeds"),
        ]
        legend(fig, handles + ([COLLAPSE_HANDLE] if marked else []))
    return fig


COMPANION_HANDLE = Line2D(
    [],
    [],
    marker="D",
    ls="",
    markerfacecolor="white",
    markeredgecolor="black",
    markersize=6,
    label="Ruan et al. (companion)",
)


def figure_companion_bars(runs: pd.DataFrame, summary: pd.DataFrame, models: Mapping[str, str] | None = None) -> Figure:
    """Final-window validation success and AUC, estimator x optimizer: the summary's mean and interval as a bar,
    each seed a dot, the companion's number a hollow diamond beside the bar. A row of two panels per family."""
    model_list, estimators, optimizers = _layout(runs, models)
    slot = 0.8 / len(optimizers)
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(len(model_list), 2, (4.4, 2.8), (0.75, 0.15, 0.7, 1.0), (0.6, 0.75), sharey=True)
        x0 = np.arange(len(estimators), dtype=float)
        collapsed_seen = False
        for i, model in enumerate(model_list):
            for ax, (metric, title) in zip(axes[2 * i : 2 * i + 2], BAR_PANELS):
                column = {"final": "final_window_success", "auc": "val_auc"}[metric]
                for j, optimizer in enumerate(optimizers):
                    center = x0 + (j - (len(optimizers) - 1) / 2) * slot - 0.12 * slot
                    cells = summary[(summary["model"] == model) & (summary["optimizer"] == optimizer)]
                    cells = cells.set_index("recipe").reindex(estimators)
                    means = cells[f"{metric}_pct_mean"].to_numpy(dtype=float)
                    ax.bar(
                        center,
                        means,
                        width=0.62 * slot,
                        color=OPTIMIZER_COLORS[optimizer],
                        alpha=0.75,
                        edgecolor="#4d4d4d",
                        linewidth=0.6,
                        label=OPTIMIZER_LABELS[optimizer],
                    )
                    error_bars(
                        ax,
                        center,
                        means,
                        cells[f"{metric}_pct_ci_low"].to_numpy(),
                        cells[f"{metric}_pct_ci_high"].to_numpy(),
                    )
                    for k, estimator in enumerate(estimators):
                        cell = runs[
                            (runs["model"] == model) & (runs["recipe"] == estimator) & (runs["optimizer"] == optimizer)
                        ].sort_values("seed")
                        seeds = 100 * cell[column].to_numpy(dtype=float)
                        dead = cell["collapsed"].to_numpy(dtype=bool)
                        collapsed_seen |= bool(dead.any())
                        jitter = np.linspace(-0.18, 0.18, len(seeds)) * slot if len(seeds) > 1 else np.zeros(len(seeds))
                        seed_dots(ax, center[k] + jitter, seeds, dead)
                    theirs = cells[f"companion_{metric}_pct"].to_numpy(dtype=float)
                    has = np.isfinite(theirs)
                    ax.plot(
                        center[has] + 0.45 * slot,
                        theirs[has],
                        ls="",
                        marker="D",
                        markerfacecolor="white",
                        markeredgecolor="black",
                        markersize=6,
                        zorder=6,
                        clip_on=False,
                    )
                ax.set_xticks(x0, [ESTIMATOR_LABELS[e] for e in estimators])
                ax.set_ylim(0, 105)
                ax.set_title(title + (f" · {family_title(model, models)}" if len(model_list) > 1 else ""), fontsize=10)
                ax.grid(axis="x", visible=False)
        suptitle(
            fig,
            "Validation success by estimator and optimizer"
            + (f": {family_title(model_list[0], models)}" if len(model_list) == 1 else ""),
        )
        handles = [
            Patch(facecolor=OPTIMIZER_COLORS[o], alpha=0.75, edgecolor="#4d4d4d", label=OPTIMIZER_LABELS[o])
            for o in optimizers
        ]
        handles += [Line2D([], [], color="black", lw=1.0, label="mean, 95% t interval"), SEED_HANDLE]
        if collapsed_seen:
            handles.append(COLLAPSED_SEED_HANDLE)
        legend(fig, [*handles, COMPANION_HANDLE], ncol=4)
    return fig


def diagnostic_ranges(metrics: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Per (model, recipe, optimizer, update): median, min and max over seeds of each column, non-finite left out.

    Columns: model, recipe, optimizer, update and `<col>_median`, `<col>_min`, `<col>_max`."""
    values = metrics[["model", "recipe", "optimizer", "update", *columns]].copy()
    values[list(columns)] = values[list(columns)].astype(float).replace([np.inf, -np.inf], np.nan)
    grouped = values.groupby(["model", "recipe", "optimizer", "update"], sort=True)[list(columns)]
    parts = [getattr(grouped, stat)().add_suffix(f"_{stat}") for stat in ("median", "min", "max")]
    return pd.concat(parts, axis=1).reset_index()


def figure_companion_diagnostics(metrics: pd.DataFrame, models: Mapping[str, str] | None = None) -> Figure:
    """grad_snr, update RMS, update spectral norm and grad norm over updates: a row each, a column per estimator;
    per optimizer the median over seeds with the seed range shaded."""
    metrics = with_grad_snr(metrics)
    columns = [c for c, _ in DIAGNOSTIC_ROWS]
    check_companion(metrics, ["update", *columns])
    ranges = diagnostic_ranges(metrics, columns)
    model_list, estimators, optimizers = _layout(metrics, models)
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(
            len(DIAGNOSTIC_ROWS),
            len(estimators),
            (3.2, 1.9),
            (0.85, 0.15, 0.7, 1.0),
            (0.3, 0.35),
            sharex=True,
            sharey="row",
        )
        for r, (column, title) in enumerate(DIAGNOSTIC_ROWS):
            row = axes[r * len(estimators) : (r + 1) * len(estimators)]
            for ax, estimator in zip(row, estimators):
                drawn = False
                for m, model in enumerate(model_list):
                    for optimizer in optimizers:
                        q = ranges[
                            (ranges["model"] == model)
                            & (ranges["recipe"] == estimator)
                            & (ranges["optimizer"] == optimizer)
                        ]
                        drawn |= median_band(
                            ax,
                            q,
                            column,
                            ("min", "median", "max"),
                            OPTIMIZER_COLORS[optimizer],
                            LINE_STYLES[m % len(LINE_STYLES)],
                        )
                if not drawn:
                    ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", va="center", color="#777777")
                if r == 0:
                    ax.set_title(ESTIMATOR_LABELS[estimator], fontsize=10)
            row[0].set_ylabel(title, fontsize=9)
            finite = ranges[f"{column}_min"].dropna()
            if len(finite) and (finite > 0).all():
                log_y(row[0])  # shared along the row
            elif len(finite) and column == "grad_snr":  # the unbiased SNR estimate dips below 0 in noise
                row[0].set_yscale("symlog", linthresh=0.01)
                for ax in row:
                    ax.axhline(0.0, color="#999999", lw=0.6)
        label_outer(axes, len(estimators))
        suptitle(fig, "Optimizer diagnostics: median over seeds per update, seed range shaded")
        handles = [Line2D([], [], color=OPTIMIZER_COLORS[o], lw=1.5, label=OPTIMIZER_LABELS[o]) for o in optimizers]
        if len(model_list) > 1:
            handles += family_handles(model_list, models)
        handles.append(Patch(facecolor=MUTED, alpha=0.15, label="range over seeds"))
        legend(fig, handles, ncol=min(len(handles), 4))
    return fig


def companion_figures(
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    numbers: pd.DataFrame | None = None,
) -> Callable[[str], Figure]:
    """The function that draws one of COMPANION_FIGURES by name from the logs and the per-run table (beside the
    companion's `numbers`; trainer/analysis/pipeline.py writes them). ValueError for logs that are not a
    companion study's or a runs table that is not theirs (stale)."""
    check_companion(metrics)
    check_same_runs(metrics, runs)
    draw = {
        "companion_curves": lambda: figure_companion_curves(metrics, runs, models),
        "companion_bars": lambda: figure_companion_bars(runs, companion_summary_table(runs, numbers, models), models),
        "companion_diagnostics": lambda: figure_companion_diagnostics(metrics, models),
    }
    return lambda name: draw[name]()
