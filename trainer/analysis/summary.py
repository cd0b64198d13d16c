"""Per-run verdicts and window means, and the model x recipe x optimizer table beside the paper's Figure 2.

Choices and why:

* **The window is the last tenth of a run's logged updates**, `k = max(1, ceil(n * window_fraction))` rows by
  `update`: for the paper's 100 updates, the trainer's 0-based updates 90..99, which are the paper's
  "updates 90-100". It is computed per run from the number of updates that run logged, so a smoke run of 3
  updates uses its last update alone (never an empty window). The run's score is the mean of the raw
  (unsmoothed) `success_rate` over the window, as the paper's bars are ("Bars summarize unsmoothed training
  success rates").
* **Percent.** The trainer logs success as a fraction; the paper reports percent. The summary is in percent,
  the per-run table keeps fractions (it is the trainer's scale, and the plots rescale).
* **Interval over seeds: Student's t interval of the mean**, 95%, n - 1 degrees of freedom
  (`statistics.t_interval`). The percentile bootstrap used before resamples the 2-3 seeds themselves and so
  ignores how poorly they estimate the spread: with normal data its nominal 95% covers the mean about 75% of the
  time at 3 seeds and half at 2; the t interval covers 95% (tests/unit/test_statistics.py). It needs no random draws,
  so a cell's interval depends on its seeds alone. One seed has no interval (NaN in the CSV, "n/a" in the
  Markdown), rather than a fake zero-width one. Figure 2 draws these same numbers, so figure and table cannot
  disagree.
* **Held-out success** is each run's last evaluated `eval_success` (the trainer always evaluates after the
  final update when evaluation is on), averaged over the seeds that have one; blank where none was evaluated.
* **The paper's numbers** ship with the package (`paper_numbers.csv`, from Figure 2 of Ruan et al. 2026, one
  row per model and recipe with its own optimizer, with its source note); the workflow passes the file as the
  rules' declared input. They are matched on the paper's model name, recipe and optimizer; a cell the paper
  did not run (an Adam version of an ablation, say) has no paper number and no difference.
* **The collapse rule's false-positive rate** is stated beside the collapse counts (`collapse_note`): with 4 to
  16 episodes per update, a run of constant success is flagged by binomial noise alone often enough (over a
  quarter of runs at some settings) that a count means little without it. It is simulated (`calibration.py`)
  at the study's median `n_trajectories` and logged updates, so no workflow parameter is needed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainer.analysis import calibration
from trainer.analysis.cell_logs import NONFINITE_COLUMNS, RUN_KEYS, load_metrics, paper_model, run_keys
from trainer.analysis.collapse import CollapseCriterion, degraded, ema_by_run, judge, nonfinite_flags
from trainer.analysis.config import WINDOW_FRACTION
from trainer.analysis.kinds import PAPER_NUMBERS
from trainer.analysis.statistics import t_interval
from trainer.recipes import FIGURE2_RECIPES, RECIPES

SUMMARY_COLUMNS = (
    "update",
    "success_rate",
    "eval_success",
    "entropy",
    "baseline_informed_frac",
    "cheat_rate",
    "tamper_rate",
    "n_trajectories",
    *NONFINITE_COLUMNS,
)
"""The metrics `summarize` reads (window means, held-out success, every collapse rule)."""

CELL_KEYS: tuple[str, ...] = ("model", "recipe", "optimizer")
"""The keys of one cell of the grid (a run is a cell plus a seed)."""

LEARNING_FRACTION = 0.2
"""Learning = mean training success over the last fifth of a run's updates minus over its first fifth."""


def native_optimizer(recipe: str) -> str | None:
    """The optimizer a paper recipe names (spo_adam -> adam, the rest -> muon); None for an unknown recipe."""
    return RECIPES[recipe]["optim"]["name"] if recipe in RECIPES else None


def ordered(values: Iterable[str], order: Sequence[str]) -> list[str]:
    """The distinct `values`, those in `order` first in that order, the rest after them sorted."""
    values = set(values)
    return [v for v in order if v in values] + sorted(v for v in values if v not in order)


