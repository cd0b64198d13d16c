"""trainer.analysis: reading the cells' logs, the EMA, the collapse rule, windows, t intervals and the summary table.

Known answers are worked out in the comments; runs are built to collapse at a computable update, logs are
written in the workflow's Hive layout by the synthetic writer and by the trainer's own MetricsLog.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.analysis.cell_logs import load_metrics, paper_model
from trainer.analysis.collapse import CollapseCriterion, detect_collapse, ema, ema_by_run, first_sustained, judge
from trainer.analysis.config import AnalysisConfig
from trainer.analysis.kinds import DEFAULT_MODELS, PAPER_NUMBERS, STUDY_KINDS
from trainer.analysis.pipeline import ANALYSES, summarize_study
from trainer.analysis.statistics import t_interval
from trainer.analysis.summary import (
    load_paper_numbers,
    native_optimizer,
    run_table,
    summary_markdown,
    summary_table,
    window_size,
)
from trainer.analysis.synthetic import cell_path, synthetic_metrics, write_metrics
from trainer.logs.parquet_log import METRIC_COLUMNS, MetricsLog
from trainer.recipes import FIGURE2_RECIPES, RECIPES

REPO = Path(__file__).resolve().parents[2]


def run_frame(success, **columns) -> pd.DataFrame:
    """One run's metrics rows: updates 0..n-1 with the given success and any other columns."""
    return pd.DataFrame({"update": np.arange(len(success)), "success_rate": np.asarray(success, float), **columns})


def write_cell(base: Path, model="minicpm-tiny", recipe="full", optimizer="muon", seed=0, **columns) -> Path:
    n = len(columns["success_rate"])
    return write_metrics(cell_path(base, model, recipe, optimizer, seed), {"update": np.arange(n), **columns})


# -- EMA ---------------------------------------------------------------------------------------------------
def test_ema_matches_hand_computed_recursion_not_pandas_default():
    # alpha = 2 / (5 + 1) = 1/3; y0 = 1; y1 = 2/3*1 + 1/3*3 = 5/3; y2 = 2/3*5/3 + 1/3*2 = 16/9;
    # y3 = 2/3*16/9 + 10/3 = 122/27; y4 = 2/3*122/27 + 4/3 = 352/81.
    assert ema([1, 3, 2, 10, 4], 5) == pytest.approx([1, 5 / 3, 16 / 9, 122 / 27, 352 / 81])
    # pandas' default adjust=True would give (1*2/3 + 3) / (2/3 + 1) = 2.2 at index 1: not what we use.
    assert pd.Series([1.0, 3.0]).ewm(span=5).mean().iloc[1] == pytest.approx(2.2)
    assert ema([1, 3], 5)[1] != pytest.approx(2.2)


def test_ema_skips_missing_values_and_keeps_leading_nan():
    # [1, nan, 3]: the NaN carries 1 forward, then 2/3*1 + 1/3*3 = 5/3 (ignore_na=True).
    assert ema([1, np.nan, 3], 5) == pytest.approx([1, 1, 5 / 3])
    out = ema([np.nan, 2, 2], 5)
    assert np.isnan(out[0]) and out[1:] == pytest.approx([2, 2])


@pytest.mark.parametrize("span", [0, -1, 2.5, True])
def test_ema_rejects_bad_span(span):
    with pytest.raises(ValueError, match="span"):
        ema([1.0, 2.0], span)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.integers(1, 12))
def test_ema_is_the_first_observation_recursion(values, span):
    alpha, expected = 2 / (span + 1), [values[0]]
    for x in values[1:]:
        expected.append((1 - alpha) * expected[-1] + alpha * x)
    assert ema(values, span) == pytest.approx(expected, abs=1e-12)


def test_grouped_ema_equals_per_run_ema():
    rng = np.random.default_rng(0)
    rows = [
        pd.DataFrame(
            {
                "model": "m",
                "recipe": r,
                "optimizer": "muon",
                "seed": s,
                "update": np.arange(n),
                "success_rate": rng.random(n),
            }
        )
        for r, s, n in [("full", 0, 7), ("full", 1, 3), ("spo_muon", 0, 12)]
    ]
    frame = pd.concat(rows, ignore_index=True)
    grouped = ema_by_run(frame, 5)
    expected = np.concatenate([ema(r["success_rate"], 5) for r in rows])
    assert grouped == pytest.approx(expected)


