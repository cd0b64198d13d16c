"""Studies of arms: a grid block's own trainer keys (trainer/study/), the arm key of the logs
(trainer/analysis/cell_logs.py) and the arms analysis (trainer/analysis/arms.py), on hand-built configs and synthetic
logs whose verdicts and medians are worked out here."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from trainer import study as cc
from trainer.analysis.arms import (
    ARMS_COLUMNS,
    arm_order,
    arms_run_table,
    arms_summary_table,
    auc,
    figure_curves,
    predictor_table,
)
from trainer.analysis.cell_logs import check_no_axes, load_metrics
from trainer.analysis.pipeline import plot_study, summarize_study
from trainer.analysis.synthetic import cell_path, synthetic_metrics, write_metrics
from trainer.config import config_from_dict

REPO = Path(__file__).resolve().parents[2]


def _study(name: str) -> dict:
    return cc.resolve_base(yaml.safe_load((REPO / name).read_text()), root=REPO, source=REPO / name)


def _arms_study() -> dict:
    study = _study("config.yaml")
    study["study"] = "arms"
    study["grid"] = [
        {"arm": "adamw", "recipes": ["spo_adam"], "seeds": [0, 1], "models": ["qwen-tiny"]},
        {
            "arm": "split",
            "recipes": ["spo_muon"],
            "seeds": [0],
            "models": ["qwen-tiny"],
            "cell": {"optim": {"matrix_lr": 1e-3, "lr": 1e-4, "betas": [0.9, 0.999]}, "rollout": {"lag": 3}},
        },
    ]
    return study


# -- the study model -------------------------------------------------------------------------------------------
def test_arms_add_a_column_and_merge_their_keys_over_the_shared_block():
    study = _arms_study()
    loaded = cc.Study.load(study, root=REPO)
    grid = loaded.grid
    assert list(grid.columns) == ["model", "recipe", "optimizer", "arm", "seed"]
    assert grid.values.tolist() == [
        ["qwen-tiny", "spo_adam", "adam", "adamw", 0],
        ["qwen-tiny", "spo_adam", "adam", "adamw", 1],
        ["qwen-tiny", "spo_muon", "muon", "split", 0],
    ]
    split = loaded.cell_config(cc.CellKey("qwen-tiny", "spo_muon", "muon", 0, arm="split"), model_path="p")
    # the arm's lrs win over the study's `lr:` table (1e-4 for both); the rest of the shared block stays
    assert split["optim"] == {"matrix_lr": 1e-3, "lr": 1e-4, "betas": [0.9, 0.999], "name": "muon"}
    assert split["rollout"]["lag"] == 3 and split["rollout"]["batch_size"] == study["cell"]["rollout"]["batch_size"]
    cfg = config_from_dict(copy.deepcopy(split) | {"model": {"path": str(REPO)}, "rl": {}})  # no offline stats
    assert (cfg.optim.matrix_lr, cfg.optim.lr, cfg.optim.betas, cfg.rollout.lag) == (1e-3, 1e-4, (0.9, 0.999), 3)
    plain = loaded.cell_config(cc.CellKey("qwen-tiny", "spo_adam", "adam", 0, arm="adamw"), model_path="p")
    assert plain["optim"] == {"name": "adam", "lr": 1e-4} and plain["rollout"]["lag"] == 1
    with pytest.raises(KeyError, match="arm 'nope'"):
        loaded.config.arm_keys("nope")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s["grid"][0].pop("arm"), r"grid\[0\].arm: missing; grid\[1\] gives `arm`"),
        (lambda s: s["grid"][0].update(arm="a/b"), r"grid\[0\].arm: 'a/b' is not a folder label"),
        (lambda s: s["grid"][0].update(arm="a\n"), r"grid\[0\].arm: 'a\\n' is not a folder label"),
        (
            lambda s: s["grid"][0].update(arm=1e-3),
            r"grid\[0\].arm: 0.001 is a float, not a string: YAML read it as one; quote the value as written",
        ),
        (lambda s: s["grid"][1].update(arm="adamw"), r"grid\[1\].cell: arm 'adamw' is also grid\[0\]'s"),
        (lambda s: s["grid"][1]["cell"]["optim"].update(name="adam"), r"grid\[1\].cell.optim.name: each cell sets it"),
        (lambda s: s["grid"][1]["cell"].update(run={"seed": 3}), r"grid\[1\].cell.run.seed: each cell sets it"),
        (lambda s: s["grid"][1]["cell"]["optim"].update(betaz=1), r"unknown config key 'grid\[1\].cell.optim.betaz'"),
        (lambda s: s["grid"][1]["cell"]["optim"].update(lr=-1.0), r"grid\[1\].cell.optim.lr"),
        (lambda s: s.update(study="main"), r"grid\[0\].arm: only a `study: arms` has arms"),
        (
            lambda s: [b.pop("arm") for b in s["grid"]] and s["grid"][1].pop("cell"),
            r"grid: a study of arms names one in every block",
        ),
    ],
)
def test_a_bad_arm_is_refused_naming_its_key(change, message):
    study = _arms_study()
    change(study)
    with pytest.raises(cc.StudyError, match=message):
        cc.check_study(study, root=REPO)


def test_a_block_with_trainer_keys_must_be_an_arm():
    study = _study("config.yaml")
    study["grid"][0]["cell"] = {"optim": {"lr": 1e-3}}
    with pytest.raises(cc.StudyError, match=r"grid\[0\].cell: a block's own trainer keys make it an arm"):
        cc.check_study(study, root=REPO)


@pytest.mark.parametrize(
    "study_file, cells",
    [("configs/edge.yaml", 27), ("configs/conditions.yaml", 9), ("configs/companion-equal.yaml", 45)],
)
def test_the_decisive_studies_pass_every_check_and_set_what_they_say(study_file, cells):
    study = _study(study_file)
    loaded = cc.Study.load(study, root=REPO)
    grid = loaded.grid
    assert len(grid) == cells and set(grid["seed"]) == {0, 1, 2}
    configs = {}
    for key in loaded.keys:
        cell = loaded.cell_config(key, model_path=str(REPO))
        cell.get("rl", {}).get("spo", {}).pop("offline_stats", None)  # written by the warm start, not run here
        configs[key.arm] = config_from_dict(cell)
    if study_file == "configs/companion-equal.yaml":
        # the confound removed (AdamW half at 1e-4 whatever the matrices take) beside the companion's own Muon cell
        assert {(c.optim.name, c.optim.matrix_lr, c.optim.lr) for c in configs.values()} == {
            ("adam", 1e-4, 1e-4),
            ("muon", 1e-4, 1e-4),
            ("muon", 1e-3, 1e-4),
            ("adam", 1e-3, 1e-3),
            ("muon", 1e-3, 1e-3),
        }
        assert set(grid["recipe"]) == {"grpo", "gigpo", "graphgpo"}
    elif study_file == "configs/edge.yaml":
        control = configs["control_m1e-4_r1e-3"].optim
        assert (control.name, control.matrix_lr, control.lr) == ("muon", 1e-4, 1e-3)
        assert (configs["muon_m3e-3_r1e-4"].optim.matrix_lr, configs["muon_m3e-3_r1e-4"].optim.lr) == (3e-3, 1e-4)
        assert (configs["adamw_lr1e-3"].optim.name, configs["adamw_lr1e-3"].optim.lr) == ("adam", 1e-3)
        spectral = {arm: c.optim for arm, c in configs.items() if c.optim.adjust_lr_fn == "match_spectral_adamw"}
        assert {(o.matrix_lr, o.lr) for o in spectral.values()} == {(1e-4, 1e-4), (3e-4, 1e-4), (1e-3, 1e-4)}
        assert all(arm.startswith("muon_spectral_") for arm in spectral)
    else:
        assert configs["adamw_b0.999"].optim.betas == (0.9, 0.999) and configs["adamw_b0.95"].optim.betas == (0.9, 0.95)
        for cfg in configs.values():
            assert (cfg.optim.weight_decay, cfg.run.minibatches, cfg.run.skip_no_signal) == (0.01, 8, False)
            assert (cfg.rollout.lag, cfg.rollout.weight_dtype) == (3, "bfloat16")
        adamw_base = {"name": "adam", "matrix_lr": 3e-3}  # E2's AdamW-trained base policy, every matrix at 3e-3
        assert study["warm_start"]["optim"] == loaded.warm_start_config("qwen-tiny")["optim"] == adamw_base


# -- the arm key of the logs -----------------------------------------------------------------------------------
def test_load_metrics_reads_the_arm_folder_and_other_analyses_refuse_it(tmp_path):
    rng = np.random.default_rng(0)
    paths = [
        write_metrics(cell_path(tmp_path, "m", "spo_muon", "muon", 0, arm=arm), synthetic_metrics(4, 0.5, rng))
        for arm in ("a", "123")
    ]
    assert "/optimizer=muon/arm=a/seed=0/" in paths[0].as_posix()
    frame = load_metrics(paths, tmp_path, ("update", "success_rate"))
    assert sorted(set(frame["arm"])) == ["123", "a"] and frame["arm"].dtype == object  # a string, even "123"
    with pytest.raises(ValueError, match="the main analysis has no arms"):
        check_no_axes(frame, "main")
    plain = write_metrics(cell_path(tmp_path, "m", "spo_adam", "adam", 0), synthetic_metrics(4, 0.5, rng))
    with pytest.raises(ValueError, match="some name arm=... folders and some do not"):
        load_metrics([*paths, plain], tmp_path)


# -- the analysis ----------------------------------------------------------------------------------------------
def test_auc_counts_pairs_and_ties_half():
    # collapsed values {3, 2} against surviving {1, 2}: 3>1, 3>2, 2>1 and the tie 2=2 -> (3 + 0.5) / 4
    assert auc(np.array([3, 1, 2, 2]), np.array([True, False, False, True])) == 0.875
    assert auc(np.array([1.0, np.nan, 5.0]), np.array([False, True, True])) == 1.0  # NaN left out
    assert np.isnan(auc(np.array([1.0, 2.0]), np.array([True, True])))


def _two_arms(base: Path, n: int = 40) -> list[Path]:
    """Two arms of the same recipe and optimizer (so only the arm key tells them apart): `hot` collapses at
    update 25 in every seed and its early spectral norm is 1.0 (then 5.0), `cool` never collapses, at 0.25."""
    paths = []
    for arm, collapse_at, early, late in (("hot", 25, 1.0, 5.0), ("cool", None, 0.25, 0.25)):
        for seed in range(3):
            rng = np.random.default_rng(seed)
            columns = synthetic_metrics(n, 0.7, rng, start=0.4, collapse_at=collapse_at, eval_every=10)
            spectral = np.full(n, early)
            if collapse_at is not None:
                spectral[collapse_at:] = late
            spectral[:10] = early + 0.01 * np.arange(10)  # the warm-up's median: early + 0.045
            columns["update_spectral_norm"] = spectral
            columns["embed_head_update_spectral_norm"] = np.full(n, 0.1)
            paths.append(write_metrics(cell_path(base, "qwen-tiny", "spo_muon", "muon", seed, arm=arm), columns))
    return paths


def test_the_run_table_keeps_arms_apart_and_measures_before_the_collapse(tmp_path):
    paths = _two_arms(tmp_path)
    assert arm_order(paths) == ["hot", "cool"]
    runs = arms_run_table(load_metrics(paths, tmp_path, ARMS_COLUMNS), arms=arm_order(paths))
    assert list(runs.columns[:5]) == ["model", "recipe", "optimizer", "arm", "seed"]
    assert runs["arm"].tolist() == ["hot"] * 3 + ["cool"] * 3  # the grid's order, not alphabetical
    hot, cool = runs[runs["arm"] == "hot"], runs[runs["arm"] == "cool"]
    assert hot["collapsed"].all() and not cool["collapsed"].any()
    assert np.allclose(hot["early_update_spectral_norm"], 1.045) and np.allclose(
        cool["early_update_spectral_norm"], 0.295
    )
    # before the collapse: 16 values of 1.0 and nine of 1.01-1.09 (plus any 5.0s between update 25 and the verdict, at
    # most a few): median 1.0; the whole run's median, with its fifteen 5.0s, would be 1.045
    assert np.allclose(hot["update_spectral_norm"], 1.0)
    summary = arms_summary_table(runs)
    assert summary["arm"].tolist() == ["hot", "cool"] and summary["n_collapsed"].tolist() == [3, 0]
    assert summary.loc[0, "collapsed_seeds"] == "0,1,2"
    table = predictor_table(runs).set_index("predictor")
    assert table.loc["update_spectral_norm", "auc"] == 1.0
    assert table.loc["embed_head_update_spectral_norm", "auc"] == 0.5  # every value tied
    assert table.loc["update_spectral_norm", "n_collapsed"] == 3


def test_summarize_and_plot_write_every_output(tmp_path):
    paths = _two_arms(tmp_path / "cells")
    out = tmp_path / "out"
    outputs = [out / "summary.csv", out / "summary.md", out / "runs.parquet"]
    extra = {"predictors": out / "predictors.csv", "hypotheses": out / "hypotheses.csv"}
    notes = summarize_study("arms", paths, tmp_path / "cells", *outputs, extra)
    assert "6 runs, 2 cells" in notes[0] and "update_spectral_norm: AUC 1.000" in notes
    md = (out / "summary.md").read_text()
    assert "## What predicts collapse" in md and "| hidden update top singular value | 6 | 3 | 1.00 |" in md
    assert "Pre-registered" not in md and pd.read_csv(out / "hypotheses.csv").empty  # the study stated none
    assert pd.read_csv(out / "predictors.csv").shape[0] == 4
    # a statement: judged in the table and the page, registered first, a post-hoc claim labelled so
    summarize_study(
        "arms",
        paths,
        tmp_path / "cells",
        *outputs,
        extra,
        preregistration={
            "registered": "before the runs",
            "hypotheses": [
                {"name": "H2", "claim": "later", "arms": ["hot", "cool"], "bases": ["qwen-tiny"], "post_hoc": True},
                {"name": "H1", "claim": "cool beats hot", "arms": ["cool", "hot"], "bases": ["qwen-tiny"]},
            ],
        },
    )
    judged = pd.read_csv(out / "hypotheses.csv")
    assert list(judged["hypothesis"]) == ["H2", "H1"] and list(judged["status"]) == ["post hoc", "registered"]
    md = (out / "summary.md").read_text()
    page = md[md.index("## Pre-registered hypotheses") :]
    assert page.index("| H1 | registered") < page.index("| H2 | post hoc")
    assert "| 3 v 3 seeds of one base |" in page  # one base policy: its seeds are the units (Welch)
    h1 = judged.set_index("hypothesis").loc["H1"]
    assert h1["estimate_pts"] > 0 and h1["verdict"] == "supported"  # cool ends far above hot, which collapsed
    outputs = [out / f"{name}.{ext}" for name in ("arms_curves", "arms_predictors") for ext in ("png", "pdf")]
    written = plot_study("arms", paths, tmp_path / "cells", out / "runs.parquet", outputs)
    assert len(written) == 4 and all(p.stat().st_size > 1000 for p in outputs)


def test_the_curves_have_a_panel_per_recipe_and_arm(tmp_path):
    """Arms of several recipes (the companion at equal step): a row per recipe, a column per arm, each panel only
    its own runs, and a collapse marked only where its own run collapsed."""
    paths = []
    for recipe in ("grpo", "gigpo"):
        for arm, optimizer, collapse_at in (
            ("adamw", "adam", None),
            ("muon", "muon", 20 if recipe == "grpo" else None),
        ):
            columns = synthetic_metrics(30, 0.6, np.random.default_rng(1), start=0.4, collapse_at=collapse_at)
            paths.append(write_metrics(cell_path(tmp_path, "q", recipe, optimizer, 0, arm=arm), columns))
    metrics = load_metrics(paths, tmp_path, ARMS_COLUMNS)
    runs = arms_run_table(metrics, arms=arm_order(paths))
    assert runs["collapsed"].sum() == 1
    fig = figure_curves(metrics, runs)
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 4 and all(len(ax.lines) == 1 for ax in panels)
    # the arm titles each panel; the row's recipe labels the row's first axis (one model: named once, above)
    rows = {ax.get_position().y0: ax.get_ylabel() for ax in panels if ax.get_ylabel()}
    assert sorted(rows.values()) == ["gigpo\nTraining success (%)", "grpo\nTraining success (%)"]
    place = {ax: (rows[ax.get_position().y0].split("\n")[0], ax.get_title()) for ax in panels}
    assert sorted(place.values()) == [("gigpo", "adamw"), ("gigpo", "muon"), ("grpo", "adamw"), ("grpo", "muon")]
    crosses = {
        place[ax]: sum(len(c.get_offsets()) for c in ax.collections if c.get_offsets().size and c.get_sizes()[0] == 55)
        for ax in panels
    }
    assert crosses == {("grpo", "muon"): 1, ("grpo", "adamw"): 0, ("gigpo", "muon"): 0, ("gigpo", "adamw"): 0}
    assert fig._suptitle.get_text().endswith(": q")


def test_panels_of_several_models_in_a_flat_layout_name_their_model(tmp_path):
    """The edge-warmstarts layout: one arm per recipe, several models (base policies), so no table of panels: each
    title names the model beside the arm."""
    paths = []
    for model in ("w1", "w2"):
        for arm, optimizer, recipe in (("adamw", "adam", "spo_adam"), ("muon", "muon", "spo_muon")):
            columns = synthetic_metrics(30, 0.6, np.random.default_rng(1), start=0.4)
            paths.append(write_metrics(cell_path(tmp_path, model, recipe, optimizer, 0, arm=arm), columns))
    metrics = load_metrics(paths, tmp_path, ARMS_COLUMNS)
    fig = figure_curves(metrics, arms_run_table(metrics, arms=arm_order(paths)))
    assert sorted(ax.get_title() for ax in fig.axes if ax.lines) == ["w1: adamw", "w1: muon", "w2: adamw", "w2: muon"]


def test_the_early_medians_stop_at_a_verdict_inside_the_warm_up(tmp_path):
    """A loss that turns NaN at update 3 is a verdict with no warm-up: the early median is of updates 0-2 only."""
    columns = synthetic_metrics(40, 0.7, np.random.default_rng(0), nan_loss_at=3)
    columns["update_spectral_norm"] = np.where(np.arange(40) < 3, 1.0, 9.0)
    path = write_metrics(cell_path(tmp_path, "qwen-tiny", "spo_muon", "muon", 0, arm="nan"), columns)
    runs = arms_run_table(load_metrics([path], tmp_path, ARMS_COLUMNS))
    assert runs.loc[0, "collapse_update"] == 3
    assert runs.loc[0, "early_update_spectral_norm"] == 1.0 and runs.loc[0, "update_spectral_norm"] == 1.0


def test_the_mechanism_is_tested_on_arms_with_an_exact_permutation_p():
    """Four arms in perfect inverse order: rho = -1; of the 24 orderings only this one and its mirror are as extreme,
    so the two-sided p is 2/24; a tie in final success, or fewer than 3 arms, gives no test."""
    from trainer.analysis.arms import arm_rank_correlation

    rho, p = arm_rank_correlation(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.4, 0.3, 0.2, 0.1]))
    assert rho == pytest.approx(-1.0) and p == pytest.approx(2 / 24)
    assert np.isnan(arm_rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([0.2, 0.2, 0.2]))[0])
    assert np.isnan(arm_rank_correlation(np.array([1.0, 2.0]), np.array([0.1, 0.2]))[1])


def test_a_slide_from_the_start_is_judged_degraded_in_an_arms_study(tmp_path):
    """The run table of every kind reads the episodes per update, so a run whose last fifth lies 20 points below its
    first (16 episodes per update) is degraded, one that rises is not."""
    paths = []
    for arm, start, target in (("slides", 0.5, 0.3), ("rises", 0.3, 0.5)):
        columns = synthetic_metrics(100, target, np.random.default_rng(0), start=start)
        columns["n_trajectories"] = np.full(100, 16)
        paths.append(write_metrics(cell_path(tmp_path, "q", "spo_adam", "adam", 0, arm=arm), columns))
    runs = arms_run_table(load_metrics(paths, tmp_path, ARMS_COLUMNS), arms=arm_order(paths)).set_index("arm")
    assert runs.loc["slides", "gain"] < -0.1 and runs.loc["slides", "degraded"]
    assert not runs.loc["rises", "degraded"]
