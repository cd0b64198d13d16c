"""trainer.analysis.companion: validation definitions, the run and summary tables, the three figures, the scripts.

Known answers are worked out in the comments. Logs come from in-memory runs built by hand and from
`synthetic.companion_grid`, written in the workflow's Hive layout; the scripts run as Snakemake runs a `script:`.
"""

from __future__ import annotations

import math
import re
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer

from trainer.analysis.cell_logs import load_metrics
from trainer.analysis.companion import (
    COMPANION_COLUMNS,
    COMPANION_FIGURES,
    COMPANION_MODELS,
    COMPANION_NUMBERS,
    ESTIMATORS,
    OPTIMIZER_LABELS,
    OPTIMIZERS,
    companion_coverage_notes,
    companion_markdown,
    companion_run_table,
    companion_summary_table,
    figure_companion_bars,
    figure_companion_curves,
    figure_companion_diagnostics,
    final_window_success,
    finite_median,
    load_companion_numbers,
    validation_auc,
    validation_curve,
)
from trainer.analysis.pipeline import plot_study, summarize_study
from trainer.analysis.synthetic import companion_grid

REPO = Path(__file__).resolve().parents[2]
MODEL, PAPER = "qwen2.5-tiny", "Qwen2.5-0.5B-Instruct"
NAN = math.nan


def run_rows(evals: dict[int, float], n: int = 10, recipe="gigpo", optimizer="muon", seed=0, **columns):
    """One run of n updates with training success 0.5, eval_success only at the given updates, and diagnostics."""
    eval_success = np.full(n, np.nan)
    for update, value in evals.items():
        eval_success[update] = value
    return pd.DataFrame(
        {
            "model": MODEL,
            "recipe": recipe,
            "optimizer": optimizer,
            "seed": seed,
            "update": np.arange(n),
            "success_rate": 0.5,
            "eval_success": eval_success,
            "update_rms": 0.02,
            "update_spectral_norm": 0.9,
            **columns,
        }
    )


# -- definitions -------------------------------------------------------------------------------------------
def test_validation_curve_final_window_and_auc_by_hand():
    run = run_rows({1: 0.2, 4: 0.5, 8: 0.6, 9: 0.8}).sample(frac=1, random_state=0)  # row order must not matter
    curve = validation_curve(run)
    assert curve["update"].tolist() == [1, 4, 8, 9] and curve["eval_success"].tolist() == [0.2, 0.5, 0.6, 0.8]
    # 10 updates, fraction 0.2: window = ceil(10 * 0.2) = 2 updates (8, 9) -> (0.6 + 0.8) / 2 = 0.7.
    assert final_window_success(run, 0.2) == pytest.approx(0.7)
    # fraction 0.1: window = update 9 alone -> 0.8.
    assert final_window_success(run, 0.1) == pytest.approx(0.8)
    # Trapezoids: (0.2 + 0.5) / 2 * 3 = 1.05; (0.5 + 0.6) / 2 * 4 = 2.2; (0.6 + 0.8) / 2 * 1 = 0.7.
    # Area 3.95 over the span 9 - 1 = 8 -> 0.49375.
    assert validation_auc(run) == pytest.approx(3.95 / 8)


def test_window_without_evaluation_single_and_no_evaluation():
    # Evaluations at updates 3 and 6 only; the window (update 9) holds none -> the last one, 0.3.
    run = run_rows({3: 0.4, 6: 0.3})
    assert final_window_success(run, 0.1) == pytest.approx(0.3)
    # AUC: (0.4 + 0.3) / 2 * 3 / 3 = 0.35.
    assert validation_auc(run) == pytest.approx(0.35)
    single = run_rows({9: 0.42})
    assert validation_auc(single) == pytest.approx(0.42) and final_window_success(single) == pytest.approx(0.42)
    never = run_rows({})
    assert math.isnan(validation_auc(never)) and math.isnan(final_window_success(never))


@settings(max_examples=40, deadline=None)
@given(level=st.floats(0, 1), updates=st.lists(st.integers(0, 99), min_size=2, max_size=12, unique=True))
def test_flat_curve_auc_equals_its_level(level, updates):
    assert validation_auc(run_rows({u: level for u in updates}, n=100)) == pytest.approx(level, abs=1e-12)


def test_finite_median_by_hand_keeps_negative_estimates():
    assert finite_median([1.0, 4.0, 2.0, NAN]) == pytest.approx(2.0)  # NaN = not measured
    assert finite_median([-0.5, 0.1, 10.0, np.inf]) == pytest.approx(0.1)  # inf left out; an unbiased SNR may be < 0
    assert math.isnan(finite_median([NAN, NAN]))