# -- the collapse rule -------------------------------------------------------------------------------------
def test_first_sustained_hand_examples():
    c = np.array([0, 1, 1, 0, 1, 1, 1], bool)
    assert first_sustained(c, start=0, patience=1) == 4  # the all-True tail starts after the last False (3)
    assert first_sustained(c, start=5, patience=1) == 5  # not before the warm-up
    assert first_sustained(c, start=0, patience=4) is None  # the tail is only 3 long
    assert first_sustained(np.ones(4, bool), 0, 4) == 0
    assert first_sustained(np.zeros(4, bool), 0, 1) is None
    assert first_sustained(np.ones(3, bool), start=5, patience=1) is None  # warm-up longer than the run


def test_run_built_to_collapse_is_flagged_at_the_right_update():
    # 0.6 for updates 0..19, then 0. The EMA is exactly 0.6 up to 19 (peak 0.6, line 0.3), then
    # 0.6 * (2/3)^k: update 20 -> 0.4 (above 0.3), update 21 -> 0.2667 (below, and stays below) -> collapse 21.
    verdict = detect_collapse(run_frame([0.6] * 20 + [0.0] * 20))
    assert (verdict.collapsed, verdict.update, verdict.reason) == (True, 21, "success_drop")


def test_flat_run_and_never_learning_run_do_not_collapse():
    assert not detect_collapse(run_frame([0.5] * 100)).collapsed
    # Peak EMA 0.05 < min_peak 0.1: falling from 5% to 0 is not a collapse, the run never learned.
    assert not detect_collapse(run_frame([0.05] * 30 + [0.0] * 70)).collapsed
    # With a lower min_peak it is one: EMA 0.05 * (2/3)^k < 0.025 first at k=2, i.e. update 31.
    verdict = detect_collapse(run_frame([0.05] * 30 + [0.0] * 70), CollapseCriterion(min_peak=0.01))
    assert verdict.update == 31


def test_a_dip_that_recovers_is_not_a_collapse_but_a_final_drop_is():
    # After 10 zeros the EMA is 0.6*(2/3)^10 = 0.0104; back at 0.6 it climbs to 0.207 then 0.338 > 0.3.
    recovers = [0.6] * 20 + [0.0] * 10 + [0.6] * 20
    assert not detect_collapse(run_frame(recovers)).collapsed
    # The same, then a final drop at update 50: the verdict is the start of the unrecovered drop, 51.
    verdict = detect_collapse(run_frame(recovers + [0.0] * 20))
    assert (verdict.collapsed, verdict.update) == (True, 51)


def test_warmup_and_patience():
    # Drop below half the peak at update 3 (0.6, 0.6, then 0.4, 0.267...): not flagged before the warm-up.
    run = run_frame([0.6] * 2 + [0.0] * 28)
    assert detect_collapse(run, CollapseCriterion(warmup=10)).update == 10
    assert detect_collapse(run, CollapseCriterion(warmup=0)).update == 3
    # A drop in the last 3 updates (97..99 below the line from 98) is too short for patience 5 ...
    late = run_frame([0.6] * 97 + [0.0] * 3)
    assert not detect_collapse(late).collapsed
    # ... but counts with patience 2 (updates 98, 99).
    assert detect_collapse(late, CollapseCriterion(patience=2)).update == 98


def test_nonfinite_loss_collapses_at_first_occurrence_even_in_warmup():
    loss = np.zeros(30)
    loss[7] = np.nan
    verdict = detect_collapse(run_frame([0.5] * 30, loss=loss, grad_norm=np.ones(30)))
    assert (verdict.update, verdict.reason) == (7, "nonfinite_loss")
    grad = np.ones(30)
    grad[4] = np.inf
    verdict = detect_collapse(run_frame([0.5] * 30, loss=loss, grad_norm=grad))
    assert (verdict.update, verdict.reason) == (4, "nonfinite_grad_norm")
    assert not detect_collapse(run_frame([0.5] * 30, loss=loss), CollapseCriterion(nonfinite=())).collapsed


def test_earliest_sign_wins():
    # Success collapses at 21 (see above) but the loss is NaN from 25: the verdict is the earlier one.
    loss = np.zeros(40)
    loss[25:] = np.nan
    verdict = detect_collapse(run_frame([0.6] * 20 + [0.0] * 20, loss=loss))
    assert (verdict.update, verdict.reason) == (21, "success_drop")


