"""A study of arms (the decisive comparisons): each grid block is a named variant of the trainer (an lr by role,
AdamW's betas, an off-policy rollout, ...), its cells in `.../optimizer=O/arm=A/seed=S/`.

Per run it reuses the main study's definitions (`summary.run_table`, called once per arm since its run key has
no arm: final window, last evaluation, the collapse verdict under the study's criterion) and the stability
study's held-out AUC. Added here, all fixed before any arm ran:

* **Step sizes by role**: per run, the median over its updates before the collapse (all of them when it did not
  collapse) of the hidden matrices' update RMS and top singular value (`update_rms`, `update_spectral_norm`), the
  same two for the AdamW-trained embedding/head matrices (`embed_head_*`), the KL per update (`approx_kl`), the
  PPO clip fraction (`clip_frac_low + clip_frac_high`), the TIS-truncated fraction of tokens, the gradient SNR
  (where measured) and the mini-batches whose advantages were all zero (`no_signal_steps`).
* **What predicts collapse** (E3): the same quantities measured early, as the median over the collapse rule's
  warm-up (its first `warmup` updates, in which no verdict can fire, so the predictor never sees the collapse
  it predicts), pooled over every run of the study whatever its optimizer ("one model for both optimizers").
  Each predictor's AUC is the probability that a collapsed run's early value exceeds a surviving run's (ties
  count half; the Mann-Whitney statistic): 1 = larger values separate collapsed runs perfectly, 0.5 = no
  information. NaN when every run collapsed or none did.

Per (model, recipe, optimizer, arm) the summary gives, in percent, final training success and held-out AUC (mean
over seeds, 95% Student-t interval as in the main summary), the last held-out success, collapsed
seeds, and the step sizes (median over seeds). Figures: `arms_curves` (training success per arm, each seed's
EMA, collapses marked, held-out evaluations as dots) and `arms_predictors` (each predictor's early value per run,
collapsed runs marked, with its AUC).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from trainer.analysis.cell_logs import ARM_RUN_KEYS, NONFINITE_COLUMNS
from trainer.analysis.collapse import CollapseCriterion, ema
from trainer.analysis.kinds import ARMS
from trainer.analysis.plotting import (
    COLLAPSE,
    COLLAPSE_HANDLE,
    MUTED,
    OPTIMIZER_COLORS,
    OPTIMIZER_LABELS,
    OPTIMIZER_STYLES,
    STYLE,
    curve_axes,
    empty,
    family_title,
    grid,
    legend,
    suptitle,
)
from trainer.analysis.registration import OUTCOMES, Preregistration
from trainer.analysis.summary import (
    WINDOW_FRACTION,
    ci_text,
    collapsed_text,
    markdown_head,
    ordered,
    pct,
    run_table,
    seed_stats,
    sort_rows,
    table_head,
    table_row,
)

STEP_COLUMNS: tuple[str, ...] = (
    "update_rms",
    "update_spectral_norm",
    "embed_head_update_rms",
    "embed_head_update_spectral_norm",
    "approx_kl",
    "clip_frac",
    "tis_truncated_frac",
    "grad_snr",
    "no_signal_steps",
)
"""The per-update quantities summarised per run (`clip_frac` is clip_frac_low + clip_frac_high; `grad_snr` only
where the study measures it, `run.grad_snr`)."""
PREDICTORS: tuple[str, ...] = ("update_rms", "update_spectral_norm", "embed_head_update_spectral_norm", "approx_kl")
"""The quantities tested as predictors of collapse and drawn in `arms_predictors`."""
LABELS = {
    "update_rms": "hidden update RMS",
    "update_spectral_norm": "hidden update top singular value",
    "embed_head_update_rms": "embed/head update RMS",
    "embed_head_update_spectral_norm": "embed/head update top singular value",
    "approx_kl": "KL per update",
    "clip_frac": "PPO clip fraction",
    "tis_truncated_frac": "TIS-truncated fraction",
    "grad_snr": "gradient SNR",
    "no_signal_steps": "no-signal mini-batches",
}
ARMS_COLUMNS: tuple[str, ...] = (
    "update",
    "success_rate",
    "n_trajectories",
    "eval_success",
    "entropy",
    "clip_frac_low",
    "clip_frac_high",
    *(c for c in STEP_COLUMNS if c != "clip_frac"),
    *NONFINITE_COLUMNS,
)
"""The metrics this analysis reads."""
ARMS_FIGURES: tuple[str, ...] = tuple(ARMS.figures)
KEYS = list(ARM_RUN_KEYS)


def _arm_metrics(metrics: pd.DataFrame) -> pd.DataFrame:
    if "arm" not in metrics.columns:
        raise ValueError("arms analysis: the cells' folders name no arm=...: give every grid block an `arm`")
    if "lr" in metrics.columns:
        raise ValueError("arms analysis: these cells' folders also name lr=...; an arm sets its own lr")
    frame = metrics.sort_values([*KEYS, "update"], kind="stable", ignore_index=True)
    if {"clip_frac_low", "clip_frac_high"} <= set(frame.columns):
        frame["clip_frac"] = frame["clip_frac_low"].astype(float) + frame["clip_frac_high"].astype(float)
    return frame


def auc(values: np.ndarray, collapsed: np.ndarray) -> float:
    """P(a collapsed run's value > a surviving run's value), ties counted half, over the runs whose value is
    finite; NaN unless both groups have a run."""
    values, collapsed = np.asarray(values, dtype=float), np.asarray(collapsed, dtype=bool)
    ok = np.isfinite(values)
    hit, miss = values[ok & collapsed], values[ok & ~collapsed]
    if len(hit) == 0 or len(miss) == 0:
        return math.nan
    greater = (hit[:, None] > miss[None, :]).sum() + 0.5 * (hit[:, None] == miss[None, :]).sum()
    return float(greater / (len(hit) * len(miss)))


# -- per run -----------------------------------------------------------------------------------------------
def arm_order(metrics_paths: Sequence[str | os.PathLike]) -> list[str]:
    """The arms in the order their cells' folders are listed (the workflow lists them in the grid's order)."""
    return list(
        dict.fromkeys(
            part.split("=", 1)[1] for path in metrics_paths for part in Path(path).parts if part.startswith("arm=")
        )
    )


def arms_run_table(
    metrics: pd.DataFrame,
    criterion: CollapseCriterion | None = None,
    window_fraction: float = WINDOW_FRACTION,
    models: Mapping[str, str] | None = None,
    arms: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per run (fractions): `summary.run_table`'s columns per arm (`arm` before `seed`), `heldout_auc`,
    and per step quantity its median before the collapse (`<col>`) and over the warm-up (`early_<col>`). Rows by
    model, then arm in the order of `arms` (others after them, sorted)."""
    criterion = CollapseCriterion() if criterion is None else criterion
    frame = _arm_metrics(metrics)
    if len(frame) == 0:
        raise ValueError("arms_run_table: the metrics table is empty")
    parts = [
        run_table(part.drop(columns="arm"), criterion, window_fraction, models).assign(arm=arm)
        for arm, part in frame.groupby("arm", sort=False)
    ]
    runs = pd.concat(parts, ignore_index=True)
    verdicts = runs.set_index(KEYS)["collapse_update"]
    extras = []
    for key, run in frame.groupby(KEYS, sort=False):
        row = dict(zip(KEYS, key))
        evals = run["eval_success"].dropna().to_numpy(dtype=float) if "eval_success" in run else np.array([])
        row["heldout_auc"] = float(evals.mean()) if len(evals) else math.nan
        stop = verdicts.loc[key]
        before = run if pd.isna(stop) else run[run["update"] < stop]
        early = before.iloc[: max(1, criterion.warmup)]  # a non-finite verdict has no warm-up
        for column in STEP_COLUMNS:
            if column in run.columns:
                row[column] = float(before[column].median()) if before[column].notna().any() else math.nan
                row[f"early_{column}"] = float(early[column].median()) if early[column].notna().any() else math.nan
        extras.append(row)
    runs = runs.merge(pd.DataFrame(extras), on=KEYS, how="left")
    runs = runs[[*KEYS, *(c for c in runs.columns if c not in KEYS)]]
    return sort_arms(runs, models, arms, extra=("seed",))


