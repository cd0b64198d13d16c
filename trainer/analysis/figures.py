"""The papers' figures from the cells' logs: bars (Figure 2), curves (Figures 3-5) and optimizer diagnostics.

What each figure shows, and the choices behind it:

* **fig2** -- one panel per model family; per Figure 2 recipe (paper order, top to bottom) a bar of our mean
  window success over seeds with its 95% Student-t interval (the summary table's own numbers, so the two agree),
  each seed as a dot (red if that seed collapsed), and the paper's value as a hatched bar just beneath. Each
  recipe is shown with its own optimizer (spo_adam with Adam, the rest with Muon), as in the paper; Adam
  versions of the ablations are in fig4/fig5 and the summary. The full recipe is pale green.
* **fig3** -- the selected runs (SPO + Adam, SPO + Muon, full recipe), one panel per model family: raw success
  thin and translucent, EMA bold, every seed drawn (the paper drew one selected run; we draw all, which hides
  nothing), collapse points as red crosses.
* **fig4 / fig5** -- every recipe of one family (fig4: MiniCPM5-2B or its stand-in, fig5: Qwen3.5-4B or its
  stand-in; chosen by paper name, so both scales work), one panel per recipe: Muon solid, Adam dashed, the full
  recipe green, collapse points red.
* **diagnostics** -- grad norm, update RMS and spectral norm, entropy, approx. KL, clip fractions, TIS truncation
  and staleness over updates: per model family and optimizer the median over all its runs with the
  interquartile band (robust to a diverged run's huge values; non-finite values are left out). Colour = optimizer,
  line style = model family. It pools every recipe an optimizer ran with, so it compares optimizers as the
  grid ran them, not recipe by recipe.

EMA: `collapse.ema`'s definition (span 5, `adjust=False`, `ignore_na=True`, from the first observation), here
computed for all runs at once with a grouped `ewm`. Only Muon and Adam have their colour and line style here; any
other optimizer is grey and dotted. Absent model families or recipes (smoke grids) are left out, and a figure
with nothing to show says so in its panel instead of failing: Snakemake still gets every file it asked for.
Style, colours and files: `plotting`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.textpath import TextPath

from trainer.analysis import plotting
from trainer.analysis.cell_logs import RUN_KEYS, paper_model
from trainer.analysis.collapse import ema_by_run
from trainer.analysis.config import EMA_SPAN
from trainer.analysis.kinds import MAIN
from trainer.analysis.plotting import (
    ADAM,
    COLLAPSE_HANDLE,
    COLLAPSED_SEED_HANDLE,
    FULL,
    LINE_STYLES,
    MUON,
    MUTED,
    SEED_HANDLE,
    SELECTED_COLORS,
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
    recipe_label,
    seed_dots,
    suptitle,
)
from trainer.analysis.statistics import t_interval
from trainer.analysis.summary import (
    check_same_runs,
    load_paper_numbers,
    native_optimizer,
    ordered,
    run_bounds,
)
from trainer.recipes import FIGURE2_RECIPES

BAR, FULL_BAR, PAPER_EDGE = "#c3cfdd", "#b9e4c4", "#6b6b6b"
OPTIMIZER_COLORS = {"muon": MUON, "adam": ADAM}
OPTIMIZER_STYLES = {"muon": "-", "adam": "--"}

SELECTED_RUNS: tuple[tuple[str, str], ...] = (("spo_adam", "adam"), ("spo_muon", "muon"), ("full", "muon"))
"""Figure 3's runs: (recipe, optimizer)."""

FAMILY_FIGURES: dict[str, str] = {"fig4": "MiniCPM5-2B", "fig5": "Qwen3.5-4B"}
"""Which paper model family each all-recipes figure shows."""

DIAGNOSTICS: tuple[tuple[str, str, bool], ...] = (
    ("grad_norm", "Gradient norm", True),
    ("update_rms", "Update RMS", True),
    ("update_spectral_norm", "Update spectral norm", True),
    ("entropy", "Policy entropy", False),
    ("approx_kl", "Approx. KL", False),
    ("staleness_mean", "Staleness (updates)", False),
    ("clip_frac_low", "Clip fraction (low side)", False),
    ("clip_frac_high", "Clip fraction (high side)", False),
    ("tis_truncated_frac", "TIS truncated fraction", False),
)
"""(column, panel title, log scale when all values are positive) for the diagnostics figure."""