def test_entropy_floor_is_off_by_default_and_fires_when_set():
    entropy = np.r_[np.ones(15), np.full(15, 0.01)]
    run = run_frame([0.5] * 30, entropy=entropy)
    assert not detect_collapse(run).collapsed
    verdict = detect_collapse(run, CollapseCriterion(entropy_floor=0.1))
    assert (verdict.update, verdict.reason) == (15, "entropy_floor")
    with pytest.raises(ValueError, match="entropy"):
        detect_collapse(run_frame([0.5] * 30), CollapseCriterion(entropy_floor=0.1))


def test_collapse_update_is_the_logged_update_not_the_row_index():
    run = run_frame([0.6] * 20 + [0.0] * 20)
    run["update"] += 100  # a run whose log starts at update 100 (e.g. resumed)
    assert detect_collapse(run.iloc[::-1]).update == 121  # any row order


@pytest.mark.parametrize(
    "params, match",
    [
        ({"drop_fractoin": 0.5}, "drop_fractoin"),
        ({"drop_fraction": 1.5}, "drop_fraction"),
        ({"warmup": -1}, "warmup"),
        ({"ema_span": 0}, "ema_span"),
        ({"min_peak": 0}, "min_peak"),
        ({"patience": 0}, "patience"),
        ({"entropy_floor": float("nan")}, "entropy_floor"),
        ({"nonfinite": ["entropy"]}, "nonfinite"),
    ],
)
def test_bad_criterion_names_the_field(params, match):
    with pytest.raises(ValueError, match=match):
        CollapseCriterion.from_dict(params)


def test_criterion_from_config_dict():
    criterion = CollapseCriterion.from_dict({"warmup": 5, "nonfinite": ["loss"], "entropy_floor": 0.2})
    assert (criterion.warmup, criterion.nonfinite, criterion.entropy_floor) == (5, ("loss",), 0.2)
    assert CollapseCriterion.from_dict(None) == CollapseCriterion()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=60), st.integers(0, 15), st.integers(1, 8), st.floats(0.2, 0.8))
def test_collapse_verdict_satisfies_its_definition(success, warmup, patience, fraction):
    criterion = CollapseCriterion(warmup=warmup, patience=patience, drop_fraction=fraction, nonfinite=())
    verdict = detect_collapse(run_frame(success), criterion)
    smooth = ema(success, 5)
    peak = np.maximum.accumulate(smooth)
    below = (peak >= criterion.min_peak) & (smooth < fraction * peak)
    if verdict.collapsed:
        t = verdict.update
        assert t >= warmup and len(success) - t >= patience
        assert below[t:].all()  # stays below from t to the end: no recovery
        assert t == warmup or not below[t - 1 :].all()  # and t is the earliest such update
    else:
        tail = len(below) - (np.flatnonzero(~below)[-1] + 1 if (~below).any() else 0)
        assert min(tail, len(below) - warmup) < patience  # no sustained drop long enough after the warm-up


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=60))
def test_non_decreasing_success_never_collapses(values):
    assert not detect_collapse(run_frame(sorted(values)), CollapseCriterion(warmup=0, patience=1)).collapsed


# -- reading logs ------------------------------------------------------------------------------------------
def test_load_metrics_reads_hive_keys_sorts_and_flags_nonfinite(tmp_path):
    base = tmp_path / "results" / "cells"
    loss = np.array([0.1, np.nan, 0.3, np.inf])
    paths = [
        write_cell(base, "qwen-tiny", "spo_adam", "adam", 2, success_rate=[0.1, 0.2, 0.3, 0.4], loss=loss),
        write_cell(base, "minicpm-tiny", "full", "muon", 10, success_rate=[0.5, 0.6, 0.7, 0.8], loss=loss),
    ]
    frame = load_metrics(paths, base)
    assert list(frame["model"].unique()) == ["minicpm-tiny", "qwen-tiny"]  # sorted by run, then update
    assert frame["seed"].tolist() == [10] * 4 + [2] * 4 and frame["seed"].dtype == np.int64
    assert frame["update"].tolist() == [0, 1, 2, 3] * 2
    assert frame.loc[frame["model"] == "qwen-tiny", "success_rate"].tolist() == [0.1, 0.2, 0.3, 0.4]
    assert frame["nonfinite_loss"].tolist() == [False, True, False, True] * 2
    # Columns the synthetic file did not write are read as null, and null is not "non-finite".
    assert frame["grad_norm"].isna().all() and not frame["nonfinite_grad_norm"].any()
    assert set(METRIC_COLUMNS) <= set(frame.columns)


