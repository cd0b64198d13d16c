"""trainer.analysis.stability and .horizon: the lr key of the logs, the per-run and summary tables, the lr
selection rule, the figures, and the workflow scripts' dispatch to them.

Logs come from `synthetic.stability_grid` / `synthetic.horizon_grid` (known best lrs, known collapses), written in
the workflow's Hive layout, and from small runs built by hand where a number is worked out in a comment.
"""

from __future__ import annotations

import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from trainer.analysis.cell_logs import LR_RUN_KEYS, RUN_KEYS, load_metrics, lr_label
from trainer.analysis.horizon import (
    figure_horizon,
    horizon_run_table,
    horizon_summary_table,
)
from trainer.analysis.pipeline import plot_study, summarize_study
from trainer.analysis.stability import (
    STABILITY_COLUMNS,
    figure_stability,
    select_lrs,
    select_pooled_lrs,
    selected_lr_yaml,
    stability_summary_table,
    sweep_run_table,
)
from trainer.analysis.synthetic import (
    STABILITY_BEST_LR,
    cell_path,
    horizon_grid,
    stability_grid,
    synthetic_metrics,
    write_metrics,
)

REPO = Path(__file__).resolve().parents[2]
MODELS = {"minicpm-tiny": "MiniCPM5-2B", "qwen-tiny": "Qwen3.5-4B"}
LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]
RECIPES = {"adam": "spo_adam", "muon": "spo_muon"}
HORIZONS = {f"qwen-h{k}": k for k in (1, 2, 4, 8)}


# -- the lr key of the logs --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lr, label",
    [
        (1e-4, "1e-04"),
        (3e-4, "3e-04"),
        (2.5e-4, "2.5e-04"),
        (1e-2, "1e-02"),
        (0.1, "1e-01"),
        (1.0, "1e+00"),
        (1.234567e-5, "1.234567e-05"),
    ],
)
def test_lr_label_is_short_scientific_and_reads_back_exactly(lr, label):
    assert lr_label(lr) == label and float(label) == lr


def test_load_metrics_reads_the_lr_folder_as_a_float_key(tmp_path):
    rng = np.random.default_rng(0)
    paths = [
        write_metrics(cell_path(tmp_path, "m", "spo_adam", "adam", 0, lr=lr), synthetic_metrics(4, 0.5, rng))
        for lr in (3e-4, 1e-3)
    ]
    assert "/lr=3e-04/seed=0/" in paths[0].as_posix()
    frame = load_metrics(paths, tmp_path, STABILITY_COLUMNS)
    assert frame["lr"].dtype == np.float64 and sorted(set(frame["lr"])) == [3e-4, 1e-3]
    assert len(frame) == 8 and not frame.duplicated([*LR_RUN_KEYS, "update"]).any()
    # with the key, `lr` is the folder's (the cell's configured rate), also when every column is read
    assert sorted(set(load_metrics(paths, tmp_path)["lr"])) == [3e-4, 1e-3]
    # without it, nothing changes: the four keys, and the logged lr metric where asked for
    plain = write_metrics(cell_path(tmp_path / "plain", "m", "spo_adam", "adam", 0), synthetic_metrics(4, 0.5, rng))
    assert "lr" not in load_metrics([plain], tmp_path / "plain", STABILITY_COLUMNS).columns
    assert set(load_metrics([plain], tmp_path / "plain")["lr"]) == {1e-3}
    mixed = write_metrics(cell_path(tmp_path, "m", "spo_muon", "muon", 0), synthetic_metrics(4, 0.5, rng))
    with pytest.raises(ValueError, match="some name lr=... folders and some do not"):
        load_metrics([*paths, mixed], tmp_path)


def test_the_main_and_companion_analyses_refuse_an_lr_axis(tmp_path):
    paths = stability_grid(tmp_path / "cells", ["qwen-tiny"], RECIPES, [1e-4, 1e-3], [0], n_updates=12)
    for study in ("main", "companion"):
        with pytest.raises(ValueError, match="no learning-rate axis"):
            summarize_study(study, paths, tmp_path / "cells", tmp_path / "s.csv", tmp_path / "s.md", tmp_path / "r.pq")


# -- stability ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    base = tmp_path_factory.mktemp("sweep") / "cells"
    paths = stability_grid(base, list(MODELS), RECIPES, LRS, [0, 1])
    metrics = load_metrics(paths, base, STABILITY_COLUMNS)
    return paths, base, metrics, sweep_run_table(metrics, models=MODELS)


