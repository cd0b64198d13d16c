"""The stability study: a learning-rate sweep per model and optimizer, and the lr each optimizer should run at.

The grid is model x optimizer x lr x seed (a recipe per optimizer, e.g. spo_adam on adam and spo_muon on muon),
in the Hive layout `.../optimizer=O/lr=L/seed=S/`, which `load_metrics` reads into a float `lr` column.
Everything per run reuses the main study's definitions: `summary.run_table` (called once per lr, since its run
key has no lr) gives the final window, its mean training success, the last evaluation and the collapse verdict
under the study's criterion. Definitions added here, all for one run:

* **Held-out AUC**: the mean of every `eval_success` the run logged, i.e. the area under the held-out curve
  normalised by its length (evaluations are evenly spaced). It rewards learning early and penalises collapsing
  late, which the final window alone cannot show. NaN for a run never evaluated.

Per (model, recipe, optimizer, lr) the summary gives, in percent, the final training success and the held-out
AUC (mean over seeds, 95% Student-t interval as in the main summary), the held-out success at the
last evaluation, and the collapsed seeds.

**The selection rule**, per (model, optimizer): the lr with the best mean held-out AUC (held-out, so the choice
is not fitted to the training tasks; AUC rather than the last evaluation, so a run that collapses late does not
win); on a tie, the smaller lr (the safer step). A (model, optimizer) that ran several recipes averages their
AUCs per lr. Lrs whose AUC is NaN (never evaluated) are not candidates. Pooled over families (one lr per
optimizer, what the default study's `lr:` table holds): the best AUC averaged over the families. The **stable
range** is the set of lrs at which no seed of that (model, optimizer) collapsed. `selected_lr.yaml` holds
`{model: {optimizer: lr}}`, ready for a study's top-level `lr:` table.

The figure (`stability`) has one column per model family and two rows: final training success and held-out
AUC against lr on a log axis, one line per optimizer (per recipe and optimizer when an optimizer ran several)
with the t interval as error bars, each seed a small dot and each collapsed seed a red X at its value; a
ring marks the selected lr on the AUC row, and a dotted line Muon's selected lr, where AdamW's curve gives the
companion's control ("AdamW at Muon's learning rate").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from trainer.analysis.cell_logs import NONFINITE_COLUMNS, lr_label, paper_model, run_keys
from trainer.analysis.collapse import CollapseCriterion
from trainer.analysis.kinds import STABILITY
from trainer.analysis.plotting import (
    COLLAPSE,
    LINE_STYLES,
    MUTED,
    OPTIMIZER_COLORS,
    OPTIMIZER_LABELS,
    STYLE,
    empty,
    family_title,
    fixed_log_x,
    grid,
    interval_line,
    legend,
    recipe_label,
    suptitle,
)
from trainer.analysis.summary import (
    WINDOW_FRACTION,
    ci_text,
    collapsed_text,
    markdown_head,
    native_optimizer,
    ordered,
    pct,
    run_table,
    seed_stats,
    sort_cells,
    table_head,
    table_row,
)

STABILITY_COLUMNS: tuple[str, ...] = (
    "update",
    "success_rate",
    "eval_success",
    "entropy",
    "n_trajectories",
    *NONFINITE_COLUMNS,
)
"""The metrics the stability and horizon analyses read (success, evaluations, episodes per update, every collapse
and degradation rule)."""
STABILITY_FIGURES: tuple[str, ...] = tuple(STABILITY.figures)


# -- per run -----------------------------------------------------------------------------------------------
def sweep_run_table(
    metrics: pd.DataFrame,
    criterion: CollapseCriterion | None = None,
    window_fraction: float = WINDOW_FRACTION,
    models: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per run (fractions): `summary.run_table`'s columns (per lr where the logs have one, with `lr`
    before `seed`), plus `heldout_auc` (see the module docstring)."""
    if len(metrics) == 0:
        raise ValueError("sweep_run_table: the metrics table is empty")
    keys = run_keys(metrics)
    if "lr" in metrics.columns:
        parts = [
            run_table(part.drop(columns="lr"), criterion, window_fraction, models).assign(lr=float(lr))
            for lr, part in metrics.groupby("lr", sort=True)
        ]
        runs = pd.concat(parts, ignore_index=True)
    else:
        runs = run_table(metrics, criterion, window_fraction, models)
    frame = metrics.sort_values([*keys, "update"], kind="stable")
    extras = []
    for key, run in frame.groupby(keys, sort=False):
        evals = run["eval_success"].to_numpy(dtype=float) if "eval_success" in run else np.array([])
        evals = evals[~np.isnan(evals)]
        extras.append({**dict(zip(keys, key)), "heldout_auc": float(evals.mean()) if len(evals) else math.nan})
    runs = runs.merge(pd.DataFrame(extras), on=keys, how="left")
    runs = runs[[*keys, *(c for c in runs.columns if c not in keys)]]
    return sort_cells(runs, models, extra=tuple(k for k in keys if k in ("lr", "seed")))