def test_run_table_columns_by_hand_and_missing_grad_snr():
    a = run_rows({4: 0.2, 9: 0.6}, seed=0, grad_snr=[0.1, 10.0] * 5)
    b = run_rows({4: 0.4, 9: 0.4}, seed=1, optimizer="adam", update_rms=[0.01, 0.03] * 5)
    runs = companion_run_table(pd.concat([b, a], ignore_index=True), window_fraction=0.1)
    assert runs["optimizer"].tolist() == ["adam", "muon"]  # AdamW first: the companion's order
    muon, adam = runs.iloc[1], runs.iloc[0]
    assert muon["paper_model"] == PAPER and muon["n_updates"] == 10 and muon["window_first"] == 9
    assert muon["final_window_success"] == pytest.approx(0.6)  # the window (update 9) holds 0.6
    assert muon["val_auc"] == pytest.approx((0.2 + 0.6) / 2)  # one trapezoid over its own span
    assert muon["n_evals"] == 2 and muon["n_window_evals"] == 1
    assert muon["grad_snr_median"] == pytest.approx(5.05)  # median of five 0.1 and five 10.0: (0.1 + 10) / 2
    assert muon["train_success_window"] == pytest.approx(0.5) and not muon["collapsed"]
    assert adam["update_rms_mean"] == pytest.approx(0.02) and adam["update_spectral_norm_mean"] == pytest.approx(0.9)
    assert math.isnan(adam["grad_snr_median"])  # b has no grad_snr values at all (NaN after the concat)
    no_column = companion_run_table(run_rows({9: 0.5}))  # a log without the column
    assert math.isnan(no_column["grad_snr_median"].iloc[0])


def test_collapse_verdict_is_the_main_studys():
    success = np.r_[np.full(10, 0.6), np.zeros(10)]
    run = run_rows({19: 0.0}, n=20, success_rate=success)
    runs = companion_run_table(run)
    # The EMA (span 5) falls under half its 0.6 peak at update 11 (0.6 * (2/3)^2 = 0.267 < 0.3) and stays there.
    assert bool(runs["collapsed"].iloc[0]) and runs["collapse_update"].iloc[0] == 11
    assert runs["collapse_reason"].iloc[0] == "success_drop"


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: f.assign(recipe="spo"), "unknown estimator.*'spo'"),
        (lambda f: f.assign(optimizer="sgd"), "unknown optimizer.*'sgd'"),
        (lambda f: f.drop(columns="eval_success"), "lacks column.*'eval_success'"),
        (lambda f: f.drop(columns="update_rms"), "lacks column.*'update_rms'"),
    ],
)
def test_bad_input_names_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        companion_run_table(change(run_rows({9: 0.5})))


# -- the companion's numbers and the summary ---------------------------------------------------------------
def test_companion_numbers_ship_with_the_package_in_our_names():
    raw = pd.read_csv(COMPANION_NUMBERS)
    assert len(raw) == 6 and "validation success at lr 1e-5" in set(raw["metric"])  # every row kept
    numbers = load_companion_numbers()
    assert len(numbers) == 5 and set(numbers["metric"]) == {"final", "auc"}
    assert set(numbers["optimizer"]) == {"adam", "muon", "adam_high_lr"}
    final = numbers[numbers["metric"] == "final"].set_index(["recipe", "optimizer"])["value"]
    assert final[("gigpo", "adam")] == 0.29 and final[("gigpo", "muon")] == 0.546
    assert final[("gigpo", "adam_high_lr")] == 0.0


def runs_frame(rows: list[tuple]) -> pd.DataFrame:
    """A per-run table with the columns the summary reads: (recipe, optimizer, seed, final, auc, collapsed)."""
    frame = pd.DataFrame(rows, columns=["recipe", "optimizer", "seed", "final_window_success", "val_auc", "collapsed"])
    return frame.assign(model=MODEL, paper_model=PAPER, train_success_window=0.5, grad_snr_median=0.25)