def window_size(n_updates: int, fraction: float) -> int:
    """How many final updates form the window: max(1, ceil(n_updates * fraction)) (10 of 100 at 0.1)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"window_fraction must be in (0, 1], got {fraction!r}")
    if n_updates < 1:
        raise ValueError(f"a run needs at least one update for a window, got n_updates={n_updates!r}")
    # The 1e-9 keeps 100 * 0.1 (or 30 * 0.1 = 3.0000000000000004) from rounding up to one update too many.
    return max(1, math.ceil(n_updates * fraction - 1e-9))


def run_bounds(frame: pd.DataFrame) -> list[tuple[tuple, int, int]]:
    """(run key, first row, end row) of each run in a frame sorted by run and update (rows contiguous)."""
    codes = frame.groupby(list(RUN_KEYS), sort=False).ngroup().to_numpy()
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[starts[1:], len(codes)]
    keys = frame[list(RUN_KEYS)].iloc[starts].itertuples(index=False, name=None)
    return list(zip(keys, starts.tolist(), ends.tolist()))


def run_table(
    metrics: pd.DataFrame,
    criterion: CollapseCriterion | None = None,
    window_fraction: float = WINDOW_FRACTION,
    models: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One row per run: its window, window mean success, final held-out success and collapse verdict.

    `metrics` is `load_metrics`' table. Columns: the run keys, `paper_model`, `n_updates`, `window_first`,
    `window_last` (logged updates), `window_success` (fraction), `eval_success` and `eval_update` (the last
    evaluation), `eval_first` (the first, when there are two or more), `gain` (the learning: last fifth of the
    updates minus the first fifth, `LEARNING_FRACTION`), `informed_frac` (share of episodes whose SPO baseline came
    from data), `cheat_frac` (the cheating probe's mean success on impossible tasks over the evaluations; NaN
    where none ran), `tamper_frac` (the mean share of training episodes with tamper flags; NaN where not graded),
    `collapsed`, `collapse_update` (nullable Int64), `collapse_reason`. The collapse verdict is
    `detect_collapse`'s, computed here on arrays for all runs at once (one grouped EMA, then numpy per run).
    """
    criterion = CollapseCriterion() if criterion is None else criterion
    missing = [c for c in (*RUN_KEYS, "update", "success_rate") if c not in metrics.columns]
    if missing:
        raise ValueError(f"run_table: metrics table lacks column(s) {missing}")
    if len(metrics) == 0:
        raise ValueError("run_table: the metrics table is empty")
    frame = metrics.sort_values([*RUN_KEYS, "update"], kind="stable", ignore_index=True)
    smoothed = ema_by_run(frame, criterion.ema_span)
    update = frame["update"].to_numpy(dtype=np.int64)
    success = frame["success_rate"].to_numpy(dtype=float)
    evals = frame["eval_success"].to_numpy(dtype=float) if "eval_success" in frame.columns else None
    entropy = frame["entropy"].to_numpy(dtype=float) if "entropy" in frame.columns else None
    informed = (
        frame["baseline_informed_frac"].to_numpy(dtype=float) if "baseline_informed_frac" in frame.columns else None
    )
    cheat = frame["cheat_rate"].to_numpy(dtype=float) if "cheat_rate" in frame.columns else None
    tamper = frame["tamper_rate"].to_numpy(dtype=float) if "tamper_rate" in frame.columns else None
    batch = frame["n_trajectories"].to_numpy(dtype=float) if "n_trajectories" in frame.columns else None
    flags = nonfinite_flags(frame, criterion.nonfinite)
    rows = []
    for key, a, b in run_bounds(frame):
        n = b - a
        w = b - window_size(n, window_fraction)
        fifth = window_size(n, LEARNING_FRACTION)
        if np.isnan(success[w:b]).all():
            raise ValueError(
                f"run {dict(zip(RUN_KEYS, key))}: no success_rate logged in its final window "
                f"(updates {update[w]}..{update[b - 1]})"
            )
        evaluated = np.flatnonzero(~np.isnan(evals[a:b])) if evals is not None else np.array([], dtype=int)
        index, reason = judge(
            smoothed[a:b], {c: f[a:b] for c, f in flags.items()}, None if entropy is None else entropy[a:b], criterion
        )
        rows.append(
            {
                **dict(zip(RUN_KEYS, key)),
                "paper_model": paper_model(key[0], models),
                "n_updates": n,
                "window_first": int(update[w]),
                "window_last": int(update[b - 1]),
                "window_success": float(np.nanmean(success[w:b])),
                "eval_success": float(evals[a + evaluated[-1]]) if len(evaluated) else np.nan,
                "eval_update": int(update[a + evaluated[-1]]) if len(evaluated) else None,
                "eval_first": float(evals[a + evaluated[0]]) if len(evaluated) > 1 else np.nan,
                "gain": float(np.nanmean(success[b - fifth : b]) - np.nanmean(success[a : a + fifth])),
                "informed_frac": (
                    float(np.nanmean(informed[a:b]))
                    if informed is not None and not np.isnan(informed[a:b]).all()
                    else np.nan
                ),
                "cheat_frac": (
                    float(np.nanmean(cheat[a:b])) if cheat is not None and not np.isnan(cheat[a:b]).all() else np.nan
                ),
                "tamper_frac": (
                    float(np.nanmean(tamper[a:b])) if tamper is not None and not np.isnan(tamper[a:b]).all() else np.nan
                ),
                "collapsed": index is not None,
                "collapse_update": None if index is None else int(update[a + index]),
                "collapse_reason": reason,
                "batch": (
                    float(np.nanmedian(batch[a:b])) if batch is not None and not np.isnan(batch[a:b]).all() else np.nan
                ),
            }
        )
    runs = pd.DataFrame(rows)
    runs["degraded"] = degraded(runs["gain"], runs.pop("batch"), runs["n_updates"])
    runs["eval_update"] = runs["eval_update"].astype("Int64")
    runs["collapse_update"] = runs["collapse_update"].astype("Int64")
    runs["collapse_reason"] = runs["collapse_reason"].astype(object)
    return sort_cells(runs, models, extra=("seed",))