def test_load_metrics_accepts_relative_paths_and_a_column_subset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_cell(Path("results/cells"), success_rate=[0.25, 0.75], loss=[1.0, 2.0])
    frame = load_metrics([str(path)], "results/cells", columns=["success_rate"])
    assert list(frame.columns) == ["update", "success_rate", "model", "recipe", "optimizer", "seed"]
    assert frame["success_rate"].tolist() == [0.25, 0.75]
    with pytest.raises(ValueError, match="succes_rate"):
        load_metrics([str(path)], "results/cells", columns=["succes_rate"])


def test_load_metrics_reads_a_trainer_written_log_with_null_eval(tmp_path):
    base = tmp_path / "cells"
    log = MetricsLog(cell_path(base, "minicpm-tiny", "no_tool", "muon", 1), {"config": {"run": {"seed": 1}}})
    log.append({"update": 0, "success_rate": 0.5, "loss": float("nan")})
    log.append({"update": 1, "success_rate": 1.0, "loss": 0.2, "eval_success": 0.25})
    log.flush()
    frame = load_metrics([log.path], base)
    assert frame["recipe"].tolist() == ["no_tool"] * 2 and frame["seed"].tolist() == [1, 1]
    assert frame["nonfinite_loss"].tolist() == [True, False]
    assert np.isnan(frame["eval_success"].iloc[0]) and frame["eval_success"].iloc[1] == 0.25


def test_load_metrics_bad_inputs_are_named(tmp_path):
    base = tmp_path / "cells"
    good = write_cell(base, success_rate=[0.5])
    with pytest.raises(ValueError, match="empty"):
        load_metrics([], base)
    with pytest.raises(TypeError, match="single path"):
        load_metrics(str(good), base)
    with pytest.raises(ValueError, match="not under base_dir"):
        load_metrics([good], tmp_path / "elsewhere")
    no_seed = write_metrics(
        base / "model=m" / "recipe=full" / "optimizer=muon" / "metrics.parquet", {"update": [0], "success_rate": [0.5]}
    )
    with pytest.raises(ValueError, match="seed"):
        load_metrics([no_seed], base)
    with pytest.raises(FileNotFoundError, match="seed=7"):
        load_metrics([cell_path(base, "m", "full", "muon", 7)], base)
    with pytest.raises(ValueError, match="twice"):
        load_metrics([good, good], base)
    twice = cell_path(base, "m", "full", "muon", 3)
    write_metrics(twice, {"update": [0, 0], "success_rate": [0.5, 0.5]})
    with pytest.raises(ValueError, match="update logged twice"):
        load_metrics([twice], base)


def test_paper_model_mapping_is_a_parameter():
    assert paper_model("minicpm-tiny") == "MiniCPM5-2B" and paper_model("qwen-tiny") == "Qwen3.5-4B"
    assert paper_model("Qwen3.5-4B") == "Qwen3.5-4B"  # paper scale: the model is named as in the paper
    assert paper_model("minicpm-tiny", {"minicpm-tiny": "Other"}) == "Other"
    assert DEFAULT_MODELS == {"minicpm-tiny": "MiniCPM5-2B", "qwen-tiny": "Qwen3.5-4B"}


# -- windows, runs, intervals, summary ---------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(100, 10), (101, 11), (30, 3), (15, 2), (9, 1), (3, 1), (1, 1)])
def test_window_is_the_last_tenth_and_at_least_one_update(n, k):
    assert window_size(n, 0.1) == k


def test_window_rejects_bad_fraction():
    with pytest.raises(ValueError, match="window_fraction"):
        window_size(100, 0.0)