def test_summary_means_intervals_companion_numbers_and_differences():
    runs = runs_frame(
        [
            ("gigpo", "muon", 0, 0.5, 0.40, False),
            ("gigpo", "muon", 1, 0.6, 0.50, False),
            ("gigpo", "muon", 2, 0.55, 0.45, True),
            ("graphgpo", "adam", 0, 0.3, 0.30, False),
            ("graphgpo", "adam", 1, NAN, NAN, False),
            ("grpo", "adam_high_lr", 0, 0.1, 0.2, False),
        ]
    )
    summary = companion_summary_table(runs).set_index(["recipe", "optimizer"])
    assert list(summary.index) == [("grpo", "adam_high_lr"), ("gigpo", "muon"), ("graphgpo", "adam")]
    gigpo = summary.loc[("gigpo", "muon")]
    # (50 + 60 + 55) / 3 = 55 %; the companion's 0.546 -> 54.6 %; diff 55 - 54.6 = 0.4 pp.
    assert gigpo["final_pct_mean"] == pytest.approx(55.0) and gigpo["companion_final_pct"] == pytest.approx(54.6)
    assert gigpo["final_diff_pp"] == pytest.approx(0.4)
    # sd of 50, 60, 55 is 5: half-width t(0.975, 2) x 5 / sqrt(3), t(0.975, 2) = 0.95 / sqrt(2 x 0.975 x 0.025).
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * 5 / math.sqrt(3)
    assert (gigpo["final_pct_ci_low"], gigpo["final_pct_ci_high"]) == pytest.approx((55.0 - half, 55.0 + half))
    assert gigpo["auc_pct_mean"] == pytest.approx(45.0) and math.isnan(gigpo["companion_auc_pct"])
    assert gigpo["n_collapsed"] == 1 and gigpo["collapsed_seeds"] == "2"
    assert gigpo["companion_source"] == "final: Figure 2 (+88% relative)"
    graph = summary.loc[("graphgpo", "adam")]
    # The unevaluated seed is left out: AUC 30 % over one seed; the companion's 0.400 -> diff 30 - 40 = -10 pp.
    assert graph["n_seeds"] == 2 and graph["n_evaluated"] == 1 and graph["auc_pct_mean"] == pytest.approx(30.0)
    assert graph["auc_diff_pp"] == pytest.approx(-10.0) and math.isnan(graph["auc_pct_ci_low"])
    assert math.isnan(summary.loc[("grpo", "adam_high_lr"), "final_diff_pp"])  # the companion reports none
    notes = companion_coverage_notes(runs.assign(n_evals=1, n_window_evals=1), models=COMPANION_MODELS)
    assert any("companion numbers with no run here" in n and "gigpo/adam_high_lr" in n for n in notes)
    md = companion_markdown(summary.reset_index(), notes)
    assert "| qwen2.5-tiny | Qwen2.5-0.5B-Instruct | GiGPO | Muon | 3 | 55.0 |" in md
    assert "54.6 | 0.4 |" in md and "- companion numbers with no run here" in md


def test_unmapped_model_gets_no_companion_number():
    runs = runs_frame([("gigpo", "muon", 0, 0.5, 0.4, False)]).assign(paper_model=MODEL)
    summary = companion_summary_table(runs, models={})
    assert math.isnan(summary["companion_final_pct"].iloc[0])
    notes = companion_coverage_notes(runs.assign(n_evals=1, n_window_evals=1), models={})
    assert any("through `models`" in n for n in notes)


# -- a synthetic grid: files, figures, scripts ---------------------------------------------------------------
@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """3 estimators x 3 optimizers x 2 seeds, 20 updates, evaluations every 5: summarized like the workflow."""
    root = tmp_path_factory.mktemp("companion")
    base = root / "results" / "cells"
    paths = companion_grid(base, MODEL, ESTIMATORS, OPTIMIZERS, [0, 1], n_updates=20, eval_every=5, seed=2)
    out = root / "results"
    notes = summarize_study(
        "companion", paths, base, out / "summary.csv", out / "summary.md", out / "runs.parquet", collapse={"warmup": 5}
    )
    return SimpleNamespace(
        root=root,
        base=base,
        paths=paths,
        notes=notes,
        summary=pd.read_csv(out / "summary.csv"),
        runs=pd.read_parquet(out / "runs.parquet"),
        metrics=load_metrics(paths, base, COMPANION_COLUMNS),
    )


def test_the_numbers_given_are_the_numbers_compared(grid, tmp_path):
    raw = pd.read_csv(COMPANION_NUMBERS)
    raw.loc[
        (raw["advantage"] == "gigpo")
        & (raw["optimizer"] == "muon")
        & (raw["metric"] == "final-window validation success"),
        "value",
    ] = 0.125
    raw.to_csv(tmp_path / "numbers.csv", index=False)
    out = [tmp_path / n for n in ("summary.csv", "summary.md", "runs.parquet")]
    summarize_study("companion", grid.paths, grid.base, *out, collapse={"warmup": 5}, numbers=tmp_path / "numbers.csv")
    edited = pd.read_csv(out[0]).set_index(["recipe", "optimizer"])
    original = grid.summary.set_index(["recipe", "optimizer"])
    assert original.loc[("gigpo", "muon"), "companion_final_pct"] == pytest.approx(54.6)
    assert edited.loc[("gigpo", "muon"), "companion_final_pct"] == pytest.approx(12.5)
    changed = ["companion_final_pct", "final_diff_pp"]
    pd.testing.assert_frame_equal(
        edited.drop(columns=changed).drop(index=[("gigpo", "muon")]),
        original.drop(columns=changed).drop(index=[("gigpo", "muon")]),
    )
    assert "| 12.5 |" in out[1].read_text()