def test_sweep_run_table_has_one_row_per_run_with_auc(sweep):
    _, _, metrics, runs = sweep
    assert len(runs) == 2 * 2 * 5 * 2 and list(runs.columns[:5]) == list(LR_RUN_KEYS)
    assert not runs.duplicated(list(LR_RUN_KEYS)).any()
    # held-out AUC = the mean of every eval_success the run logged
    one = runs.iloc[0]
    mine = metrics[(metrics[list(LR_RUN_KEYS)] == one[list(LR_RUN_KEYS)]).all(axis=1)]
    assert one["heldout_auc"] == pytest.approx(mine["eval_success"].mean())
    # 60 updates at 0.1: a final window of 6
    assert one["window_success"] == pytest.approx(mine["success_rate"].iloc[-6:].mean())
    # the synthetic collapses: lrs at 10x an optimizer's best lr or more, i.e. adam 3e-3 and 1e-2, muon 1e-2
    dead = runs[runs["collapsed"]]
    assert set(zip(dead["optimizer"], dead["lr"])) == {("adam", 3e-3), ("adam", 1e-2), ("muon", 1e-2)}


def test_stability_summary_selects_the_best_auc_and_the_stable_range(sweep):
    _, _, _, runs = sweep
    summary = stability_summary_table(runs, models=MODELS)
    assert len(summary) == 2 * 2 * 5 and (summary["n_seeds"] == 2).all()
    assert summary["auc_pct_mean"].between(0, 100).all() and np.isfinite(summary["final_pct_ci_low"]).all()
    selection = select_lrs(summary)
    assert len(selection) == 4
    for row in selection.itertuples(index=False):
        assert row.selected_lr == STABILITY_BEST_LR[row.optimizer]
        assert row.stable_lrs == [lr for lr in LRS if lr < 10 * STABILITY_BEST_LR[row.optimizer] * (1 - 1e-9)]
    text = selected_lr_yaml(selection, select_pooled_lrs(summary))
    assert yaml.safe_load(text) == {
        **{m: {"adam": 3e-4, "muon": 1e-3} for m in MODELS},
        "lr": {"adam": 3e-4, "muon": 1e-3},
    }


def test_pooled_selection_averages_the_families():
    """One lr per optimizer for every family: family a peaks at 1e-4 (AUC 50 vs 30), family b at 3e-4 (40 vs 45);
    means 45 at 1e-4 and 37.5 at 3e-4 (seeds already averaged per family), so 1e-4 wins though b prefers 3e-4."""
    rows = [("a", 1e-4, 50.0), ("a", 3e-4, 30.0), ("b", 1e-4, 40.0), ("b", 3e-4, 45.0)]
    summary = pd.DataFrame([{"model": m, "optimizer": "adam", "lr": lr, "auc_pct_mean": auc} for m, lr, auc in rows])
    assert select_pooled_lrs(summary) == {"adam": 1e-4}
    tie = pd.DataFrame([{"model": "a", "optimizer": "muon", "lr": lr, "auc_pct_mean": 40.0} for lr in (3e-4, 1e-4)])
    assert select_pooled_lrs(tie) == {"muon": 1e-4}


def test_selection_breaks_ties_to_the_smaller_lr_and_skips_unevaluated_lrs():
    def row(lr, auc, collapsed=0, recipe="spo_adam"):
        return {
            "model": "m",
            "paper_model": "M",
            "recipe": recipe,
            "optimizer": "adam",
            "lr": lr,
            "auc_pct_mean": auc,
            "n_collapsed": collapsed,
        }

    summary = pd.DataFrame([row(1e-3, 40.0), row(3e-4, 40.0), row(1e-4, math.nan), row(3e-3, 10.0, collapsed=2)])
    picked = select_lrs(summary).iloc[0]
    assert picked["selected_lr"] == 3e-4 and picked["auc_pct"] == 40.0
    assert picked["stable_lrs"] == [1e-4, 3e-4, 1e-3] and picked["lrs"] == [1e-4, 3e-4, 1e-3, 3e-3]
    # two recipes on one optimizer: their AUCs are averaged per lr, 3e-4: (40 + 50) / 2 = 45, 1e-3: (40 + 20) / 2
    two = pd.concat([summary, pd.DataFrame([row(1e-3, 20.0, recipe="full"), row(3e-4, 50.0, recipe="full")])])
    assert select_lrs(two).iloc[0]["selected_lr"] == 3e-4
    never = select_lrs(pd.DataFrame([row(1e-3, math.nan)]))
    assert math.isnan(never.iloc[0]["selected_lr"]) and selected_lr_yaml(never).endswith("{}\n")


