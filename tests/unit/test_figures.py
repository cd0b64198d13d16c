"""trainer.analysis.figures and the two Snakemake scripts, on a small synthetic grid with known values.

The figures are checked as matplotlib objects (panels, titles, bar lengths, line data, markers) and as files
(PNG and PDF exist, are non-empty, and a figure written twice gives identical bytes). The scripts are run the
way Snakemake runs a `script:`, with a stand-in `snakemake` object.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import to_hex

from trainer.analysis.cell_logs import load_metrics
from trainer.analysis.collapse import CollapseCriterion, ema
from trainer.analysis.figures import FIGURES, FULL_BAR, add_ema, draw_figure, figure_bars, figure_family
from trainer.analysis.kinds import PAPER_NUMBERS, STUDY_KINDS
from trainer.analysis.pipeline import plot_study
from trainer.analysis.plotting import recipe_label, save_figure
from trainer.analysis.summary import load_paper_numbers, run_table
from trainer.analysis.synthetic import cell_path, synthetic_grid, synthetic_metrics, write_metrics
from trainer.recipes import FIGURE2_RECIPES as RECIPES  # the main figures draw these

REPO = Path(__file__).resolve().parents[2]
MODELS = {"minicpm-tiny": "MiniCPM5-2B", "qwen-tiny": "Qwen3.5-4B"}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """2 models x 8 recipes x Adam/Muon x 2 seeds, 20 updates: the logs, the metrics with EMA, the runs."""
    root = tmp_path_factory.mktemp("grid")
    base = root / "results" / "cells"
    paths = synthetic_grid(base, list(MODELS), list(RECIPES), ["adam", "muon"], [0, 1], n_updates=20, seed=1)
    metrics = load_metrics(paths, base)
    runs = run_table(metrics, CollapseCriterion(warmup=3, patience=2), models=MODELS)
    runs.to_parquet(root / "runs.parquet")  # what the figures rule reads beside the logs
    return SimpleNamespace(root=root, base=base, paths=paths, metrics=add_ema(metrics, 5), runs=runs)


def bars(ax, label: str) -> list:
    return [patch for container in ax.containers if container.get_label() == label for patch in container]


def test_fig2_bars_equal_window_means_and_sit_beside_the_paper(grid):
    fig = draw_figure("fig2", grid.metrics, grid.runs, MODELS)
    assert len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == [
        "MiniCPM5-2B stand-in (minicpm-tiny)",
        "Qwen3.5-4B stand-in (qwen-tiny)",
    ]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [recipe_label(r) for r in RECIPES]
    paper = load_paper_numbers().set_index(["model", "recipe"])["success_updates_90_100_pct"]
    for ax, model in zip(fig.axes, MODELS):
        ours, theirs = bars(ax, "ours"), bars(ax, "paper")
        assert len(ours) == len(theirs) == 8
        for recipe, bar, paper_bar in zip(RECIPES, ours, theirs):
            optimizer = "adam" if recipe == "spo_adam" else "muon"  # each recipe with its own optimizer
            cell = grid.runs[
                (grid.runs["model"] == model) & (grid.runs["recipe"] == recipe) & (grid.runs["optimizer"] == optimizer)
            ]
            assert bar.get_width() == pytest.approx(100 * cell["window_success"].mean())
            assert paper_bar.get_width() == paper[(MODELS[model], recipe)]
            assert to_hex(bar.get_facecolor()) == (FULL_BAR if recipe == "full" else to_hex(ours[0].get_facecolor()))
        # one dot per seed: 8 recipes x 2 seeds, in one scatter per recipe
        dots = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert sum(len(c.get_offsets()) for c in dots) == 16


def test_fig2_window_means_by_hand(tmp_path):
    # success = update / 20 over 20 updates: the window is the last tenth, updates 18 and 19 -> (0.90 + 0.95) / 2.
    base = tmp_path / "cells"
    path = write_metrics(
        cell_path(base, "qwen-tiny", "full", "muon", 0), {"update": np.arange(20), "success_rate": np.arange(20) / 20}
    )
    runs = run_table(load_metrics([path], base))
    fig = figure_bars(runs, models=MODELS)
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == "Qwen3.5-4B stand-in (qwen-tiny)"
    (bar,) = bars(fig.axes[0], "ours")
    assert bar.get_width() == pytest.approx(92.5)
    assert [p.get_width() for p in bars(fig.axes[0], "paper")] == [66.9]


def test_fig3_selected_runs_raw_and_ema(grid):
    fig = draw_figure("fig3", grid.metrics, grid.runs, MODELS)
    assert [ax.get_title() for ax in fig.axes] == [
        "MiniCPM5-2B stand-in (minicpm-tiny)",
        "Qwen3.5-4B stand-in (qwen-tiny)",
    ]
    for ax, model in zip(fig.axes, MODELS):
        lines = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(lines) == 6  # (raw, EMA) x (SPO+Adam, SPO+Muon, full)
        raw, smooth = lines[4], lines[5]  # the full recipe's, both seeds
        run = grid.metrics[
            (grid.metrics["model"] == model)
            & (grid.metrics["recipe"] == "full")
            & (grid.metrics["optimizer"] == "muon")
            & (grid.metrics["seed"] == 0)
        ]
        assert raw.get_segments()[0][:, 1] == pytest.approx(100 * run["success_rate"].to_numpy())
        assert smooth.get_segments()[0][:, 1] == pytest.approx(100 * ema(run["success_rate"], 5))
        assert raw.get_alpha() < 0.5 < smooth.get_alpha() and smooth.get_linewidth()[0] > raw.get_linewidth()[0]


@pytest.mark.parametrize(
    "name, family, model", [("fig4", "MiniCPM5-2B", "minicpm-tiny"), ("fig5", "Qwen3.5-4B", "qwen-tiny")]
)
def test_fig4_fig5_one_panel_per_recipe_with_collapse_marks(grid, name, family, model):
    fig = draw_figure(name, grid.metrics, grid.runs, MODELS)
    assert len(fig.axes) == 8
    assert [ax.get_title() for ax in fig.axes] == [recipe_label(r) for r in RECIPES]
    assert fig.get_suptitle().startswith(f"{family} (stand-in: {model})")
    mine = grid.runs[grid.runs["model"] == model]
    for ax, recipe in zip(fig.axes, RECIPES):
        lines = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(lines) == 4  # (raw, EMA) x (Muon, Adam)
        assert sum(len(seg) for seg in (lines[0].get_segments(),)) == 2  # two Muon seeds
        marks = [c for c in ax.collections if isinstance(c, PathCollection)]
        collapsed = mine[(mine["recipe"] == recipe) & mine["collapsed"]]
        assert sum(len(m.get_offsets()) for m in marks) == len(collapsed)
        for m in marks:  # each cross sits at the collapse update
            assert set(m.get_offsets()[:, 0]) <= set(collapsed["collapse_update"].astype(float))
    full = fig.axes[list(RECIPES).index("full")]
    assert to_hex(full.collections[0].get_colors()[0]) == "#2e9a4f"  # the full recipe in green
    assert full.title.get_fontweight() == "bold"


def test_fig4_says_so_when_the_family_is_absent(grid):
    only_qwen = grid.metrics[grid.metrics["model"] == "qwen-tiny"]
    fig = figure_family(only_qwen, grid.runs, "MiniCPM5-2B", MODELS)
    assert len(fig.axes) == 1 and not fig.axes[0].axison
    assert "No runs of MiniCPM5-2B" in fig.axes[0].texts[0].get_text()


def test_diagnostics_panels(grid):
    fig = draw_figure("diagnostics", grid.metrics, grid.runs, MODELS)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "Gradient norm",
        "Update RMS",
        "Update spectral norm",
        "Policy entropy",
        "Approx. KL",
        "Staleness (updates)",
        "Clip fraction (low side)",
        "Clip fraction (high side)",
        "TIS truncated fraction",
    ]
    assert fig.axes[0].get_yscale() == "log" and fig.axes[3].get_yscale() == "linear"
    # 2 models x 2 optimizers median lines per panel; the grad-norm median of Muon on minicpm-tiny at update 0:
    assert all(len(ax.lines) == 4 for ax in fig.axes)
    at0 = grid.metrics[
        (grid.metrics["model"] == "minicpm-tiny")
        & (grid.metrics["optimizer"] == "muon")
        & (grid.metrics["update"] == 0)
    ]["grad_norm"]
    assert fig.axes[0].lines[0].get_ydata()[0] == pytest.approx(np.median(at0))


@pytest.mark.slow
def test_written_figures_exist_and_pdf_is_reproducible(grid, tmp_path):
    outputs = [tmp_path / "figures" / f"{name}.{fmt}" for name in FIGURES for fmt in ("png", "pdf")]
    notes = plot_study("main", grid.paths, grid.base, grid.root / "runs.parquet", outputs, models=MODELS)
    for path in outputs:
        assert path.is_file() and path.stat().st_size > 1000, path
        assert path.read_bytes()[:4] == (b"\x89PNG" if path.suffix == ".png" else b"%PDF")
    assert len([n for n in notes if n.startswith("wrote")]) == 10
    # A fresh drawing written twice: the same bytes each time and as the pipeline's (no random draws, no date).
    fig = draw_figure("fig2", grid.metrics, grid.runs, MODELS)
    first, second = save_figure(fig, tmp_path / "a.pdf").read_bytes(), save_figure(fig, tmp_path / "b.pdf").read_bytes()
    assert first == second == (tmp_path / "figures" / "fig2.pdf").read_bytes()
    assert b"CreationDate" not in first


def test_the_figures_refuse_unknown_outputs_and_a_stale_runs_table(grid, tmp_path):
    def plot(outputs, runs_path=grid.root / "runs.parquet"):
        return plot_study("main", grid.paths, grid.base, runs_path, outputs, models=MODELS)

    with pytest.raises(ValueError, match="fig9"):
        plot([tmp_path / "fig9.png"])
    with pytest.raises(ValueError, match="svg"):
        plot([tmp_path / "fig2.svg"])
    grid.runs.iloc[1:].to_parquet(tmp_path / "stale.parquet")
    with pytest.raises(ValueError, match="rebuild runs.parquet"):
        plot([tmp_path / "fig2.png"], tmp_path / "stale.parquet")


def snakemake_object(input_, output, params, log):
    """A stand-in for the object Snakemake injects into a `script:` (named input/output, params, log list)."""
    return SimpleNamespace(input=input_, output=output, params=SimpleNamespace(**params), log=[str(log)])


@pytest.mark.slow
def test_scripts_run_as_snakemake_scripts_on_a_smoke_grid(tmp_path):
    # A smoke grid: one model, two recipes, 6 updates; the other family and recipes are absent.
    base = tmp_path / "results" / "cells"
    rng = np.random.default_rng(0)
    paths = [
        str(write_metrics(cell_path(base, "minicpm-tiny", r, o, 0), synthetic_metrics(6, 0.5, rng)))
        for r, o in [("spo_adam", "adam"), ("full", "muon")]
    ]
    params = {
        "study": "main",
        "base_dir": str(base),
        "collapse": {"warmup": 2},
        "models": MODELS,
        "window_fraction": 0.1,
    }
    # The rule's declared numbers are the ones compared with: here a copy with the full recipe's value changed.
    numbers = tmp_path / "numbers.csv"
    paper = pd.read_csv(PAPER_NUMBERS)
    paper.loc[(paper["model"] == "MiniCPM5-2B") & (paper["recipe"] == "full"), "success_updates_90_100_pct"] = 12.5
    paper.to_csv(numbers, index=False)
    out = tmp_path / "results"
    summary_outputs = SimpleNamespace(
        csv=str(out / "summary.csv"), md=str(out / "summary.md"), runs=str(out / "runs.parquet")
    )
    smk = snakemake_object(
        SimpleNamespace(metrics=paths, paper_numbers=str(numbers)), summary_outputs, params, tmp_path / "logs" / "s.log"
    )
    runpy.run_path(str(REPO / "workflow" / "scripts" / "summarize.py"), init_globals={"snakemake": smk})
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary["recipe"]) == ["full", "spo_adam"]
    assert summary.set_index("recipe").loc["full", "paper_success_pct"] == 12.5
    assert "no runs of model(s) qwen-tiny" in (tmp_path / "logs" / "s.log").read_text()

    figures = [str(tmp_path / "figures" / f"{n}.{e}") for n in FIGURES for e in ("png", "pdf")]
    smk = snakemake_object(
        SimpleNamespace(metrics=paths, runs=str(out / "runs.parquet"), paper_numbers=str(numbers)),
        figures,
        {**params, "ema_span": 5},
        tmp_path / "logs" / "p.log",
    )
    runpy.run_path(str(REPO / "workflow" / "scripts" / "plot_figures.py"), init_globals={"snakemake": smk})
    assert all(Path(f).stat().st_size > 0 for f in figures)
    log = (tmp_path / "logs" / "p.log").read_text()
    assert "fig5: no runs of Qwen3.5-4B" in log and "wrote" in log


def test_script_failure_is_logged(tmp_path):
    params = {
        "study": "main",
        "base_dir": str(tmp_path),
        "collapse": {},
        "models": MODELS,
        "window_fraction": 0.1,
    }
    smk = snakemake_object(
        SimpleNamespace(metrics=[], paper_numbers=str(PAPER_NUMBERS)),
        SimpleNamespace(csv="a", md="b", runs="c"),
        params,
        tmp_path / "s.log",
    )
    with pytest.raises(ValueError, match="no metrics files"):
        runpy.run_path(str(REPO / "workflow" / "scripts" / "summarize.py"), init_globals={"snakemake": smk})
    assert "no metrics files" in (tmp_path / "s.log").read_text()


def test_scripts_have_no_future_import_and_captions_exist():
    # Snakemake prepends a preamble to a `script:`, so a `from __future__` import there is a SyntaxError.
    for script in ("summarize.py", "plot_figures.py"):
        text = (REPO / "workflow" / "scripts" / script).read_text()
        assert not re.search(r"^from __future__ import", text, re.MULTILINE)
    for kind in STUDY_KINDS.values():
        for name in (*kind.figures, kind.summary_caption):
            assert len((REPO / "workflow" / "report" / f"{name}.rst").read_text().strip()) > 100, name