def sort_arms(
    frame: pd.DataFrame, models: Mapping[str, str] | None = None, arms: Sequence[str] = (), extra: Sequence[str] = ()
) -> pd.DataFrame:
    """Rows by model (as in `models`), then arm (as in `arms`), then `extra`."""
    return sort_rows(
        frame, {"model": ordered(frame["model"], list(models or {})), "arm": ordered(frame["arm"], list(arms))}, extra
    )


# -- tables ------------------------------------------------------------------------------------------------
def arms_summary_table(
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per model x recipe x optimizer x arm: success in percent (mean over seeds, t interval),
    collapsed seeds, and each step quantity's median over the seeds. Rows in the order of `runs`."""
    rows = []
    for (model, recipe, optimizer, arm), cell in runs.groupby(KEYS[:4], sort=False):
        cell = cell.sort_values("seed")
        final, final_low, final_high = seed_stats(cell, "window_success", level)
        area, auc_low, auc_high = seed_stats(cell, "heldout_auc", level)
        collapsed = cell["collapsed"].astype(bool)
        row = {
            "model": model,
            "paper_model": cell["paper_model"].iloc[0],
            "recipe": recipe,
            "optimizer": optimizer,
            "arm": arm,
            "n_seeds": len(cell),
            "seeds": ",".join(map(str, cell["seed"])),
            "final_pct_mean": final,
            "final_pct_ci_low": final_low,
            "final_pct_ci_high": final_high,
            "auc_pct_mean": area,
            "auc_pct_ci_low": auc_low,
            "auc_pct_ci_high": auc_high,
            "heldout_last_pct_mean": seed_stats(cell, "eval_success", level)[0],
            "n_collapsed": int(collapsed.sum()),
            "collapsed_seeds": ",".join(str(s) for s in cell.loc[collapsed, "seed"]),
            "n_degraded": int(cell["degraded"].sum()) if "degraded" in cell else 0,
        }
        for column in STEP_COLUMNS:
            if column in cell.columns:
                row[column] = float(cell[column].median())
        rows.append(row)
    return pd.DataFrame(rows)


def predictor_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per predictor: runs with a value, collapsed among them, the pooled AUC (both optimizers as one model), the
    median early value of the collapsed and of the surviving runs, and the same question asked of arms: the rank
    correlation, over the study's arms (model x recipe x arm), between an arm's median early value and its mean final
    success (`arm_spearman`, with its exact permutation p-value `arm_p`, two-sided). The run-level AUC counts a
    study's seeds of one arm as independent evidence; they share the arm's settings, so the arm-level correlation is
    the mechanism's test, with as many units as arms."""
    collapsed = runs["collapsed"].to_numpy(dtype=bool)
    rows = []
    for column in PREDICTORS:
        values = (
            runs[f"early_{column}"].to_numpy(dtype=float) if f"early_{column}" in runs else np.full(len(runs), np.nan)
        )
        ok = np.isfinite(values)
        arms = (
            runs.assign(early=values)
            .groupby(["model", "recipe", "arm"], sort=False)
            .agg(early=("early", "median"), final=("window_success", "mean"))
        )
        rho, p = arm_rank_correlation(arms["early"].to_numpy(), arms["final"].to_numpy())
        rows.append(
            {
                "predictor": column,
                "n_runs": int(ok.sum()),
                "n_collapsed": int((ok & collapsed).sum()),
                "auc": auc(values, collapsed),
                "median_collapsed": float(np.median(values[ok & collapsed])) if (ok & collapsed).any() else math.nan,
                "median_survived": float(np.median(values[ok & ~collapsed])) if (ok & ~collapsed).any() else math.nan,
                "n_arms": int(arms.dropna().shape[0]),
                "arm_spearman": rho,
                "arm_p": p,
            }
        )
    return pd.DataFrame(rows)


def arm_rank_correlation(early: np.ndarray, final: np.ndarray, resamples: int = 20_000) -> tuple[float, float]:
    """Spearman's rho between the arms' early values and final success, and its two-sided permutation p-value
    (exact over every ordering up to 8 arms, `resamples` random ones beyond); NaN below 3 arms or without spread."""
    from scipy.stats import rankdata

    ok = np.isfinite(early) & np.isfinite(final)
    x, y = rankdata(early[ok]), rankdata(final[ok])
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan
    x, y = x - x.mean(), y - y.mean()
    scale = math.sqrt((x * x).sum() * (y * y).sum())
    rho = float(x @ y / scale)
    if len(y) <= 8:
        orderings = np.array(list(itertools.permutations(y)))
    else:
        rng = np.random.default_rng(0)
        orderings = np.array([rng.permutation(y) for _ in range(resamples)])
    null = orderings @ x / scale
    return rho, float(np.mean(np.abs(null) >= abs(rho) - 1e-12))


def _g(value: float) -> str:
    return "–" if not np.isfinite(value) else f"{value:.2g}"


def arms_markdown(
    summary: pd.DataFrame,
    predictors: pd.DataFrame,
    warmup: int,
    notes: Sequence[str] = (),
    window_fraction: float = WINDOW_FRACTION,
) -> str:
    """The summary as a Markdown page: method, notes, every arm, then the predictors of collapse."""
    method = (
        f"Final = mean unsmoothed training success over the last {window_fraction:.0%} of each run's updates; "
        "held-out AUC = mean of every held-out evaluation of the run; last held-out = the final evaluation. "
        "In percent, averaged over seeds; interval = 95% Student-t over seeds (n/a with one seed). "
        "Collapse = the rule in `trainer/analysis/collapse.py`. Step sizes: per run the median over its "
        "updates before the collapse, then the median over seeds; hidden = Muon's or AdamW's hidden matrices, "
        "embed/head = the AdamW-trained embedding and head matrices. Predictors: each run's median over the "
        f"collapse rule's warm-up (updates 0-{warmup - 1}, before any verdict can fire), every run pooled; AUC "
        "= P(a collapsed run's value > a surviving run's), 0.5 = no information."
    )
    lines = markdown_head("Arms", method, notes)
    lines += [
        "## Every arm",
        "",
        *table_head(
            [
                "model",
                "arm",
                "recipe",
                "optimizer",
                "seeds",
                "final %",
                "95% CI",
                "held-out AUC %",
                "95% CI",
                "last held-out %",
                "collapsed",
                "hidden RMS",
                "hidden top SV",
                "embed/head top SV",
                "KL",
                "clip",
                "TIS trunc.",
                "grad SNR",
                "no-signal",
            ]
        ),
    ]
    for row in summary.itertuples(index=False):
        lines.append(
            table_row(
                [
                    row.model,
                    row.arm,
                    row.recipe,
                    row.optimizer,
                    str(row.n_seeds),
                    pct(row.final_pct_mean),
                    ci_text(row.final_pct_ci_low, row.final_pct_ci_high),
                    pct(row.auc_pct_mean),
                    ci_text(row.auc_pct_ci_low, row.auc_pct_ci_high),
                    pct(row.heldout_last_pct_mean),
                    collapsed_text(row),
                    *(
                        _g(getattr(row, c, math.nan))
                        for c in (
                            "update_rms",
                            "update_spectral_norm",
                            "embed_head_update_spectral_norm",
                            "approx_kl",
                            "clip_frac",
                            "tis_truncated_frac",
                            "grad_snr",
                            "no_signal_steps",
                        )
                    ),
                ]
            )
        )
    lines += [
        "",
        "## What predicts collapse",
        "",
        *table_head(
            [
                "predictor",
                "runs",
                "collapsed",
                "AUC (runs)",
                "median, collapsed",
                "median, survived",
                "arms",
                "rank corr. with final (arms)",
                "p (arms)",
            ]
        ),
    ]
    for row in predictors.itertuples(index=False):
        lines.append(
            table_row(
                [
                    LABELS[row.predictor],
                    str(row.n_runs),
                    str(row.n_collapsed),
                    "–" if not np.isfinite(row.auc) else f"{row.auc:.2f}",
                    _g(row.median_collapsed),
                    _g(row.median_survived),
                    str(row.n_arms),
                    "–" if not np.isfinite(row.arm_spearman) else f"{row.arm_spearman:+.2f}",
                    "–" if not np.isfinite(row.arm_p) else f"{row.arm_p:.2g}",
                ]
            )
        )
    return "\n".join(lines) + "\n"


def hypotheses_markdown(table: pd.DataFrame, registration: Preregistration) -> str:
    """The preregistration's hypotheses as judged: registered ones first, then any post-hoc ones, so a claim
    added after the results cannot pass for a registered one."""
    correction = "Holm-corrected over the registered primary ones" if registration.correction == "holm" else "none"
    lines = [
        "",
        "## Pre-registered hypotheses",
        "",
        f"Registered {registration.registered}. Primary outcome: {OUTCOMES[registration.outcome]}; alpha "
        f"{registration.alpha} two-sided, {correction}. Unit: the base policy (its seeds averaged first); a "
        "contrast is a paired t over bases, an interaction Welch's t over two sets of bases. In points; MDE = the "
        "difference the test finds with 80% power: a 'not shown' cannot exclude an effect below it.",
        "",
        *table_head(["", "status", "outcome", "contrast", "units", "estimate", "95% CI", "p (adj.)", "MDE", "verdict"]),
    ]
    for status in ("registered", "post hoc"):
        for row in table[table["status"] == status].itertuples(index=False):
            lines.append(
                table_row(
                    [
                        row.hypothesis,
                        status + ("" if row.role == "primary" else ", secondary"),
                        row.outcome,
                        row.contrast,
                        row.units,
                        f"{row.estimate_pts:+.1f}",
                        ci_text(row.ci_low_pts, row.ci_high_pts),
                        "–" if not np.isfinite(row.p) else f"{row.p:.3g} ({row.p_adjusted:.3g})",
                        _g(row.mde_pts),
                        row.verdict,
                    ]
                )
            )
    lines += ["", *(f"- {h.name}{' (post hoc)' if h.post_hoc else ''}: {h.claim}" for h in registration.hypotheses)]
    return "\n".join(lines) + "\n"


# -- figures -----------------------------------------------------------------------------------------------
def _arm_color(optimizer: str) -> str:
    return OPTIMIZER_COLORS.get(optimizer, MUTED)


def figure_curves(
    metrics: pd.DataFrame,
    runs: pd.DataFrame,
    models: Mapping[str, str] | None = None,
    ema_span: int = 5,
    max_cols: int = 6,
) -> Figure:
    """One panel per model x recipe x arm (a row per model and recipe, a column per arm where they fit): each
    seed's training-success EMA, collapses as red crosses, held-out evaluations as dots."""
    frame = _arm_metrics(metrics)
    if frame.empty:
        return empty("arms: no runs in these logs")
    frame["success_ema"] = frame.groupby(KEYS, sort=False)["success_rate"].transform(lambda s: ema(s, ema_span))
    panels = list(dict.fromkeys(zip(runs["model"], runs["recipe"], runs["arm"])))
    arms = list(dict.fromkeys(runs["arm"]))
    rows = list(dict.fromkeys((m, r) for m, r, _ in panels))
    crossed = len(panels) == len(rows) * len(arms)  # every arm in every row: a table of panels
    ncols = len(arms) if crossed and len(arms) <= max_cols else min(3, len(panels))
    many_rows = len(rows) > 1
    one_model = len({m for m, _ in rows}) == 1
    with matplotlib.rc_context(STYLE):
        nrows = len(rows) if crossed and ncols == len(arms) else -(-len(panels) // ncols)
        fig, axes = grid(nrows, ncols, (2.6, 1.9), (0.75, 0.15, 0.75, 1.0), (0.25, 0.6), sharex=True, sharey=True)
        if crossed and ncols == len(arms):  # row = model and recipe, column = arm
            at = {(m, r, a): axes[rows.index((m, r)) * ncols + arms.index(a)] for m, r, a in panels}
        else:
            at = dict(zip(panels, axes))
        for ax in set(axes) - set(at.values()):
            fig.delaxes(ax)
        seen: set[str] = set()
        for (model, recipe, arm), ax in at.items():
            mine = frame[(frame["model"] == model) & (frame["recipe"] == recipe) & (frame["arm"] == arm)]
            for (optimizer, seed), run in mine.groupby(["optimizer", "seed"], sort=True):
                color, style = _arm_color(optimizer), OPTIMIZER_STYLES.get(optimizer, ":")
                ax.plot(run["update"], 100 * run["success_ema"], color=color, ls=style, lw=1.4, alpha=0.9)
                evals = run.dropna(subset=["eval_success"])
                ax.scatter(
                    evals["update"], 100 * evals["eval_success"], s=10, color=color, alpha=0.6, linewidth=0, zorder=4
                )
                seen.add(optimizer)
                verdict = runs[
                    (runs["model"] == model)
                    & (runs["recipe"] == recipe)
                    & (runs["arm"] == arm)
                    & (runs["optimizer"] == optimizer)
                    & (runs["seed"] == seed)
                ]
                for stop in verdict["collapse_update"].dropna():
                    point = run[run["update"] == stop]
                    ax.scatter(
                        point["update"],
                        100 * point["success_ema"],
                        marker="X",
                        s=55,
                        color=COLLAPSE,
                        edgecolor="white",
                        linewidth=0.6,
                        zorder=5,
                    )
                    seen.add("collapse")
            curve_axes(ax, float(frame["update"].max()))
            ax.set_title(arm if one_model or crossed else f"{model}: {arm}", fontsize=8.5)
        placed = [ax for ax in axes if ax in set(at.values())]
        for ax in placed:
            below = [
                other
                for other in placed
                if other is not ax
                and abs(other.get_position().x0 - ax.get_position().x0) < 1e-6
                and other.get_position().y0 < ax.get_position().y0
            ]
            ax.xaxis.set_tick_params(labelbottom=not below)
            ax.set_xlabel("" if below else "Update")
        by_axis = {ax: key for key, ax in at.items()}
        for ax in axes[::ncols]:
            if ax in placed:  # in a table of panels the row's recipe (and model, if several) labels its first axis
                model, recipe, _ = by_axis[ax]
                row = (recipe if one_model else f"{model}, {recipe}") if crossed and many_rows else ""
                ax.set_ylabel(f"{row}\nTraining success (%)" if row else "Training success (%)")
        only = f": {family_title(rows[0][0], models)}" if one_model else ""
        suptitle(fig, f"Training success per arm{only}")
        handles = [
            Line2D(
                [],
                [],
                color=_arm_color(o),
                ls=OPTIMIZER_STYLES.get(o, ":"),
                lw=1.4,
                label=f"{OPTIMIZER_LABELS.get(o, o)}: a seed's EMA (span {ema_span})",
            )
            for o in ordered(seen - {"collapse"}, ["muon", "adam", "adam_high_lr"])
        ]
        handles.append(Line2D([], [], marker="o", ls="", color=MUTED, alpha=0.6, markersize=3, label="held-out"))
        legend(fig, handles + ([COLLAPSE_HANDLE] if "collapse" in seen else []), ncol=min(4, len(handles) + 1))
    return fig


def figure_predictors(runs: pd.DataFrame, predictors: pd.DataFrame) -> Figure:
    """One panel per predictor: each run's early value (log x) against its final training success, colour by
    optimizer, collapsed runs as red crosses, the pooled AUC in the title."""
    if runs.empty:
        return empty("arms: no runs in these logs")
    with matplotlib.rc_context(STYLE):
        fig, axes = grid(1, len(PREDICTORS), (2.6, 2.3), (0.75, 0.15, 0.75, 1.05), (0.45, 0.5), sharey=True)
        for ax, column in zip(axes, PREDICTORS):
            x = runs.get(f"early_{column}", pd.Series(np.nan, index=runs.index)).to_numpy(dtype=float)
            y = 100 * runs["window_success"].to_numpy(dtype=float)
            dead = runs["collapsed"].to_numpy(dtype=bool)
            ok = np.isfinite(x) & (x > 0)
            hidden = int((np.isfinite(x) & (x <= 0)).sum())  # verl's k1 KL estimate can be <= 0: no log place
            if hidden:
                ax.text(
                    0.02,
                    0.02,
                    f"{hidden} run{'s' * (hidden > 1)} <= 0 not shown",
                    transform=ax.transAxes,
                    fontsize=6,
                    color=MUTED,
                )
            for optimizer in ordered(runs["optimizer"], ["muon", "adam", "adam_high_lr"]):
                mine = ok & (runs["optimizer"] == optimizer).to_numpy() & ~dead
                ax.scatter(x[mine], y[mine], s=16, color=_arm_color(optimizer), alpha=0.8, linewidth=0, zorder=4)
                mine = ok & (runs["optimizer"] == optimizer).to_numpy() & dead
                ax.scatter(
                    x[mine],
                    y[mine],
                    marker="X",
                    s=45,
                    color=COLLAPSE,
                    edgecolor=_arm_color(optimizer),
                    linewidth=0.8,
                    zorder=5,
                )
            if ok.any():
                ax.set_xscale("log")
                ax.set_xlim(x[ok].min() / 2, x[ok].max() * 2)  # a decade at least: ticks at 1, 2, 5
                ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0e}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
                ax.tick_params(axis="x", labelsize=7, labelrotation=30)
            value = predictors.loc[predictors["predictor"] == column, "auc"]
            area = float(value.iloc[0]) if len(value) else math.nan
            ax.set_title(f"{LABELS[column]}\nAUC {'–' if not np.isfinite(area) else f'{area:.2f}'}", fontsize=9)
            ax.set_xlabel("median over the warm-up", fontsize=8)
            ax.set_ylim(-2, 102)
        axes[0].set_ylabel("Final training success (%)")
        suptitle(fig, "What predicts collapse (every run, both optimizers pooled)")
        handles = [
            Line2D([], [], marker="o", ls="", color=_arm_color(o), markersize=5, label=OPTIMIZER_LABELS.get(o, o))
            for o in ordered(runs["optimizer"], ["muon", "adam", "adam_high_lr"])
        ]
        legend(
            fig,
            handles
            + [
                Line2D(
                    [],
                    [],
                    marker="X",
                    ls="",
                    color=COLLAPSE,
                    markersize=7,
                    markeredgecolor=MUTED,
                    label="collapsed run",
                )
            ],
        )
    return fig