def sort_rows(frame: pd.DataFrame, order: Mapping[str, Sequence | None], extra: Sequence[str] = ()) -> pd.DataFrame:
    """`frame` sorted (stably) by each column of `order`, by position in its sequence (values not in it last) or,
    where None, by value; then by the `extra` columns' values."""
    key = pd.DataFrame(index=frame.index)
    for column, values in order.items():
        key[column] = frame[column] if values is None else frame[column].map({v: i for i, v in enumerate(values)})
    for column in extra:
        key[column] = frame[column]
    return frame.loc[key.sort_values(list(key.columns), kind="stable").index].reset_index(drop=True)


def sort_cells(frame: pd.DataFrame, models: Mapping[str, str] | None = None, extra: Sequence[str] = ()) -> pd.DataFrame:
    """Rows in reading order: models as in `models`, recipes in Figure 2 order, optimizers by name, then `extra`."""
    return sort_rows(
        frame,
        {
            "model": ordered(frame["model"], list(models or {})),
            "recipe": ordered(frame["recipe"], list(FIGURE2_RECIPES)),
            "optimizer": None,
        },
        extra,
    )


def seed_stats(cell: pd.DataFrame, column: str, level: float = 0.95) -> tuple[float, float, float]:
    """Mean (percent) of `column` over the seeds where it is not NaN, and its Student-t interval."""
    values = 100 * cell[column].dropna().to_numpy(dtype=float)
    low, high = t_interval(values, level)
    return (float(values.mean()) if len(values) else math.nan), low, high


def read_numbers(path: str | os.PathLike, needed: Sequence[str], what: str) -> pd.DataFrame:
    """A reference-numbers CSV, ValueError naming the file and the columns it lacks of `needed`."""
    table = pd.read_csv(path)
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: {what} lack column(s) {missing}")
    return table


def load_paper_numbers(path: str | os.PathLike = PAPER_NUMBERS) -> pd.DataFrame:
    """The paper's Figure 2 table: model (paper name), recipe, optimizer, value (percent), source, source_note."""
    paper = read_numbers(
        path, ["source", "model", "recipe", "optimizer", "success_updates_90_100_pct", "source_note"], "paper numbers"
    )
    if paper.duplicated(list(CELL_KEYS)).any():
        raise ValueError(f"{path}: more than one paper number for a (model, recipe, optimizer)")
    return paper


