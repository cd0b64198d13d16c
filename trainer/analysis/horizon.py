"""The horizon study: how training success and collapses change with the task's length.

Each model of the grid is one task length of a family: a warm-started tiny model whose environment options set
the length (e.g. `qwen-h4`: minirepo tasks with 4 bugs), labelled with its `horizon` in the study
(`models.NAME.horizon`, passed here as `horizons`). Models with the same paper name form one family across
horizons. The grid is model (= horizon) x recipe x optimizer x seed, in the main study's Hive layout.

Per run everything comes from the stability study's `sweep_run_table` (itself the main study's `run_table`:
final window, its mean training success, last evaluation, collapse verdict), plus:

* **Learning**: the main summary's `gain` (mean training success over the last fifth of the updates minus over
  the first fifth, `summary.LEARNING_FRACTION`): what RL added at this horizon, whatever the warm start began at.
* **Held-out AUC**: the mean of every held-out evaluation (see `stability`).

Per (family, horizon, recipe, optimizer) the summary gives, in percent, the final training success and the
learning (mean over seeds with a 95% Student-t interval, as the main summary), the held-out AUC and last
evaluation, and the collapsed seeds out of the seeds run.

The figure (`horizon`) has one row per family and two panels: final training success against horizon (log2
axis), one line per recipe and optimizer with the t interval as error bars; and the number of collapsed
seeds against horizon, the same lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from trainer.analysis.cell_logs import paper_model
from trainer.analysis.collapse import CollapseCriterion
from trainer.analysis.kinds import HORIZON
from trainer.analysis.plotting import (
    MUTED,
    SELECTED_COLORS,
    STYLE,
    empty,
    fixed_log_x,
    grid,
    interval_line,
    legend,
    recipe_label,
)
from trainer.analysis.stability import evaluation_notes, sweep_run_table
from trainer.analysis.summary import (
    WINDOW_FRACTION,
    ci_text,
    collapsed_text,
    markdown_head,
    native_optimizer,
    ordered,
    pct,
    seed_stats,
    sort_rows,
    table_head,
    table_row,
)
from trainer.recipes import FIGURE2_RECIPES

HORIZON_FIGURES: tuple[str, ...] = tuple(HORIZON.figures)


def horizon_run_table(
    metrics: pd.DataFrame,
    horizons: Mapping[str, float],
    criterion: CollapseCriterion | None = None,
    window_fraction: float = WINDOW_FRACTION,
    models: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """`sweep_run_table` with each run's `horizon` (from `horizons`, by model), in fractions.
    ValueError naming a model of the logs that has no horizon."""
    unlabelled = sorted(set(metrics["model"]) - set(horizons))
    if unlabelled:
        raise ValueError(f"horizon analysis: model(s) {unlabelled} have no `horizon` label (models.NAME.horizon)")
    runs = sweep_run_table(metrics, criterion, window_fraction, models)
    runs.insert(runs.columns.get_loc("seed") + 1, "horizon", runs["model"].map(horizons).astype(float))
    return runs


def sort_horizon(frame: pd.DataFrame, models: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Rows in reading order: families as in `models`, recipes in Figure 2 order, optimizers, then horizon."""
    return sort_rows(
        frame,
        {
            "paper_model": ordered(frame["paper_model"], [paper_model(m, models) for m in (models or {})]),
            "recipe": ordered(frame["recipe"], list(FIGURE2_RECIPES)),
            "optimizer": None,
            "horizon": None,
        },
    )