def test_grid_summary_files_and_collapsed_control(grid):
    assert len(grid.runs) == 18 and len(grid.summary) == 9
    high = grid.runs[grid.runs["optimizer"] == "adam_high_lr"]
    assert high["collapsed"].all() and not grid.runs.loc[grid.runs["optimizer"] != "adam_high_lr", "collapsed"].any()
    assert "6 collapsed run(s)" in grid.notes
    assert (grid.root / "results" / "summary.md").read_text().startswith("# Validation success")
    # The synthetic validation curve is p - 0.05 at updates 4, 9, 14, 19; the window (ceil(20 * 0.1) = 2 updates,
    # 18-19) holds the final one only.
    assert (grid.runs["n_window_evals"] == 1).all() and (grid.runs["n_evals"] == 4).all()


def test_bars_equal_per_run_means_and_show_the_companion(grid):
    summary = companion_summary_table(grid.runs, models=COMPANION_MODELS)
    fig = figure_companion_bars(grid.runs, summary, COMPANION_MODELS)
    assert len(fig.axes) == 2
    for ax, column in zip(fig.axes, ("final_window_success", "val_auc")):
        bars = {
            c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers if isinstance(c, BarContainer)
        }
        for optimizer in OPTIMIZERS:
            means = grid.runs[grid.runs["optimizer"] == optimizer].groupby("recipe")[column].mean()
            assert bars[OPTIMIZER_LABELS[optimizer]] == pytest.approx([100 * means[e] for e in ESTIMATORS])
        dots = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert sum(len(c.get_offsets()) for c in dots) == 18  # every seed a dot
    diamonds = [line for line in fig.axes[0].lines if line.get_marker() == "D"]
    assert sorted(y for line in diamonds for y in line.get_ydata()) == pytest.approx([0.0, 29.0, 54.6])
    diamonds = [line for line in fig.axes[1].lines if line.get_marker() == "D"]
    assert sorted(y for line in diamonds for y in line.get_ydata()) == pytest.approx([40.0, 55.6])


def test_curves_panels_seeds_means_and_collapse_marks(grid):
    fig = figure_companion_curves(grid.metrics, grid.runs, COMPANION_MODELS)
    assert [ax.get_title() for ax in fig.axes] == ["GRPO", "GiGPO", "GraphGPO"]
    for ax in fig.axes:
        assert len(ax.lines) == 3  # one bold mean per optimizer
        marks = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert sum(len(c.get_offsets()) for c in marks) == 2  # the two collapsed AdamW-at-Muon's-lr seeds
    muon = grid.metrics[(grid.metrics["recipe"] == "grpo") & (grid.metrics["optimizer"] == "muon")]
    mean = 100 * muon.dropna(subset=["eval_success"]).groupby("update")["eval_success"].mean()
    line = fig.axes[0].lines[1]  # adam, muon, adam_high_lr
    assert line.get_xdata().tolist() == mean.index.tolist() and line.get_ydata() == pytest.approx(mean.to_numpy())


def test_diagnostics_panels_and_all_nan_grad_snr(grid, tmp_path):
    fig = figure_companion_diagnostics(grid.metrics, COMPANION_MODELS)
    assert len(fig.axes) == 12 and fig.axes[0].get_yscale() == "log"
    assert not any(t.get_text() == "not measured" for ax in fig.axes for t in ax.texts)
    # A log without grad_snr: the first row says so, the tables carry NaN, nothing fails.
    base = tmp_path / "cells"
    paths = companion_grid(base, MODEL, ["grpo", "gigpo"], ["adam", "muon"], [0], n_updates=10, grad_snr=False)
    metrics = load_metrics(paths, base, COMPANION_COLUMNS)
    assert metrics["grad_snr"].isna().all()
    runs = companion_run_table(metrics)
    assert runs["grad_snr_median"].isna().all()
    assert companion_summary_table(runs)["grad_snr_median"].isna().all()
    assert "grad_snr not measured in 4 of 4 run(s)" in companion_coverage_notes(runs, models=COMPANION_MODELS)
    fig = figure_companion_diagnostics(metrics, COMPANION_MODELS)
    assert len(fig.axes) == 8
    assert [t.get_text() for ax in fig.axes[:2] for t in ax.texts] == ["not measured", "not measured"]
    assert not any(ax.texts for ax in fig.axes[2:])