def metrics_of(runs: dict[tuple, dict]) -> pd.DataFrame:
    """A load_metrics-like table from {(model, recipe, optimizer, seed): columns}."""
    parts = []
    for (model, recipe, optimizer, seed), columns in runs.items():
        n = len(columns["success_rate"])
        parts.append(
            pd.DataFrame(
                {
                    "model": model,
                    "recipe": recipe,
                    "optimizer": optimizer,
                    "seed": seed,
                    "update": np.arange(n),
                    **columns,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def test_run_table_window_mean_eval_and_verdict():
    ramp = np.arange(100) / 100  # window 90..99: mean of 0.90..0.99 = 0.945
    evals = np.full(100, np.nan)
    evals[[49, 99]] = [0.3, 0.4]
    metrics = metrics_of(
        {
            ("minicpm-tiny", "full", "muon", 0): {"success_rate": ramp, "eval_success": evals},
            ("minicpm-tiny", "spo_adam", "adam", 0): {"success_rate": [0.6] * 20 + [0.0] * 20},
            ("qwen-tiny", "full", "muon", 1): {"success_rate": [0.2, 0.4, 0.9]},
        }
    )
    runs = run_table(metrics).set_index(["model", "recipe", "optimizer", "seed"])
    full = runs.loc[("minicpm-tiny", "full", "muon", 0)]
    assert full["window_success"] == pytest.approx(0.945)
    assert (full["window_first"], full["window_last"], full["n_updates"]) == (90, 99, 100)
    assert (full["eval_success"], full["eval_update"]) == (0.4, 99)  # the last evaluation
    assert full["paper_model"] == "MiniCPM5-2B" and not full["collapsed"]
    adam = runs.loc[("minicpm-tiny", "spo_adam", "adam", 0)]
    assert (adam["collapsed"], adam["collapse_update"], adam["collapse_reason"]) == (True, 21, "success_drop")
    assert adam["window_success"] == 0.0 and (adam["window_first"], adam["window_last"]) == (36, 39)
    smoke = runs.loc[("qwen-tiny", "full", "muon", 1)]  # 3 updates: the window is the last one
    assert smoke["window_success"] == 0.9 and smoke["window_first"] == 2 and np.isnan(smoke["eval_success"])


def test_run_table_rejects_a_window_without_success():
    metrics = metrics_of({("m", "full", "muon", 0): {"success_rate": [0.5, np.nan]}})
    with pytest.raises(ValueError, match="no success_rate"):
        run_table(metrics)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), min_size=1, max_size=40), min_size=1, max_size=4))
def test_run_table_verdicts_equal_detect_collapse(runs):
    criterion = CollapseCriterion(warmup=3, patience=2)
    metrics = metrics_of({("m", "full", "muon", s): {"success_rate": r} for s, r in enumerate(runs)})
    table = run_table(metrics, criterion)
    for s, r in enumerate(runs):
        verdict = detect_collapse(run_frame(r), criterion)
        row = table[table["seed"] == s].iloc[0]
        assert row["collapsed"] == verdict.collapsed
        assert (pd.isna(row["collapse_update"]) and verdict.update is None) or row["collapse_update"] == verdict.update


def test_judge_core_matches_hand_example():
    smooth = ema([0.6] * 20 + [0.0] * 20, 5)
    assert judge(smooth) == (21, "success_drop")
    assert judge(smooth, {"loss": np.arange(40) == 30}) == (21, "success_drop")
    assert judge(ema([0.5] * 10, 5), {"loss": np.arange(10) == 2}) == (2, "nonfinite_loss")


T_975_DF1 = math.tan(math.pi * (0.975 - 0.5))
"""Student's t 97.5% quantile at 1 df (the Cauchy quantile, tan(pi (p - 1/2))): 12.7062..."""
T_975_DF2 = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)
"""At 2 df, (2p - 1) / sqrt(2 p (1 - p)): 4.3026..."""


def test_t_interval_known_cases():
    assert all(math.isnan(x) for x in t_interval([0.7]))  # one seed: no interval
    assert t_interval([0.4, 0.4, 0.4]) == (pytest.approx(0.4), pytest.approx(0.4))  # no spread: zero width
    # 20, 40, 60 (percent): mean 40, sd 20, se 20 / sqrt(3), half-width t(0.975, 2) x se = 49.68...
    half = T_975_DF2 * 20 / math.sqrt(3)
    assert half == pytest.approx(49.6827, abs=1e-4)
    assert t_interval([20.0, 40.0, 60.0]) == (pytest.approx(40 - half, rel=1e-9), pytest.approx(40 + half, rel=1e-9))
    # 0 and 1: mean 0.5, sd 1 / sqrt(2), se 1/2, half-width t(0.975, 1) / 2 = 6.35...
    assert t_interval([0.0, 1.0]) == (pytest.approx(0.5 - T_975_DF1 / 2), pytest.approx(0.5 + T_975_DF1 / 2))
    with pytest.raises(ValueError, match="non-finite"):
        t_interval([0.5, np.nan])
    with pytest.raises(ValueError, match="level"):
        t_interval([0.5, 0.6], level=1.0)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(0, 100), min_size=2, max_size=12),
    st.floats(0.1, 10),
    st.floats(-100, 100),
)
def test_t_interval_is_centred_on_the_mean_and_moves_with_the_data(values, scale, shift):
    low, high = t_interval(values)
    mean = float(np.mean(values))
    assert low <= mean <= high and (high - mean) == pytest.approx(mean - low, abs=1e-9)
    moved = t_interval([scale * v + shift for v in values])
    assert moved == (pytest.approx(scale * low + shift, abs=1e-6), pytest.approx(scale * high + shift, abs=1e-6))