def horizon_summary_table(
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per model (= family and horizon) x recipe x optimizer, in percent: final training success and
    learning (mean, t interval), held-out AUC and last evaluation, seeds and collapsed seeds."""
    rows = []
    for (model, recipe, optimizer), cell in runs.groupby(["model", "recipe", "optimizer"], sort=False):
        cell = cell.sort_values("seed")
        final, final_low, final_high = seed_stats(cell, "window_success", level)
        gain, gain_low, gain_high = seed_stats(cell, "gain", level)
        collapsed = cell["collapsed"].astype(bool)
        rows.append(
            {
                "paper_model": paper_model(model, models),
                "horizon": float(cell["horizon"].iloc[0]),
                "model": model,
                "recipe": recipe,
                "optimizer": optimizer,
                "n_seeds": len(cell),
                "seeds": ",".join(str(s) for s in cell["seed"]),
                "final_pct_mean": final,
                "final_pct_ci_low": final_low,
                "final_pct_ci_high": final_high,
                "gain_pp_mean": gain,
                "gain_pp_ci_low": gain_low,
                "gain_pp_ci_high": gain_high,
                "auc_pct_mean": seed_stats(cell, "heldout_auc", level)[0],
                "heldout_last_pct_mean": seed_stats(cell, "eval_success", level)[0],
                "n_collapsed": int(collapsed.sum()),
                "collapsed_seeds": ",".join(str(s) for s in cell.loc[collapsed, "seed"]),
                "n_degraded": int(cell["degraded"].sum()) if "degraded" in cell else 0,
            }
        )
    return sort_horizon(pd.DataFrame(rows), models)


def horizon_markdown(summary: pd.DataFrame, notes: Sequence[str] = (), window_fraction: float = WINDOW_FRACTION) -> str:
    """The summary as a Markdown page: method, notes, one row per family, horizon, recipe and optimizer."""
    method = (
        f"Final = mean unsmoothed training success over the last {window_fraction:.0%} of each run's updates; "
        "learning = mean training success over the last fifth of the updates minus over the first fifth "
        "(percentage points, as the main summary's); "
        "held-out AUC = mean of every held-out evaluation of the run; last held-out = the final evaluation. "
        "In percent, averaged over seeds; interval = 95% Student-t over seeds (n/a with one seed). "
        "Collapse = the rule in `trainer/analysis/collapse.py`."
    )
    lines = markdown_head("Training success against the task's horizon", method, notes)
    lines += table_head(
        [
            "family",
            "horizon",
            "model",
            "recipe",
            "optimizer",
            "final %",
            "95% CI",
            "learning (pp)",
            "95% CI",
            "held-out AUC %",
            "last held-out %",
            "collapsed",
        ]
    )
    for row in summary.itertuples(index=False):
        lines.append(
            table_row(
                [
                    row.paper_model,
                    f"{row.horizon:g}",
                    row.model,
                    row.recipe,
                    row.optimizer,
                    pct(row.final_pct_mean),
                    ci_text(row.final_pct_ci_low, row.final_pct_ci_high),
                    pct(row.gain_pp_mean),
                    ci_text(row.gain_pp_ci_low, row.gain_pp_ci_high),
                    pct(row.auc_pct_mean),
                    pct(row.heldout_last_pct_mean),
                    collapsed_text(row),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def horizon_notes(runs: pd.DataFrame, horizons: Mapping[str, float]) -> list[str]:
    """Labelled models with no runs in these logs, and runs never evaluated."""
    absent = [f"{m} (horizon {h:g})" for m, h in horizons.items() if m not in set(runs["model"])]
    return ([f"no runs of model(s) {', '.join(absent)} in these logs"] if absent else []) + evaluation_notes(runs)


# -- figure ------------------------------------------------------------------------------------------------
def horizon_lines(summary: pd.DataFrame) -> dict[tuple[str, str], tuple[Any, str]]:
    """(recipe, optimizer) -> (colour, label), in Figure 2 order: the paper's colours for SPO + Adam, SPO + Muon
    and the full recipe, a colour-blind palette for the rest."""
    pairs = sorted(
        set(zip(summary["recipe"], summary["optimizer"])),
        key=lambda p: (ordered(summary["recipe"], list(FIGURE2_RECIPES)).index(p[0]), p[1]),
    )
    palette = sns.color_palette("colorblind", len(pairs))
    lines = {}
    for i, (recipe, optimizer) in enumerate(pairs):
        label = recipe_label(recipe) + ("" if native_optimizer(recipe) == optimizer else f" ({optimizer})")
        lines[(recipe, optimizer)] = (SELECTED_COLORS.get((recipe, optimizer), palette[i]), label)
    return lines


def figure_horizon(summary: pd.DataFrame, models: Mapping[str, str] | None = None) -> Figure:
    """Per family: final training success against horizon (error bars: t interval) and collapsed seeds."""
    if summary.empty:
        return empty("horizon: no runs in these logs")
    families = list(dict.fromkeys(summary["paper_model"]))
    lines = horizon_lines(summary)
    most_seeds = int(summary["n_seeds"].max())
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(len(families), 2, (4.0, 2.7), (0.8, 0.15, 0.45, 1.0), (0.75, 0.7))
        for f, family in enumerate(families):
            rows = summary[summary["paper_model"] == family]
            horizons = sorted(set(rows["horizon"]))
            success_ax, collapse_ax = axes[2 * f], axes[2 * f + 1]
            for k, ((recipe, optimizer), (color, _)) in enumerate(lines.items()):
                line = rows[(rows["recipe"] == recipe) & (rows["optimizer"] == optimizer)].sort_values("horizon")
                if line.empty:
                    continue
                x = line["horizon"].to_numpy(dtype=float)
                interval_line(
                    success_ax,
                    x,
                    line["final_pct_mean"].to_numpy(dtype=float),
                    line["final_pct_ci_low"].to_numpy(dtype=float),
                    line["final_pct_ci_high"].to_numpy(dtype=float),
                    color,
                )
                shift = 2 ** (0.05 * (k - (len(lines) - 1) / 2))  # side by side on the log axis
                collapse_ax.plot(x * shift, line["n_collapsed"], color=color, lw=1.4, marker="o", markersize=4)
            for ax in (success_ax, collapse_ax):
                fixed_log_x(ax, horizons, [f"{h:g}" for h in horizons], 1.4, base=2)
                ax.set_xlabel("Horizon")
            success_ax.set_ylim(-2, 102)
            success_ax.set_ylabel("Final training success (%)")
            collapse_ax.set_ylim(-0.3, most_seeds + 0.3)
            collapse_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            collapse_ax.set_ylabel(
                f"Collapsed seeds (of {most_seeds})" if (rows["n_seeds"] == most_seeds).all() else "Collapsed seeds"
            )
            success_ax.set_title(f"{family}: final success", fontsize=10)
            collapse_ax.set_title(f"{family}: collapses", fontsize=10)
        handles = [
            Line2D([], [], color=color, lw=1.6, marker="o", markersize=4, label=label)
            for color, label in lines.values()
        ]
        legend(
            fig,
            handles + [Line2D([], [], color=MUTED, lw=1.0, label="95% t interval over seeds (error bars)")],
            ncol=min(len(handles) + 1, 4),
        )
    return fig