# -- tables ------------------------------------------------------------------------------------------------
def stability_summary_table(
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per model x recipe x optimizer x lr (percent): final training success and held-out AUC (mean over
    seeds, t interval), held-out success at the last evaluation, seeds and collapsed seeds."""
    rows = []
    for (model, recipe, optimizer, lr), cell in runs.groupby(["model", "recipe", "optimizer", "lr"], sort=False):
        cell = cell.sort_values("seed")
        final, final_low, final_high = seed_stats(cell, "window_success", level)
        auc, auc_low, auc_high = seed_stats(cell, "heldout_auc", level)
        collapsed = cell["collapsed"].astype(bool)
        rows.append(
            {
                "model": model,
                "paper_model": paper_model(model, models),
                "recipe": recipe,
                "optimizer": optimizer,
                "lr": float(lr),
                "n_seeds": len(cell),
                "seeds": ",".join(str(s) for s in cell["seed"]),
                "final_pct_mean": final,
                "final_pct_ci_low": final_low,
                "final_pct_ci_high": final_high,
                "heldout_last_pct_mean": seed_stats(cell, "eval_success", level)[0],
                "auc_pct_mean": auc,
                "auc_pct_ci_low": auc_low,
                "auc_pct_ci_high": auc_high,
                "n_collapsed": int(collapsed.sum()),
                "collapsed_seeds": ",".join(str(s) for s in cell.loc[collapsed, "seed"]),
                "n_degraded": int(cell["degraded"].sum()) if "degraded" in cell else 0,
            }
        )
    return sort_cells(pd.DataFrame(rows), models, extra=("lr",))


def select_lrs(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (model, optimizer): `selected_lr` (best mean held-out AUC, ties to the smaller lr; NaN when no lr was
    evaluated), its `auc_pct`, the swept `lrs` and the `stable_lrs` (no collapsed seed), in the summary's order."""
    rows = []
    for (model, optimizer), part in summary.groupby(["model", "optimizer"], sort=False):
        per_lr = part.groupby("lr", sort=True).agg(auc=("auc_pct_mean", "mean"), collapsed=("n_collapsed", "sum"))
        candidates = per_lr[per_lr["auc"].notna()].reset_index()
        best = candidates.sort_values(["auc", "lr"], ascending=[False, True], kind="stable").head(1)
        rows.append(
            {
                "model": model,
                "paper_model": part["paper_model"].iloc[0],
                "optimizer": optimizer,
                "selected_lr": float(best["lr"].iloc[0]) if len(best) else math.nan,
                "auc_pct": float(best["auc"].iloc[0]) if len(best) else math.nan,
                "lrs": [float(lr) for lr in per_lr.index],
                "stable_lrs": [float(lr) for lr in per_lr.index[per_lr["collapsed"] == 0]],
            }
        )
    return pd.DataFrame(
        rows, columns=["model", "paper_model", "optimizer", "selected_lr", "auc_pct", "lrs", "stable_lrs"]
    )


def select_pooled_lrs(summary: pd.DataFrame) -> dict[str, float]:
    """Per optimizer, one lr for every family (what a study's `lr:` table holds): the best held-out AUC averaged
    over the families that ran it (each family's mean over seeds, then their mean; ties to the smaller lr)."""
    per_lr = (
        summary.groupby(["optimizer", "lr", "model"], sort=True)["auc_pct_mean"]
        .mean()
        .groupby(["optimizer", "lr"], sort=True)
        .mean()
        .dropna()
        .reset_index()
    )
    chosen = {}
    for optimizer, part in per_lr.groupby("optimizer", sort=False):
        best = part.sort_values(["auc_pct_mean", "lr"], ascending=[False, True], kind="stable").iloc[0]
        chosen[str(optimizer)] = float(best["lr"])
    return chosen


def selected_lr_yaml(selection: pd.DataFrame, pooled: Mapping[str, float] | None = None) -> str:
    """`{model: {optimizer: lr}}` of the selections that have an lr, and under `lr` the pooled choice
    (`select_pooled_lrs`), as YAML with a comment header."""
    table: dict = {}
    for row in selection.itertuples(index=False):
        if np.isfinite(row.selected_lr):
            table.setdefault(row.model, {})[row.optimizer] = float(row.selected_lr)
    if pooled:
        table["lr"] = dict(pooled)
    header = (
        "# The stability study's selected learning rates: per model and optimizer, the lr with the best mean\n"
        "# held-out AUC (ties: the smaller lr); under `lr`, per optimizer, the best AUC averaged over the\n"
        "# families: the default study's top-level `lr:` table (config.yaml).\n"
    )
    return header + (yaml.safe_dump(table, sort_keys=False) if table else "{}\n")


def _lrs(values: Sequence[float]) -> str:
    return ", ".join(lr_label(v) for v in values) if len(values) else "none"


def stability_markdown(
    summary: pd.DataFrame,
    selection: pd.DataFrame,
    notes: Sequence[str] = (),
    window_fraction: float = WINDOW_FRACTION,
    pooled: Mapping[str, float] | None = None,
) -> str:
    """The summary as a Markdown page: method, notes, the selection per model and optimizer, then every lr."""
    method = (
        f"Final = mean unsmoothed training success over the last {window_fraction:.0%} of each run's updates; "
        "held-out AUC = mean of every held-out evaluation (`eval_success`) of the run, i.e. the normalised "
        "area under its held-out curve; last held-out = the final evaluation. All in percent, averaged over "
        "seeds; interval = 95% Student-t over seeds (n/a with one seed). Collapse = the rule in "
        "`trainer/analysis/collapse.py`. Selected lr = per model and optimizer, the lr with the best mean "
        "held-out AUC (ties: the smaller lr); stable lrs = those at which no seed collapsed."
    )
    lines = markdown_head("Learning-rate stability", method, notes)
    if pooled:
        lines += [
            "## One learning rate per optimizer",
            "",
            "Per optimizer, the lr with the best held-out AUC averaged "
            "over the families (the default study's `lr:` table): "
            + ", ".join(f"{optimizer} {lr_label(lr)}" for optimizer, lr in pooled.items())
            + ".",
            "",
        ]
    lines += [
        "## Selected learning rates",
        "",
        *table_head(["model", "paper model", "optimizer", "selected lr", "held-out AUC %", "stable lrs", "swept lrs"]),
    ]
    for row in selection.itertuples(index=False):
        chosen = lr_label(row.selected_lr) if np.isfinite(row.selected_lr) else "– (never evaluated)"
        lines.append(
            table_row(
                [
                    row.model,
                    row.paper_model,
                    row.optimizer,
                    chosen,
                    pct(row.auc_pct),
                    _lrs(row.stable_lrs),
                    _lrs(row.lrs),
                ]
            )
        )
    lines += [
        "",
        "## Every learning rate",
        "",
        *table_head(
            [
                "model",
                "recipe",
                "optimizer",
                "lr",
                "seeds",
                "final %",
                "95% CI",
                "held-out AUC %",
                "95% CI",
                "last held-out %",
                "collapsed",
            ]
        ),
    ]
    for row in summary.itertuples(index=False):
        lines.append(
            table_row(
                [
                    row.model,
                    row.recipe,
                    row.optimizer,
                    lr_label(row.lr),
                    str(row.n_seeds),
                    pct(row.final_pct_mean),
                    ci_text(row.final_pct_ci_low, row.final_pct_ci_high),
                    pct(row.auc_pct_mean),
                    ci_text(row.auc_pct_ci_low, row.auc_pct_ci_high),
                    pct(row.heldout_last_pct_mean),
                    collapsed_text(row),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def evaluation_notes(runs: pd.DataFrame) -> list[str]:
    """Runs never evaluated (their AUC and held-out success are blank)."""
    never = runs[runs["heldout_auc"].isna()]
    if len(never) == 0:
        return []
    keys = run_keys(never)
    labels = [
        "/".join(f"{k}={lr_label(v) if k == 'lr' else v}" for k, v in zip(keys, row))
        for row in never[keys].itertuples(index=False, name=None)
    ]
    return [f"{len(never)} run(s) never evaluated (no held-out metrics): {', '.join(labels)}"]


# -- figure ------------------------------------------------------------------------------------------------
def line_styles(summary: pd.DataFrame) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(recipe, optimizer) -> (colour, line style, label): colour by optimizer, style by recipe within it."""
    styles = {}
    pairs = list(dict.fromkeys(zip(summary["recipe"], summary["optimizer"])))
    for optimizer in ordered({o for _, o in pairs}, ["muon", "adam", "adam_high_lr"]):
        recipes = [r for r, o in pairs if o == optimizer]
        for i, recipe in enumerate(recipes):
            label = OPTIMIZER_LABELS.get(optimizer, optimizer)
            if len(recipes) > 1 or native_optimizer(recipe) != optimizer:
                label = f"{label}: {recipe_label(recipe)}"
            styles[(recipe, optimizer)] = (OPTIMIZER_COLORS.get(optimizer, MUTED), LINE_STYLES[i % 4], label)
    return styles


def figure_stability(
    runs: pd.DataFrame, summary: pd.DataFrame, selection: pd.DataFrame, models: Mapping[str, str] | None = None
) -> Figure:
    """Final training success (top) and held-out AUC (bottom) against lr, one column per model family."""
    if summary.empty:
        return empty("stability: no runs in these logs")
    model_list = ordered(summary["model"], list(models or {}))
    lrs = sorted(set(summary["lr"]))
    styles = line_styles(summary)
    panels = (
        ("final_pct", "window_success", "Final training success (%)"),
        ("auc_pct", "heldout_auc", "Held-out AUC (%)"),
    )
    ncol = 3 if len(model_list) > 1 else 2  # legend columns: a one-model figure is narrow
    legend_rows = -(-(len(styles) + 5) // ncol)  # the optimizers' lines and at most 5 marker entries
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(
            2, len(model_list), (3.8, 2.6), (0.75, 0.15, 0.75, 0.95 + 0.25 * legend_rows), (0.35, 0.75), sharey=True
        )
        collapsed_seen = selected_seen = muon_lr_seen = False
        for j, model in enumerate(model_list):
            for i, (stat, column, ylabel) in enumerate(panels):
                ax = axes[i * len(model_list) + j]
                for k, ((recipe, optimizer), (color, style, _)) in enumerate(styles.items()):
                    line = summary[
                        (summary["model"] == model)
                        & (summary["recipe"] == recipe)
                        & (summary["optimizer"] == optimizer)
                    ].sort_values("lr")
                    if line.empty:
                        continue
                    interval_line(
                        ax,
                        line["lr"].to_numpy(dtype=float),
                        line[f"{stat}_mean"].to_numpy(dtype=float),
                        line[f"{stat}_ci_low"].to_numpy(dtype=float),
                        line[f"{stat}_ci_high"].to_numpy(dtype=float),
                        color,
                        style,
                    )
                    seeds = runs[
                        (runs["model"] == model) & (runs["recipe"] == recipe) & (runs["optimizer"] == optimizer)
                    ]
                    shift = 1.0 + 0.06 * (k - (len(styles) - 1) / 2)  # side by side on the log axis
                    values = 100 * seeds[column].to_numpy(dtype=float)
                    dead = seeds["collapsed"].to_numpy(dtype=bool)
                    xs = seeds["lr"].to_numpy(dtype=float) * shift
                    ax.scatter(xs[~dead], values[~dead], s=9, color=color, alpha=0.55, linewidth=0, zorder=4)
                    if dead.any():
                        ax.scatter(
                            xs[dead],
                            values[dead],
                            marker="X",
                            s=45,
                            color=COLLAPSE,
                            edgecolor="white",
                            linewidth=0.5,
                            zorder=5,
                        )
                        collapsed_seen = True
                    if stat == "auc_pct":
                        chosen = selection[(selection["model"] == model) & (selection["optimizer"] == optimizer)]
                        for lr in chosen["selected_lr"].dropna():
                            at = line[line["lr"] == lr]
                            if len(at):
                                ax.scatter(
                                    [lr],
                                    at["auc_pct_mean"],
                                    s=130,
                                    facecolor="none",
                                    edgecolor=color,
                                    linewidth=1.6,
                                    zorder=6,
                                )
                                selected_seen = True
                muon = selection[(selection["model"] == model) & (selection["optimizer"] == "muon")]["selected_lr"]
                for lr in muon.dropna():  # where AdamW's curve crosses it: the companion's "AdamW at Muon's lr"
                    ax.axvline(lr, color=OPTIMIZER_COLORS["muon"], ls=":", lw=1.0, zorder=1)
                    muon_lr_seen = True
                fixed_log_x(ax, lrs, [lr_label(lr) for lr in lrs], 1.6, rotation=30, ha="right", fontsize=8)
                ax.set_ylim(-2, 102)
                if j == 0:
                    ax.set_ylabel(ylabel)
                if i == 0:
                    ax.set_title(family_title(model, models), fontsize=10)
                else:
                    ax.set_xlabel("Learning rate")
        handles = [
            Line2D([], [], color=c, ls=s, lw=1.6, marker="o", markersize=4, label=label)
            for c, s, label in styles.values()
        ]
        handles.append(Line2D([], [], color=MUTED, lw=1.0, label="95% t interval over seeds"))
        handles.append(Line2D([], [], marker="o", ls="", color=MUTED, alpha=0.55, markersize=3, label="one seed"))
        if collapsed_seen:
            handles.append(
                Line2D(
                    [],
                    [],
                    marker="X",
                    ls="",
                    color=COLLAPSE,
                    markersize=7,
                    markeredgecolor="white",
                    label="collapsed seed",
                )
            )
        if selected_seen:
            handles.append(
                Line2D(
                    [],
                    [],
                    marker="o",
                    ls="",
                    markerfacecolor="none",
                    markeredgecolor=MUTED,
                    markersize=10,
                    label="selected lr (best held-out AUC)",
                )
            )
        if muon_lr_seen:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=OPTIMIZER_COLORS["muon"],
                    ls=":",
                    lw=1.0,
                    label="Muon's selected lr (AdamW there:\nthe companion's control)",
                )
            )
        legend(fig, handles, ncol=min(len(handles), ncol))
        suptitle(fig, "Learning-rate stability")
    return fig