def test_paper_numbers_ship_with_the_package_and_name_their_source():
    paper = load_paper_numbers()
    assert len(paper) == 16 and set(paper["source"]) == {"Ruan et al. 2026, Figure 2"}
    assert set(paper["recipe"]) == set(FIGURE2_RECIPES) and set(FIGURE2_RECIPES) <= set(RECIPES)
    assert all(native_optimizer(r) == o for r, o in zip(paper["recipe"], paper["optimizer"]))
    value = paper.set_index(["model", "recipe"])["success_updates_90_100_pct"]
    assert value[("MiniCPM5-2B", "full")] == 74.1 and value[("Qwen3.5-4B", "spo_muon")] == 18.2


def runs_of(rows: list[tuple]) -> pd.DataFrame:
    """A per-run table from (model, recipe, optimizer, seed, window_success, collapsed, eval_success)."""
    columns = ["model", "recipe", "optimizer", "seed", "window_success", "collapsed", "eval_success"]
    runs = pd.DataFrame(rows, columns=columns)
    return runs.assign(paper_model=[paper_model(m) for m in runs["model"]])


def test_summary_table_beside_the_paper():
    runs = runs_of(
        [
            ("minicpm-tiny", "full", "muon", 0, 0.7, False, 0.5),
            ("minicpm-tiny", "full", "muon", 1, 0.8, False, np.nan),
            ("minicpm-tiny", "full", "muon", 2, 0.9, True, 0.7),
            ("minicpm-tiny", "full", "adam", 0, 0.1, True, np.nan),
            ("qwen-tiny", "spo_adam", "adam", 4, 0.2, False, np.nan),
        ]
    )
    summary = summary_table(runs).set_index(["model", "recipe", "optimizer"])
    full = summary.loc[("minicpm-tiny", "full", "muon")]
    assert full["success_pct_mean"] == pytest.approx(80.0)  # (70 + 80 + 90) / 3
    assert full["paper_success_pct"] == 74.1 and full["diff_pct_points"] == pytest.approx(5.9)
    half = T_975_DF2 * 10 / math.sqrt(3)  # sd of 70, 80, 90 is 10
    assert (full["success_pct_ci_low"], full["success_pct_ci_high"]) == (
        pytest.approx(80 - half),
        pytest.approx(80 + half),
    )
    assert (full["n_seeds"], full["seeds"], full["n_collapsed"], full["collapsed_seeds"]) == (3, "0,1,2", 1, "2")
    assert full["eval_success_pct_mean"] == pytest.approx(60.0) and full["n_eval_seeds"] == 2  # (50 + 70) / 2
    assert "Ruan et al. 2026, Figure 2" in full["paper_source"]
    adam = summary.loc[("minicpm-tiny", "full", "adam")]  # an Adam version the paper did not report
    assert math.isnan(adam["paper_success_pct"]) and math.isnan(adam["diff_pct_points"])
    assert math.isnan(adam["success_pct_ci_low"])  # one seed
    qwen = summary.loc[("qwen-tiny", "spo_adam", "adam")]
    assert qwen["paper_success_pct"] == 18.0 and qwen["diff_pct_points"] == pytest.approx(2.0)
    assert math.isnan(qwen["eval_success_pct_mean"]) and qwen["n_eval_seeds"] == 0
    # Reading order: models as configured, recipes in Figure 2 order, then optimizer.
    assert list(summary.index) == [
        ("minicpm-tiny", "full", "adam"),
        ("minicpm-tiny", "full", "muon"),
        ("qwen-tiny", "spo_adam", "adam"),
    ]