@pytest.mark.slow
def test_written_files_exist_are_non_empty_and_the_pdf_is_reproducible(grid, tmp_path):
    outputs = [tmp_path / f"{name}.{ext}" for name in COMPANION_FIGURES for ext in ("png", "pdf")]
    runs_path = grid.root / "results" / "runs.parquet"
    notes = plot_study("companion", grid.paths, grid.base, runs_path, outputs)
    assert notes == [f"wrote {p}" for p in outputs]
    for path in outputs:
        head = path.read_bytes()[:8]
        assert head.startswith(b"\x89PNG" if path.suffix == ".png" else b"%PDF")
    first = outputs[3].read_bytes()  # companion_bars.pdf
    plot_study("companion", grid.paths, grid.base, runs_path, [outputs[3]])
    assert outputs[3].read_bytes() == first


def test_write_rejects_unknown_outputs_and_a_stale_runs_table(grid, tmp_path):
    runs_path = grid.root / "results" / "runs.parquet"
    with pytest.raises(ValueError, match="unknown figure 'fig2'"):
        plot_study("companion", grid.paths, grid.base, runs_path, [tmp_path / "fig2.png"])
    grid.runs.iloc[1:].to_parquet(tmp_path / "stale.parquet")
    with pytest.raises(ValueError, match="does not match the metrics"):
        plot_study("companion", grid.paths, grid.base, tmp_path / "stale.parquet", [tmp_path / "companion_bars.png"])


def snakemake_object(input_, output, params, log):
    """A stand-in for the object Snakemake injects into a `script:` (named input/output, params, log list)."""
    return SimpleNamespace(input=input_, output=output, params=SimpleNamespace(**params), log=[str(log)])


@pytest.mark.slow
def test_scripts_run_as_snakemake_scripts(tmp_path):
    base = tmp_path / "results" / "cells"
    paths = [str(p) for p in companion_grid(base, MODEL, ["gigpo"], ["adam", "muon"], [0], n_updates=10)]
    params = {
        "study": "companion",
        "base_dir": str(base),
        "collapse": {"warmup": 2},
        "models": COMPANION_MODELS,
        "window_fraction": 0.2,
    }
    out = tmp_path / "results"
    outputs = SimpleNamespace(csv=str(out / "summary.csv"), md=str(out / "summary.md"), runs=str(out / "runs.parquet"))
    numbers = str(COMPANION_NUMBERS)
    smk = snakemake_object(
        SimpleNamespace(metrics=paths, paper_numbers=numbers), outputs, params, tmp_path / "logs" / "s.log"
    )
    runpy.run_path(str(REPO / "workflow" / "scripts" / "summarize.py"), init_globals={"snakemake": smk})
    assert sorted(pd.read_csv(out / "summary.csv")["optimizer"]) == ["adam", "muon"]
    assert "no runs of estimator(s) grpo, graphgpo" in (tmp_path / "logs" / "s.log").read_text()
    figures = [str(tmp_path / "figures" / f"{n}.{e}") for n in COMPANION_FIGURES for e in ("png", "pdf")]
    smk = snakemake_object(
        SimpleNamespace(metrics=paths, runs=outputs.runs, paper_numbers=numbers),
        figures,
        params,
        tmp_path / "logs" / "p.log",
    )
    runpy.run_path(str(REPO / "workflow" / "scripts" / "plot_figures.py"), init_globals={"snakemake": smk})
    assert all(Path(f).stat().st_size > 0 for f in figures)
    assert "wrote" in (tmp_path / "logs" / "p.log").read_text()
    # A failure is logged with its traceback, then raised.
    smk = snakemake_object(
        SimpleNamespace(metrics=[], paper_numbers=numbers), outputs, params, tmp_path / "logs" / "f.log"
    )
    with pytest.raises(ValueError, match="no metrics files"):
        runpy.run_path(str(REPO / "workflow" / "scripts" / "summarize.py"), init_globals={"snakemake": smk})
    assert "no metrics files" in (tmp_path / "logs" / "f.log").read_text()
    for script in ("summarize.py", "plot_figures.py"):
        # Snakemake prepends a preamble to a `script:`, so a `from __future__` import there is a SyntaxError.
        text = (REPO / "workflow" / "scripts" / script).read_text()
        assert not re.search(r"^from __future__ import", text, re.MULTILINE)