FIGURES: tuple[str, ...] = tuple(MAIN.figures)
PLOT_COLUMNS = ("update", "success_rate", *(column for column, _, _ in DIAGNOSTICS))
"""The metrics `plot` reads (success curves and the diagnostics panels)."""
FORMATS = plotting.FORMATS
"""The figures' file formats (benchmarks/bench_figures.py reads them from here)."""


def add_ema(metrics: pd.DataFrame, span: int) -> pd.DataFrame:
    """A copy of `metrics` sorted by run and update, with `success_ema` = `collapse.ema(success_rate, span)`."""
    out = metrics.sort_values([*RUN_KEYS, "update"], kind="stable", ignore_index=True)
    out["success_ema"] = ema_by_run(out, span)
    return out


# -- helpers -----------------------------------------------------------------------------------------------
def _text_width(texts: Sequence[str], size: float) -> float:
    """Width in inches of the widest string at `size` points (from glyph outlines; no renderer needed)."""
    return max((TextPath((0, 0), t, size=size).get_extents().width for t in texts), default=0.0) / 72


def _curves(frame: pd.DataFrame) -> dict[tuple, np.ndarray]:
    """Per run in `frame` (sorted by run and update): an (n, 3) array of update, success %, EMA %."""
    values = np.column_stack(
        [
            frame["update"].to_numpy(dtype=float),
            100 * frame["success_rate"].to_numpy(dtype=float),
            100 * frame["success_ema"].to_numpy(dtype=float),
        ]
    )
    return {key: values[a:b] for key, a, b in run_bounds(frame)}


def _pick(curves: dict[tuple, np.ndarray], model=None, recipe=None, optimizer=None) -> list[np.ndarray]:
    """The curves of the runs matching the given keys (None matches anything)."""
    wanted = (model, recipe, optimizer)
    return [c for key, c in curves.items() if all(w is None or w == k for w, k in zip(wanted, key))]