def test_summary_markdown_shows_the_numbers():
    runs = runs_of(
        [
            ("minicpm-tiny", "full", "muon", 0, 0.7, False, 0.5),
            ("minicpm-tiny", "full", "muon", 1, 0.9, True, np.nan),
            ("minicpm-tiny", "spo_muon", "muon", 0, 0.5, False, np.nan),
        ]
    )
    text = summary_markdown(summary_table(runs), notes=["no runs of model(s) qwen-tiny in these logs"])
    rows = [line for line in text.split("## Learning")[0].splitlines() if line.startswith("| minicpm-tiny")]
    assert len(rows) == 2
    assert "| 80.0 |" in rows[1] and "| 74.1 |" in rows[1] and "| 5.9 |" in rows[1]  # (70+90)/2 = 80 vs 74.1
    assert "1/2 (seeds 1)" in rows[1] and "| 60.0 |" not in rows[1]
    assert "| n/a |" in rows[0] and "| 50.0 |" in rows[0] and "| 45.2 |" in rows[0]  # one seed, vs 45.2
    assert "- no runs of model(s) qwen-tiny in these logs" in text
    assert "over the last 10% of each run's updates" in text
    assert "over the last 25% of each run's updates" in summary_markdown(summary_table(runs), window_fraction=0.25)


def test_learning_is_the_last_fifth_minus_the_first_and_held_out_first_to_last():
    """Per run: success over the last fifth of the updates minus over the first fifth, the first and the last
    evaluation, the informed-baseline share; per cell: their means over seeds with an interval for the learning."""
    rows = []
    for seed, (early, late) in enumerate([(0.2, 0.6), (0.3, 0.5)]):
        for u in range(10):  # fifths of 10 updates: 2 updates each
            success = early if u < 2 else late if u >= 8 else 0.9
            rows.append(
                {
                    "model": "m",
                    "recipe": "full",
                    "optimizer": "muon",
                    "seed": seed,
                    "update": u,
                    "success_rate": success,
                    "eval_success": {0: 0.1 * (seed + 1), 9: 0.5}.get(u, np.nan),
                    "baseline_informed_frac": 0.5 if u < 5 else 1.0,
                }
            )
    runs = run_table(pd.DataFrame(rows), CollapseCriterion(min_peak=1.0), models={"m": "M"})
    assert runs["gain"].tolist() == pytest.approx([0.4, 0.2])
    assert runs["eval_first"].tolist() == pytest.approx([0.1, 0.2]) and runs["eval_success"].tolist() == [0.5, 0.5]
    assert runs["informed_frac"].tolist() == pytest.approx([0.75, 0.75])
    cell = summary_table(runs).iloc[0]
    # learning 40 and 20 points: mean 30, se = sd / sqrt(2) = 10, half-width t(0.975, 1) x 10 = 127.06
    assert cell["gain_pct_mean"] == pytest.approx(30.0)
    assert (cell["gain_pct_ci_low"], cell["gain_pct_ci_high"]) == (
        pytest.approx(30 - 10 * T_975_DF1),
        pytest.approx(30 + 10 * T_975_DF1),
    )
    assert cell["eval_first_pct_mean"] == pytest.approx(15.0) and cell["informed_pct_mean"] == pytest.approx(75.0)
    text = summary_markdown(summary_table(runs))
    assert "| m | full | muon | 2 | +30.0 | [-97.1, +157.1] | 15.0 -> 50.0 | 75.0 |" in text