def test_summarize_and_plot_stability_write_every_output(sweep, tmp_path):
    paths, base, _, _ = sweep
    out = {name: tmp_path / name for name in ("s.csv", "s.md", "runs.parquet", "selected_lr.yaml")}
    selected = {"selected": out["selected_lr.yaml"]}
    notes = summarize_study(
        "stability", paths, base, out["s.csv"], out["s.md"], out["runs.parquet"], selected, models=MODELS
    )
    assert notes[0] == "40 metrics files, 40 runs, 20 cells" and "qwen-tiny/muon: 1e-03" in notes[3]
    markdown = out["s.md"].read_text()
    assert "## Selected learning rates" in markdown and "| qwen-tiny | Qwen3.5-4B | adam | 3e-04 |" in markdown
    assert "Collapse = " in markdown  # the paragraph the collapse note is appended to
    assert len(pd.read_csv(out["s.csv"])) == 20 and "lr" in pd.read_parquet(out["runs.parquet"]).columns
    figures = [tmp_path / "figures" / "stability.png", tmp_path / "figures" / "stability.pdf"]
    assert plot_study("stability", paths, base, out["runs.parquet"], figures, models=MODELS) == [
        f"wrote {f}" for f in figures
    ]
    assert all(f.stat().st_size > 0 for f in figures)
    with pytest.raises(ValueError, match="unknown figure 'fig2'"):
        plot_study("stability", paths, base, out["runs.parquet"], [tmp_path / "fig2.png"], models=MODELS)
    with pytest.raises(ValueError, match="does not match the metrics"):
        plot_study("stability", paths[:-1], base, out["runs.parquet"], figures[:1], models=MODELS)


def test_stability_figure_marks_collapsed_seeds_and_the_selection(sweep):
    _, _, _, runs = sweep
    summary = stability_summary_table(runs, models=MODELS)
    fig = figure_stability(runs, summary, select_lrs(summary), MODELS)
    axes = fig.axes
    assert len(axes) == 4 and all(ax.get_xscale() == "log" for ax in axes)
    assert [ax.get_title() for ax in axes[:2]] == [
        "MiniCPM5-2B stand-in (minicpm-tiny)",
        "Qwen3.5-4B stand-in (qwen-tiny)",
    ]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["Muon", "AdamW"] and "collapsed seed" in labels
    assert "selected lr (best held-out AUC)" in labels


# -- horizon -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def horizon(tmp_path_factory):
    base = tmp_path_factory.mktemp("horizon") / "cells"
    paths = horizon_grid(base, "qwen", list(HORIZONS.values()), ["spo_adam", "spo_muon", "full"], [0, 1, 2])
    return paths, base, load_metrics(paths, base, STABILITY_COLUMNS)


def test_horizon_tables_follow_the_synthetic_shape(horizon):
    _, _, metrics = horizon
    models = {m: "Qwen3.5-4B" for m in HORIZONS}
    runs = horizon_run_table(metrics, HORIZONS, models=models)
    assert len(runs) == 4 * 3 * 3 and set(runs["horizon"]) == {1.0, 2.0, 4.0, 8.0}
    # learning: the last fifth of the updates (12 of 60) minus the first fifth, by hand from the logs
    for row in runs.sample(5, random_state=0).itertuples():
        mine = (
            metrics[(metrics["model"] == row.model) & (metrics["recipe"] == row.recipe) & (metrics["seed"] == row.seed)]
            .sort_values("update")["success_rate"]
            .to_numpy()
        )
        assert len(mine) == 60 and row.gain == pytest.approx(mine[-12:].mean() - mine[:12].mean())
    summary = horizon_summary_table(runs, models=models)
    assert len(summary) == 12 and list(summary["horizon"][:4]) == [1.0, 2.0, 4.0, 8.0]  # sorted by horizon in a line
    adam = summary[summary["recipe"] == "spo_adam"].set_index("horizon")
    # synthetic: every Adam run at horizon 8 collapses; success falls with the horizon
    assert adam["n_collapsed"].to_dict() == {1.0: 0, 2.0: 0, 4.0: 0, 8.0: 3}
    muon = summary[summary["recipe"] == "spo_muon"].set_index("horizon")["final_pct_mean"]
    assert muon.is_monotonic_decreasing and (summary["gain_pp_mean"][summary["n_collapsed"] == 0] > 0).all()
    with pytest.raises(ValueError, match=r"model\(s\) \['qwen-h8'\] have no `horizon` label"):
        horizon_run_table(metrics, {m: h for m, h in HORIZONS.items() if h != 8})