def _collapse_points(frame: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """For every collapsed run in `frame`: its keys, collapse update and the EMA there (percent)."""
    hits = runs[runs["collapsed"].astype(bool)]
    keys = hits[list(RUN_KEYS)].assign(update=hits["collapse_update"].astype("int64"))
    points = keys.merge(frame[[*RUN_KEYS, "update", "success_ema"]], on=[*RUN_KEYS, "update"], how="inner")
    return points.assign(ema_pct=100 * points["success_ema"].fillna(0.0))


# -- the figures -------------------------------------------------------------------------------------------
def figure_bars(
    runs: pd.DataFrame,
    paper: pd.DataFrame | None = None,
    models: Mapping[str, str] | None = None,
) -> Figure:
    """Figure 2: per model family, our window success per recipe (mean, 95% CI, seeds) beside the paper's."""
    paper = load_paper_numbers() if paper is None else paper
    native = runs[[native_optimizer(r) == o for r, o in zip(runs["recipe"], runs["optimizer"])]]
    family_list = ordered(native["model"], list(models or {}))
    recipes = ordered(native["recipe"], list(FIGURE2_RECIPES))
    if not family_list:
        return empty("Figure 2: no run with its recipe's own optimizer in these logs")
    paper_values = paper.set_index(["model", "recipe", "optimizer"])["success_updates_90_100_pct"]
    with matplotlib.rc_context(STYLE):
        labels = [recipe_label(r) for r in recipes]
        left = _text_width(labels, matplotlib.rcParams["ytick.labelsize"]) + 0.4  # + tick, pad, edge
        fig, axes = grid(
            1, len(family_list), (4.4, 0.52 * len(recipes)), (left, 0.15, 0.35, 1.0), (0.3, 0), sharey=True
        )
        y = np.arange(len(recipes), dtype=float)
        for ax, model in zip(axes, family_list):
            cells = native[native["model"] == model]
            for i, recipe in enumerate(recipes):
                cell = cells[cells["recipe"] == recipe].sort_values("seed")
                key = (paper_model(model, models), recipe, native_optimizer(recipe))
                if key in paper_values.index:
                    theirs = float(paper_values[key])
                    ax.barh(
                        y[i] + 0.19,
                        theirs,
                        height=0.38,
                        color="white",
                        edgecolor=PAPER_EDGE,
                        hatch="////",
                        linewidth=0.6,
                        label="paper",
                    )
                    ax.text(theirs + 1.5, y[i] + 0.19, f"{theirs:.1f}", va="center", fontsize=8, color=MUTED)
                if cell.empty:
                    ax.text(1.5, y[i] - 0.19, "not run", va="center", fontsize=8, color="#777777", style="italic")
                    continue
                seeds = 100 * cell["window_success"].to_numpy(dtype=float)
                ours = seeds.mean()
                low, high = t_interval(seeds)
                ax.barh(
                    y[i] - 0.19,
                    ours,
                    height=0.38,
                    color=FULL_BAR if recipe == "full" else BAR,
                    edgecolor="#4d4d4d",
                    linewidth=0.6,
                    label="ours",
                )
                if np.isfinite(low):
                    error_bars(
                        ax,
                        np.array([y[i] - 0.19]),
                        np.array([ours]),
                        np.array([low]),
                        np.array([high]),
                        horizontal=True,
                    )
                jitter = np.linspace(-0.11, 0.11, len(seeds)) if len(seeds) > 1 else np.zeros(1)
                seed_dots(ax, seeds, y[i] - 0.19 + jitter, cell["collapsed"].to_numpy(dtype=bool))
                right = max(ours, high if np.isfinite(high) else ours, seeds.max())
                ax.text(right + 1.5, y[i] - 0.19, f"{ours:.1f}", va="center", fontsize=8)
            ax.set_xlim(0, 108)
            ax.set_xlabel("Training success, last 10% of updates (%)")
            ax.set_title(family_title(model, models))
            ax.grid(axis="y", visible=False)
        axes[0].set_yticks(y, labels)
        axes[0].set_ylim(len(recipes) - 0.45, -0.55)  # first recipe on top
        legend(
            fig,
            [
                Patch(facecolor=BAR, edgecolor="#4d4d4d", label="ours: mean over seeds, 95% t interval"),
                Patch(facecolor=FULL_BAR, edgecolor="#4d4d4d", label="ours: full recipe"),
                Patch(facecolor="white", edgecolor=PAPER_EDGE, hatch="////", label="Ruan et al. 2026, Fig. 2"),
                SEED_HANDLE,
                COLLAPSED_SEED_HANDLE,
            ],
            ncol=5 if len(family_list) > 1 else 3,
        )
    return fig


def figure_selected(
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    selected: Sequence[tuple[str, str]] = SELECTED_RUNS,
    ema_span: int = EMA_SPAN,
) -> Figure:
    """Figure 3: the selected (recipe, optimizer) runs per model family, raw thin and EMA bold.

    `metrics` must carry `success_ema` (`add_ema`); `ema_span` only labels the legend."""
    mask = np.zeros(len(metrics), dtype=bool)
    for recipe, optimizer in selected:
        mask |= ((metrics["recipe"] == recipe) & (metrics["optimizer"] == optimizer)).to_numpy()
    picked = metrics[mask]
    family_list = ordered(picked["model"], list(models or {}))
    if not family_list:
        return empty(
            "Figure 3: none of the selected runs ("
            + ", ".join(recipe_label(r) for r, _ in selected)
            + ") in these logs"
        )
    palette = sns.color_palette("colorblind", len(selected))
    curves, points = _curves(picked), _collapse_points(picked, runs)
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(1, len(family_list), (4.2, 2.8), (0.75, 0.15, 0.35, 1.0), (0.3, 0), sharey=True)
        handles = {}
        for ax, model in zip(axes, family_list):
            for i, (recipe, optimizer) in enumerate(selected):
                mine = _pick(curves, model, recipe, optimizer)
                if not mine:
                    continue
                color = SELECTED_COLORS.get((recipe, optimizer), palette[i])
                lines(ax, mine, 1, colors=color, linewidths=0.8, alpha=0.3)
                lines(ax, mine, 2, colors=color, linewidths=2.0, alpha=0.95)
                handles[(recipe, optimizer)] = Line2D([], [], color=color, lw=2, label=recipe_label(recipe))
                at = points[
                    (points["model"] == model) & (points["recipe"] == recipe) & (points["optimizer"] == optimizer)
                ]
                if mark_collapses(ax, at):
                    handles["collapse"] = COLLAPSE_HANDLE
            curve_axes(ax, float(picked["update"].max()))
            ax.set_xlabel("Update")
            ax.set_title(family_title(model, models))
        axes[0].set_ylabel("Training success (%)")
        order = [k for k in selected if k in handles] + (["collapse"] if "collapse" in handles else [])
        legend(
            fig,
            [handles[k] for k in order]
            + [
                Line2D([], [], color=MUTED, lw=0.8, alpha=0.4, label="raw"),
                Line2D([], [], color=MUTED, lw=2, label=f"EMA (span {ema_span})"),
            ],
            ncol=None if len(family_list) > 1 else 3,
        )
    return fig


def figure_family(
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    family: str,
    models: Mapping[str, str] | None = None,
    ncols: int = 4,
    ema_span: int = EMA_SPAN,
) -> Figure:
    """Figures 4/5: every recipe of one paper model family, one panel each; Muon solid, Adam dashed.

    `metrics` must carry `success_ema` (`add_ema`); `ema_span` only labels the legend."""
    frame = metrics[metrics["model"].isin([m for m in metrics["model"].unique() if paper_model(m, models) == family])]
    recipes = ordered(frame["recipe"], list(FIGURE2_RECIPES))
    if not recipes:
        return empty(f"No runs of {family} (or a stand-in for it) in these logs")
    tiny = sorted(set(frame["model"]))
    curves, points = _curves(frame), _collapse_points(frame, runs)
    ncols = min(len(recipes), ncols)
    nrows = -(-len(recipes) // ncols)
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(nrows, ncols, (2.9, 2.1), (0.75, 0.15, 0.75, 1.0), (0.25, 0.55), sharex=True, sharey=True)
        for ax in axes[len(recipes) :]:
            fig.delaxes(ax)
        axes = axes[: len(recipes)]
        seen = []
        for ax, recipe in zip(axes, recipes):
            for optimizer in ordered(frame.loc[frame["recipe"] == recipe, "optimizer"], ["muon", "adam"]):
                mine = _pick(curves, None, recipe, optimizer)
                color = FULL if recipe == "full" else OPTIMIZER_COLORS.get(optimizer, MUTED)
                style = OPTIMIZER_STYLES.get(optimizer, ":")
                lines(ax, mine, 1, colors=color, linewidths=0.7, alpha=0.25, linestyles=style)
                lines(ax, mine, 2, colors=color, linewidths=1.8, alpha=0.95, linestyles=style)
                at = points[(points["recipe"] == recipe) & (points["optimizer"] == optimizer)]
                if mark_collapses(ax, at):
                    seen.append("collapse")
                seen.append(optimizer)
            curve_axes(ax, float(frame["update"].max()))
            ax.set_title(
                recipe_label(recipe),
                color=FULL if recipe == "full" else "black",
                fontweight="bold" if recipe == "full" else "normal",
                fontsize=10,
            )
        label_outer(axes, ncols)
        for ax in axes[::ncols]:
            ax.set_ylabel("Training success (%)")
        stand_in = f" (stand-in: {', '.join(tiny)})" if tiny != [family] else ""
        suptitle(fig, f"{family}{stand_in}: training success across recipes")
        handles = [
            Line2D([], [], color=OPTIMIZER_COLORS[o], ls=OPTIMIZER_STYLES[o], lw=1.8, label=o.capitalize())
            for o in ("muon", "adam")
            if o in seen
        ]
        handles += [
            Line2D([], [], color=FULL, lw=1.8, label="full recipe"),
            Line2D([], [], color=MUTED, lw=0.7, alpha=0.4, label="raw"),
            Line2D([], [], color=MUTED, lw=1.8, label=f"EMA (span {ema_span})"),
        ]
        legend(fig, handles + ([COLLAPSE_HANDLE] if "collapse" in seen else []))
    return fig


def diagnostic_quantiles(metrics: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Per (model, optimizer, update): 25th, 50th, 75th percentile over runs of each column, non-finite left out.

    Columns of the result: model, optimizer, update, and `<col>_q25`, `<col>_q50`, `<col>_q75`."""
    values = metrics[["model", "optimizer", "update", *columns]].copy()
    values[list(columns)] = values[list(columns)].astype(float).replace([np.inf, -np.inf], np.nan)
    grouped = values.groupby(["model", "optimizer", "update"], sort=True)[list(columns)]
    parts = [grouped.quantile(q / 100).add_suffix(f"_q{q}") for q in (25, 50, 75)]
    return pd.concat(parts, axis=1).reset_index()


def figure_diagnostics(
    metrics: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    panels: Sequence[tuple[str, str, bool]] = DIAGNOSTICS,
    ncols: int = 3,
) -> Figure:
    """Optimizer diagnostics over updates: median over runs and interquartile band, Adam against Muon."""
    columns = [c for c, _, _ in panels]
    missing = [c for c in columns if c not in metrics.columns]
    if missing:
        raise ValueError(f"figure_diagnostics: metrics lack column(s) {missing}")
    quantiles = diagnostic_quantiles(metrics, columns)
    model_list = ordered(quantiles["model"], list(models or {}))
    optimizer_list = ordered(quantiles["optimizer"], ["muon", "adam"])
    nrows = -(-len(panels) // ncols)
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(nrows, ncols, (3.4, 2.1), (0.7, 0.15, 0.7, 1.0), (0.75, 0.45), sharex=True)
        for ax in axes[len(panels) :]:
            fig.delaxes(ax)
        axes = axes[: len(panels)]
        for ax, (column, title, log) in zip(axes, panels):
            ax.set_title(title, fontsize=10)
            drawn = False
            for m, model in enumerate(model_list):
                for optimizer in optimizer_list:
                    q = quantiles[(quantiles["model"] == model) & (quantiles["optimizer"] == optimizer)]
                    drawn |= median_band(
                        ax,
                        q,
                        column,
                        ("q25", "q50", "q75"),
                        OPTIMIZER_COLORS.get(optimizer, MUTED),
                        LINE_STYLES[m % len(LINE_STYLES)],
                        band_gaps=True,
                    )
            if not drawn:
                ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="#777777")
            elif log and (quantiles[f"{column}_q25"].dropna() > 0).all():
                log_y(ax)
        label_outer(axes, ncols)
        suptitle(fig, "Optimizer diagnostics: median over runs per update")
        handles = [
            Line2D([], [], color=OPTIMIZER_COLORS.get(o, MUTED), lw=1.5, label=o.capitalize()) for o in optimizer_list
        ]
        handles += family_handles(model_list, models)
        handles.append(Patch(facecolor=MUTED, alpha=0.15, label="interquartile range over runs"))
        legend(fig, handles, ncol=min(len(handles), 3))
    return fig


# -- files -------------------------------------------------------------------------------------------------
def draw_figure(
    name: str,
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    ema_span: int = EMA_SPAN,
    paper: pd.DataFrame | None = None,
) -> Figure:
    """One of `FIGURES` by name; `metrics` must carry `success_ema` for the curve figures (`add_ema`)."""
    if name == "fig2":
        return figure_bars(runs, paper, models)
    if name == "fig3":
        return figure_selected(metrics, runs, models, ema_span=ema_span)
    if name in FAMILY_FIGURES:
        return figure_family(metrics, runs, FAMILY_FIGURES[name], models, ema_span=ema_span)
    if name == "diagnostics":
        return figure_diagnostics(metrics, models)
    raise ValueError(f"unknown figure {name!r}; known: {list(FIGURES)}")


def main_figures(
    names: Sequence[str],
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    ema_span: int = EMA_SPAN,
    paper: pd.DataFrame | None = None,
) -> tuple[list[str], Callable[[str], Figure]]:
    """The main study's figures (`names`, of FIGURES) from its logs and per-run table: notes for the log (what the
    grid lacks) and the function that draws one by name (trainer/analysis/pipeline.py writes them). ValueError
    for a runs table that is not these logs' (stale)."""
    check_same_runs(metrics, runs)
    metrics = add_ema(metrics, ema_span)
    present = {paper_model(m, models) for m in metrics["model"].unique()}
    notes = [
        f"{name}: no runs of {family} or a stand-in for it; the figure says so"
        for name, family in FAMILY_FIGURES.items()
        if name in names and family not in present
    ]
    absent = [r for r in FIGURE2_RECIPES if r not in set(metrics["recipe"])]
    if absent:
        notes.append(f"recipes not in these logs (left out of every figure): {', '.join(absent)}")
    return notes, lambda name: draw_figure(name, metrics, runs, models, ema_span, paper)