def test_summarize_writes_the_three_outputs(tmp_path):
    base = tmp_path / "results" / "cells"
    rng = np.random.default_rng(0)
    paths = []
    for seed in range(2):
        paths.append(
            write_metrics(cell_path(base, "minicpm-tiny", "full", "muon", seed), synthetic_metrics(40, 0.8, rng))
        )
        paths.append(
            write_metrics(
                cell_path(base, "minicpm-tiny", "spo_adam", "adam", seed),
                synthetic_metrics(40, 0.5, rng, collapse_at=25, optimizer="adam"),
            )
        )
    out = tmp_path / "results"
    notes = summarize_study(
        "main", paths, base, out / "summary.csv", out / "summary.md", out / "runs.parquet", collapse={"warmup": 5}
    )
    summary, runs = pd.read_csv(out / "summary.csv"), pd.read_parquet(out / "runs.parquet")
    assert len(summary) == 2 and len(runs) == 4
    assert runs.loc[runs["recipe"] == "spo_adam", "collapsed"].all()
    assert not runs.loc[runs["recipe"] == "full", "collapsed"].any()
    # The window (updates 36..39) means agree between the runs table and the summary.
    full_mean = 100 * runs.loc[runs["recipe"] == "full", "window_success"].mean()
    assert summary.loc[summary["recipe"] == "full", "success_pct_mean"].iloc[0] == pytest.approx(full_mean, abs=1e-4)
    assert "| minicpm-tiny | MiniCPM5-2B | full | muon | 2 |" in (out / "summary.md").read_text()
    assert any("qwen-tiny" in n for n in notes) and "4 runs" in notes[0]
    assert pq.read_schema(out / "runs.parquet").field("collapse_update").type == pa.int64()
    # The paper's numbers are the file given: a copy with one value changed changes the table, nothing else.
    numbers = tmp_path / "numbers.csv"
    paper = pd.read_csv(PAPER_NUMBERS)
    paper.loc[(paper["model"] == "MiniCPM5-2B") & (paper["recipe"] == "full"), "success_updates_90_100_pct"] = 12.5
    paper.to_csv(numbers, index=False)
    summarize_study(
        "main",
        paths,
        base,
        out / "edited.csv",
        out / "edited.md",
        out / "edited.parquet",
        collapse={"warmup": 5},
        numbers=numbers,
    )
    edited = pd.read_csv(out / "edited.csv")
    full = edited["recipe"] == "full"
    assert summary.loc[full, "paper_success_pct"].tolist() == [74.1]
    assert edited.loc[full, "paper_success_pct"].tolist() == [12.5]
    assert edited.loc[full, "diff_pct_points"].iloc[0] == pytest.approx(
        edited.loc[full, "success_pct_mean"].iloc[0] - 12.5, abs=1e-3
    )
    pd.testing.assert_frame_equal(
        edited.drop(columns=["paper_success_pct", "diff_pct_points"]),
        summary.drop(columns=["paper_success_pct", "diff_pct_points"]),
    )


# -- the kinds of study ------------------------------------------------------------------------------------
def test_the_workflow_reads_the_kinds_without_matplotlib():
    """common.smk imports `trainer.analysis.kinds` while it builds the DAG: nothing heavy may come with it."""
    code = (
        "import sys\nimport trainer.analysis.kinds\n"
        "print(sorted(m for m in ('matplotlib', 'seaborn', 'pandas', 'pyarrow', 'torch') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_every_kind_of_study_has_its_analysis():
    """The workflow's records and the pipeline's name the same kinds, and what a record declares exists."""
    assert list(ANALYSES) == list(STUDY_KINDS)
    for name, kind in STUDY_KINDS.items():
        assert kind.numbers is None or kind.numbers.is_file(), name
        assert ANALYSES[name].axis == {"stability": "lr", "arms": "arm"}.get(name), name


def test_library_defaults_are_the_workflows():
    """A call without the analysis parameters gets the study's defaults (trainer/analysis/config.py): the
    pipeline's settings for every kind, and the collapse rule of an empty `collapse:` section."""
    from trainer.analysis.pipeline import settings_for

    defaults = AnalysisConfig()
    for kind in STUDY_KINDS.values():
        settings = settings_for(kind)
        assert (settings.window_fraction, settings.ema_span) == (defaults.window_fraction, defaults.ema_span)
        assert settings.numbers == kind.numbers and dict(settings.models) == dict(kind.default_models)
    assert CollapseCriterion.from_dict(defaults.collapse) == CollapseCriterion()


def test_the_summary_csv_keeps_small_numbers(tmp_path):
    """A 3e-5 learning rate must not print as 0.0000 (the stability study's lrs and the step sizes are that small)."""
    import pandas as pd

    from trainer.analysis.summary import write_tables

    table = pd.DataFrame({"lr": [3e-5, 1e-4], "final_pct_mean": [38.75, 42.5], "update_rms": [6.7e-05, 4.3e-05]})
    write_tables(table, "", table, tmp_path / "s.csv", tmp_path / "s.md", tmp_path / "r.parquet")
    back = pd.read_csv(tmp_path / "s.csv")
    assert back["lr"].tolist() == [3e-5, 1e-4] and back["update_rms"].tolist() == [6.7e-05, 4.3e-05]
    assert back["final_pct_mean"].tolist() == [38.75, 42.5]