def test_summarize_and_plot_horizon(horizon, tmp_path):
    paths, base, _ = horizon
    models = {m: "Qwen3.5-4B" for m in HORIZONS}
    out = [tmp_path / n for n in ("h.csv", "h.md", "runs.parquet")]
    notes = summarize_study("horizon", paths, base, *out, horizons={**HORIZONS, "qwen-h16": 16}, models=models)
    assert notes[0] == "36 metrics files, 36 runs, 12 cells"
    assert "no runs of model(s) qwen-h16 (horizon 16) in these logs" in notes
    assert "| Qwen3.5-4B | 8 | qwen-h8 | spo_adam | adam |" in out[1].read_text()
    figure = tmp_path / "horizon.pdf"
    assert plot_study("horizon", paths, base, out[2], [figure], models=models) == [f"wrote {figure}"]
    fig = figure_horizon(horizon_summary_table(pd.read_parquet(out[2]), models=models), models)
    assert (
        len(fig.axes) == 2
        and fig.axes[0].get_xscale() == "log"
        and fig.axes[1].get_ylabel() == "Collapsed seeds (of 3)"
    )
    assert [t.get_text() for t in fig.legends[0].get_texts()][:3] == [
        "SPO + Adam",
        "SPO + Muon",
        "Full recipe (SPO++ + Muon)",
    ]


# -- the workflow scripts ----------------------------------------------------------------------------------
def _run_script(name: str, **smk) -> None:
    runpy.run_path(str(REPO / "workflow" / "scripts" / name), init_globals={"snakemake": SimpleNamespace(**smk)})


def test_the_workflow_scripts_dispatch_the_stability_and_horizon_studies(tmp_path):
    stability = stability_grid(tmp_path / "s" / "cells", ["qwen-tiny"], RECIPES, [1e-4, 1e-3], [0], n_updates=20)
    out = SimpleNamespace(
        csv=tmp_path / "s" / "summary.csv",
        md=tmp_path / "s" / "summary.md",
        runs=tmp_path / "s" / "runs.parquet",
        selected=tmp_path / "s" / "selected_lr.yaml",
    )
    params = SimpleNamespace(
        study="stability",
        base_dir=tmp_path / "s" / "cells",
        collapse={},
        models=MODELS,
        window_fraction=0.1,
    )
    _run_script(
        "summarize.py",
        input=SimpleNamespace(metrics=stability),
        output=out,
        params=params,
        log=[tmp_path / "s" / "summarize.log"],
    )
    assert set(yaml.safe_load(out.selected.read_text())["qwen-tiny"]) == {"adam", "muon"}
    figures = [tmp_path / "s" / "stability.png"]
    _run_script(
        "plot_figures.py",
        input=SimpleNamespace(metrics=stability, runs=out.runs),
        output=figures,
        params=params,
        log=[tmp_path / "s" / "figures.log"],
    )
    assert figures[0].stat().st_size > 0

    horizon = horizon_grid(tmp_path / "h" / "cells", "qwen", [1, 2], ["spo_adam"], [0], n_updates=20)
    out = SimpleNamespace(
        csv=tmp_path / "h" / "summary.csv", md=tmp_path / "h" / "summary.md", runs=tmp_path / "h" / "runs.parquet"
    )
    params = SimpleNamespace(
        study="horizon",
        base_dir=tmp_path / "h" / "cells",
        collapse={},
        models={"qwen-h1": "Q", "qwen-h2": "Q"},
        window_fraction=0.1,
        horizons={"qwen-h1": 1, "qwen-h2": 2},
    )
    _run_script(
        "summarize.py",
        input=SimpleNamespace(metrics=horizon),
        output=out,
        params=params,
        log=[tmp_path / "h" / "summarize.log"],
    )
    assert len(pd.read_csv(out.csv)) == 2 and "Collapse = " in out.md.read_text()
    figures = [tmp_path / "h" / "horizon.png"]
    _run_script(
        "plot_figures.py",
        input=SimpleNamespace(metrics=horizon, runs=out.runs),
        output=figures,
        params=params,
        log=[tmp_path / "h" / "figures.log"],
    )
    assert figures[0].stat().st_size > 0
    assert set(RUN_KEYS) <= set(pd.read_parquet(out.runs).columns)