def summary_table(
    runs: pd.DataFrame,
    paper: pd.DataFrame | None = None,
    models: Mapping[str, str] | None = None,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per model x recipe x optimizer: ours (percent) with interval, seeds, collapses, paper, difference."""
    paper = load_paper_numbers() if paper is None else paper
    paper_index = paper.set_index(list(CELL_KEYS))
    rows = []
    for (model, recipe, optimizer), cell in runs.groupby(list(CELL_KEYS), sort=False):
        cell = cell.sort_values("seed")
        success = 100 * cell["window_success"].to_numpy(dtype=float)
        low, high = t_interval(success, level)
        evaluated = cell["eval_success"].dropna()
        gain = 100 * cell["gain"].to_numpy(dtype=float) if "gain" in cell.columns else np.full(len(cell), np.nan)
        gain_low, gain_high = t_interval(gain, level) if np.isfinite(gain).all() else (math.nan, math.nan)
        first = cell["eval_first"].dropna() if "eval_first" in cell.columns else pd.Series(dtype=float)
        name = cell["paper_model"].iloc[0] if "paper_model" in cell.columns else paper_model(model, models)
        key = (name, recipe, optimizer)
        ours = float(success.mean())
        theirs = float(paper_index.loc[key, "success_updates_90_100_pct"]) if key in paper_index.index else math.nan
        rows.append(
            {
                "model": model,
                "paper_model": name,
                "recipe": recipe,
                "optimizer": optimizer,
                "n_seeds": len(cell),
                "seeds": ",".join(str(s) for s in cell["seed"]),
                "success_pct_mean": ours,
                "success_pct_ci_low": low,
                "success_pct_ci_high": high,
                "n_collapsed": int(cell["collapsed"].sum()),
                "collapsed_seeds": ",".join(str(s) for s in cell.loc[cell["collapsed"], "seed"]),
                "n_degraded": int(cell["degraded"].sum()) if "degraded" in cell else 0,
                "paper_success_pct": theirs,
                "diff_pct_points": ours - theirs,
                "eval_success_pct_mean": 100 * float(evaluated.mean()) if len(evaluated) else math.nan,
                "n_eval_seeds": len(evaluated),
                "gain_pct_mean": float(gain.mean()),
                "gain_pct_ci_low": gain_low,
                "gain_pct_ci_high": gain_high,
                "eval_first_pct_mean": 100 * float(first.mean()) if len(first) else math.nan,
                "informed_pct_mean": (
                    100 * float(cell["informed_frac"].mean())
                    if "informed_frac" in cell.columns and cell["informed_frac"].notna().any()
                    else math.nan
                ),
                "cheat_pct_mean": (
                    100 * float(cell["cheat_frac"].mean())
                    if "cheat_frac" in cell.columns and cell["cheat_frac"].notna().any()
                    else math.nan
                ),
                "tamper_pct_mean": (
                    100 * float(cell["tamper_frac"].mean())
                    if "tamper_frac" in cell.columns and cell["tamper_frac"].notna().any()
                    else math.nan
                ),
                "paper_source": (
                    f"{paper_index.loc[key, 'source']}: {paper_index.loc[key, 'source_note']}"
                    if key in paper_index.index
                    else ""
                ),
            }
        )
    return sort_cells(pd.DataFrame(rows), models)


# -- Markdown ----------------------------------------------------------------------------------------------
def pct(value: float, sign: str = "") -> str:
    """A percentage to one decimal ("+": signed), "–" where there is none."""
    return "–" if not np.isfinite(value) else f"{value:{sign}.1f}"


def ci_text(low: float, high: float, sign: str = "") -> str:
    """An interval as "[low, high]" to one decimal ("+": signed), "n/a" where there is none (one seed)."""
    return "n/a" if not np.isfinite(low) else f"[{low:{sign}.1f}, {high:{sign}.1f}]"


def collapsed_text(row: Any) -> str:
    """ "collapsed/seeds", and the collapsed seeds' numbers."""
    return f"{row.n_collapsed}/{row.n_seeds}" + (f" (seeds {row.collapsed_seeds})" if row.n_collapsed else "")


def markdown_head(title: str, method: str, notes: Sequence[str] = ()) -> list[str]:
    """A summary page's first lines: its title, the method paragraph, the notes as a list."""
    lines = [f"# {title}", "", method, "", *(f"- {note}" for note in notes)]
    return lines + ([""] if notes else [])


def table_head(header: Sequence[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]


def table_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def summary_markdown(summary: pd.DataFrame, notes: Sequence[str] = (), window_fraction: float = WINDOW_FRACTION) -> str:
    """The summary as a Markdown page: a short header on method, then one table row per cell."""
    method = (
        f"Success = mean unsmoothed training success over the last {window_fraction:.0%} of each run's "
        "updates (the paper's Figure 2: updates 90-100 of 100 at 10%), in percent, averaged over seeds; "
        "interval = 95% Student-t over seeds (n/a with one seed). Diff = ours - paper, in "
        "percentage points. Held-out = final `eval_success` (– where not evaluated). Collapse = the rule "
        "in `trainer/analysis/collapse.py`. Learning = mean training success over the last fifth of the "
        "updates minus over the first fifth (percentage points, mean over seeds with its interval); "
        "held-out = the first evaluation (after update 1) -> the last; informed = share of episodes whose SPO "
        "baseline came from data (the offline pass or an earlier visit) rather than the prior; cheating = "
        "success on the cheating probe's impossible tasks, which no honest repair can pass (anything above 0 "
        "means the grader was gamed; – where no probe ran); tampering = share of graded training episodes with "
        "tamper flags (swe: changes that reach into the grader, readings that disagree; – where not graded)."
    )
    lines = markdown_head("Training success, ours beside Ruan et al. 2026 (Figure 2)", method, notes)
    lines += table_head(
        [
            "model",
            "paper model",
            "recipe",
            "optimizer",
            "seeds",
            "success %",
            "95% CI",
            "collapsed",
            "paper %",
            "diff (pp)",
            "held-out %",
        ]
    )
    for row in summary.itertuples(index=False):
        lines.append(
            table_row(
                [
                    row.model,
                    row.paper_model,
                    row.recipe,
                    row.optimizer,
                    str(row.n_seeds),
                    pct(row.success_pct_mean),
                    ci_text(row.success_pct_ci_low, row.success_pct_ci_high),
                    collapsed_text(row),
                    pct(row.paper_success_pct),
                    pct(row.diff_pct_points),
                    pct(row.eval_success_pct_mean),
                ]
            )
        )
    lines += [
        "",
        "## Learning",
        "",
        *table_head(
            [
                "model",
                "recipe",
                "optimizer",
                "seeds",
                "learning (pp)",
                "95% CI",
                "held-out % first -> last",
                "informed %",
                "cheating %",
                "tampering %",
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
                    str(row.n_seeds),
                    pct(row.gain_pct_mean, "+"),
                    ci_text(row.gain_pct_ci_low, row.gain_pct_ci_high, "+"),
                    f"{pct(row.eval_first_pct_mean)} -> {pct(row.eval_success_pct_mean)}",
                    pct(row.informed_pct_mean),
                    pct(row.cheat_pct_mean),
                    pct(row.tamper_pct_mean),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def write_tables(
    summary: pd.DataFrame,
    markdown: str,
    runs: pd.DataFrame,
    csv: str | os.PathLike,
    md: str | os.PathLike,
    runs_path: str | os.PathLike,
) -> None:
    """The summary rule's three outputs: the table as CSV and Markdown, and the per-run table as Parquet."""
    for path in (csv, md, runs_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    summary.to_csv(csv, index=False, float_format="%.6g")
    Path(md).write_text(markdown)
    runs.to_parquet(runs_path, index=False)


def summary_notes(
    metrics_paths: Sequence,
    runs: pd.DataFrame,
    summary: pd.DataFrame,
    criterion: CollapseCriterion,
    notes: Sequence[str],
) -> list[str]:
    """A summary's log: what was read and judged, by which rule, how many runs collapsed, then `notes`."""
    return [
        f"{len(metrics_paths)} metrics files, {len(runs)} runs, {len(summary)} cells",
        f"collapse criterion: {criterion}",
        f"{int(runs['collapsed'].sum())} collapsed run(s)",
        *notes,
    ]


def check_same_runs(metrics: pd.DataFrame, runs: pd.DataFrame, keys: Sequence[str] = RUN_KEYS) -> None:
    """ValueError if the per-run table and the metrics do not cover exactly the same runs, named by `keys` (a stale
    runs table)."""
    keys = list(keys)
    missing = [k for k in keys if k not in runs.columns]
    if missing:
        raise ValueError(f"the runs table lacks key(s) {missing} of the metrics (rebuild runs.parquet)")
    logged = set(metrics[keys].drop_duplicates().itertuples(index=False, name=None))
    judged = set(runs[keys].itertuples(index=False, name=None))
    if logged != judged:
        raise ValueError(
            f"the runs table does not match the metrics: runs only in the logs "
            f"{sorted(logged - judged)[:3]}, only in the runs table {sorted(judged - logged)[:3]} "
            f"(rebuild runs.parquet)"
        )


def read_judged_runs(
    metrics_paths: Sequence[str | os.PathLike], base_dir: str | os.PathLike, runs_path: str | os.PathLike
) -> pd.DataFrame:
    """The per-run table at `runs_path`, checked against the run keys of the logs (nothing else of them is read)."""
    metrics = load_metrics(metrics_paths, base_dir, ("update",))
    runs = pd.read_parquet(runs_path)
    check_same_runs(metrics, runs, run_keys(metrics))
    return runs


def coverage_notes(runs: pd.DataFrame, models: Mapping[str, str] | None = None) -> list[str]:
    """What a smoke grid lacks: configured models and Figure 2 recipes that have no runs (empty if complete)."""
    notes = []
    absent_models = [m for m in (models or {}) if m not in set(runs["model"])]
    if absent_models:
        notes.append(f"no runs of model(s) {', '.join(absent_models)} in these logs")
    absent_recipes = [r for r in FIGURE2_RECIPES if r not in set(runs["recipe"])]
    if absent_recipes:
        notes.append(f"no runs of recipe(s) {', '.join(absent_recipes)} in these logs")
    return notes


def study_shape(metrics: pd.DataFrame) -> tuple[int, int]:
    """(episodes per update, updates) of a study: the median logged `n_trajectories` over all rows and the
    median number of rows a run logged, as integers (what the collapse rule's false-positive rate depends on)."""
    for column in ("update", "n_trajectories"):
        if column not in metrics.columns:
            raise ValueError(f"study_shape: the metrics table has no {column!r} column")
    batch = metrics["n_trajectories"].astype(float).median()
    if not np.isfinite(batch) or round(batch) < 1:
        raise ValueError("study_shape: no positive n_trajectories logged")
    n_updates = metrics.groupby(list(RUN_KEYS), sort=False).size().median()
    return int(round(batch)), int(round(n_updates))


def collapse_note(
    batch_size: int,
    n_updates: int,
    criterion: CollapseCriterion | None = None,
    n_runs: int = calibration.N_RUNS,
    seed: int = calibration.SEED,
) -> str:
    """One sentence for the summary: the rule's worst simulated false-positive rate over constant success
    10-50%, and its power on a collapse from 30% to 2% in the middle, at this batch size and run length."""
    criterion = CollapseCriterion() if criterion is None else criterion
    worst, per_level = calibration.false_positive_rate(criterion, batch_size, n_updates, n_runs=n_runs, seed=seed)
    level = max(per_level, key=per_level.get)
    detected = calibration.power(criterion, batch_size, n_updates, n_runs=n_runs, seed=seed)
    levels = calibration.FPR_LEVELS
    return (
        f"The collapse rule flags {worst:.1%} of simulated runs of constant success (worst over "
        f"{min(levels):.0%}-{max(levels):.0%}, at {level:.0%}) and {detected:.1%} of simulated runs whose success "
        f"falls from 30% to 2% at update {n_updates // 2}, at this study's {batch_size} episodes per update and "
        f"{n_updates} updates (Monte Carlo, {n_runs} runs, seed {seed}; `trainer/analysis/calibration.py`)."
    )


def add_collapse_note(markdown: str, note: str) -> str:
    """`markdown` with `note` appended to the paragraph that defines the collapse column (the method paragraph)."""
    lines = markdown.split("\n")
    prose = [i for i, line in enumerate(lines) if line.strip() and not line.startswith(("#", "-", "|"))]
    named = [i for i in prose if "Collapse = " in lines[i]]
    if not (named or prose):
        raise ValueError("add_collapse_note: the Markdown has no method paragraph")
    i = (named or prose)[0]
    lines[i] = f"{lines[i]} {note}"
    return "\n".join(lines)


def write_collapse_note(
    metrics_paths: Sequence[str | os.PathLike],
    base_dir: str | os.PathLike,
    md: str | os.PathLike,
    collapse: Mapping[str, Any] | None = None,
    n_runs: int = calibration.N_RUNS,
    seed: int = calibration.SEED,
) -> str:
    """Add `collapse_note` for the study's logs to a written summary Markdown (main or companion); returns it."""
    metrics = load_metrics(metrics_paths, base_dir, ("update", "n_trajectories"))
    batch_size, n_updates = study_shape(metrics)
    note = collapse_note(batch_size, n_updates, CollapseCriterion.from_dict(collapse), n_runs, seed)
    Path(md).write_text(add_collapse_note(Path(md).read_text(), note))
    return note
