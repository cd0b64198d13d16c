"""Published results as data (trainer/published.py): the committed studies are of this trainer version,
`publish` records where its numbers came from, `compare` tells identical, within-interval and outside runs apart."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer import TRAINER_VERSION
from trainer.logs.parquet_log import PROVENANCE_KEY
from trainer.published import KEYS, compare, main, publish, read_published, version_at

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = sorted(p.parent for p in (ROOT / "docs" / "results").glob("*/provenance.json"))


def test_every_published_study_is_of_this_trainer_version_and_complete():
    """Fails when the trainer's version moves past a committed study: rerun and republish it, or bump knowingly."""
    assert PUBLISHED, "no published study under docs/results/"
    for folder in PUBLISHED:
        runs, prov = read_published(folder)
        assert prov["trainer_version"] == TRAINER_VERSION, f"{folder}: version {prov['trainer_version']}"
        keys = [k for k in KEYS if k in runs.columns]
        assert len(runs) == prov["n_cells"] and not runs.duplicated(keys).any()
        assert len(prov["study_sha256"]) == 64 and prov["commits"]
        summary = pd.read_csv(folder / "summary.csv")
        assert summary["n_seeds"].sum() == len(runs), folder


def _runs(shift: dict | None = None) -> pd.DataFrame:
    rows = []
    for recipe, base in (("spo_adam", 0.40), ("full", 0.60)):
        for seed in range(3):
            value = base + 0.02 * seed
            rows.append(
                {
                    "model": "qwen-tiny",
                    "recipe": recipe,
                    "optimizer": "muon",
                    "seed": seed,
                    "window_success": value,
                    "gain": value / 2,
                    "eval_success": value - 0.1,
                    "eval_first": 0.3,
                    "collapsed": False,
                }
            )
    frame = pd.DataFrame(rows)
    for (recipe, seed, column), value in (shift or {}).items():
        frame.loc[(frame["recipe"] == recipe) & (frame["seed"] == seed), column] = value
    return frame


def test_compare_tells_identical_within_outside_missing_and_extra_apart():
    published = _runs()
    assert set(compare(_runs(), published)["status"]) == {"identical"}
    # seed 1 of `full` 0.62 -> 0.615: a draw of the published seeds' distribution (0.60, 0.62, 0.64; sd 0.02)
    near = compare(_runs({("full", 1, "window_success"): 0.615}), published).set_index(["recipe", "seed"])
    assert near.loc[("full", 1), "status"] == "within" and "window_success" in near.loc[("full", 1), "detail"]
    assert (near.drop(index=[("full", 1)])["status"] == "identical").all()
    # 0.9 for a seed: rerun mean 0.7133 vs 0.62, sd 0.02: t = 0.0933 / (0.02 sqrt(2/3)) = 5.72 on 2 df, p = 0.029
    far = compare(_runs({("full", 1, "window_success"): 0.9}), published).set_index(["recipe", "seed"])
    assert far.loc[("full", 1), "status"] == "outside" and "t = +5.72 on 2 df" in far.loc[("full", 1), "detail"]
    # a collapse is told, not tested (a binary verdict at 3 seeds)
    told = compare(_runs({("full", 1, "collapsed"): True}), published).set_index(["recipe", "seed"])
    assert told.loc[("full", 1), "status"] == "within"
    assert "collapsed in 1 of 3 rerun seeds, 0 of 3 published" in told.loc[("full", 1), "detail"]
    rerun = pd.concat([_runs().iloc[1:], _runs().iloc[[0]].assign(seed=7)])
    table = compare(rerun, published).set_index(["recipe", "seed"])
    assert table.loc[("spo_adam", 0), "status"] == "missing" and table.loc[("spo_adam", 7), "status"] == "extra"
    # one published seed: no spread to judge by, said rather than failed
    single = compare(_runs({("full", 0, "gain"): 0.5}).query("seed == 0"), published.query("seed == 0"))
    row = single.set_index("recipe").loc["full"]
    assert row["status"] == "untestable" and "one published seed" in row["detail"]


@pytest.mark.slow
def test_an_equivalent_rerun_of_many_groups_is_called_consistent_at_most_5_percent_of_the_time():
    """Reruns drawn from the published runs' own distributions (20 groups x 3 seeds, 3 numbers each): the Holm
    correction over the 60 tests keeps the share of reruns with anything outside near or below 5%; without it about
    a third (the audit's measurement of the old per-number rule) would fail."""
    rng = np.random.default_rng(0)
    failures = 0
    trials = 200
    for _ in range(trials):
        frames = []
        for _published_or_rerun in range(2):
            rows = [
                {
                    "model": "m",
                    "recipe": f"r{g}",
                    "optimizer": "muon",
                    "seed": s,
                    "window_success": v,
                    "gain": w,
                    "eval_success": x,
                    "collapsed": False,
                }
                for g in range(20)
                for s, (v, w, x) in enumerate(rng.normal(0.4, 0.05, size=(3, 3)))
            ]
            frames.append(pd.DataFrame(rows))
        failures += (compare(frames[1], frames[0])["status"] == "outside").any()
    assert failures / trials <= 0.08  # 5% nominal (Holm is conservative), plus the simulation's error


def test_compare_reads_the_companion_studys_run_table():
    """The companion's runs name their numbers otherwise (training success `train_success_window`, validation
    `final_window_success` and `val_auc`); compare checks those, and refuses two tables with nothing in common."""
    names = {"window_success": "train_success_window", "eval_success": "final_window_success", "gain": "val_auc"}
    published = _runs().rename(columns=names)
    assert set(compare(_runs().rename(columns=names), published)["status"]) == {"identical"}
    far = compare(_runs({("full", 1, "eval_success"): 0.9}).rename(columns=names), published)
    row = far.set_index(["recipe", "seed"]).loc[("full", 1)]
    assert row["status"] == "outside" and "final_window_success" in row["detail"]
    with pytest.raises(ValueError, match="share none of the compared numbers"):
        compare(_runs()[["model", "recipe", "optimizer", "seed"]], published)


def test_compare_keys_runs_by_arm_and_reads_a_numeric_label_back_as_the_label(tmp_path):
    """Two arms of one recipe and optimizer differ only by their arm; labels that read as numbers ("1e-3" would
    come back as 0.001) or as missing ("NA") must come back from the published CSV as written and join the rerun's."""
    published = pd.concat([_runs().assign(arm="1e-3"), _runs().assign(arm="NA")], ignore_index=True)
    published.to_csv(tmp_path / "runs.csv", index=False)
    (tmp_path / "provenance.json").write_text("{}")
    (tmp_path / "summary.csv").write_text("")
    assert pd.read_csv(tmp_path / "runs.csv")["arm"].isna().any()  # what a plain read makes of them
    back, _ = read_published(tmp_path)
    assert sorted(set(back["arm"])) == ["1e-3", "NA"]
    rerun = published.copy()
    rerun.loc[(rerun["arm"] == "NA") & (rerun["recipe"] == "full"), "window_success"] = 0.95
    table = compare(rerun, back)
    assert list(table.columns[:5]) == ["model", "recipe", "optimizer", "arm", "seed"] and len(table) == 12
    status = table.groupby(["arm", "recipe"])["status"].agg(set).to_dict()
    assert status == {
        ("1e-3", "full"): {"identical"},
        ("1e-3", "spo_adam"): {"identical"},
        ("NA", "full"): {"outside"},
        ("NA", "spo_adam"): {"identical"},
    }


def _cell(folder: Path, commit: str, version: str | None, dirty: bool = False) -> None:
    prov = {
        "config": {},
        "git": {"commit": commit, "dirty": dirty},
        "versions": {"torch": "x"},
        "hardware": {"processor": "cpu", "machine": "x86_64", "logical_cores": 2, "cuda_devices": []},
        "timestamp_utc": "2026-12-03T00:00:00+00:00",
    }
    if version is not None:
        prov["trainer_version"] = version
    folder.mkdir(parents=True)
    table = pa.table({"update": [0]}).replace_schema_metadata({PROVENANCE_KEY: json.dumps(prov).encode()})
    pq.write_table(table, folder / "metrics.parquet")


def _study(tmp_path: Path, versions: list, dirty: bool = False) -> Path:
    results = tmp_path / "results"
    for i, version in enumerate(versions):
        _cell(results / "cells" / f"model=m/recipe=r/optimizer=muon/seed={i}", "abc", version, dirty)
    _runs().iloc[: len(versions)].to_parquet(results / "runs.parquet")
    (results / "summary.csv").write_text("model,n_seeds\nm,1\n")
    return results


def test_publish_records_version_commit_and_study_and_refuses_mixed_or_dirty(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text("grid: []\n")
    out = tmp_path / "pub"
    prov = publish(_study(tmp_path / "a", [TRAINER_VERSION] * 3), study, out, ROOT, wall_time_s=12.5)
    assert prov["trainer_version"] == TRAINER_VERSION and prov["commits"] == ["abc"] and prov["n_cells"] == 3
    assert prov["wall_time_s"] == 12.5 and json.loads((out / "provenance.json").read_text()) == prov
    runs, _ = read_published(out)
    assert runs["window_success"].tolist() == _runs()["window_success"].iloc[:3].tolist()  # full precision
    with pytest.raises(ValueError, match="trainer versions"):
        publish(_study(tmp_path / "b", ["5", "6"]), study, tmp_path / "pub2", ROOT)
    with pytest.raises(ValueError, match="uncommitted"):
        publish(_study(tmp_path / "c", ["6"], dirty=True), study, tmp_path / "pub3", ROOT)
    assert not (tmp_path / "pub2").exists() and not (tmp_path / "pub3").exists()


def test_a_cell_without_a_recorded_version_gets_its_commits():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:trainer/__init__.py"], capture_output=True, text=True
    ).stdout
    assert f'TRAINER_VERSION = "{version_at(head.stdout.strip(), ROOT)}"' in text
    with pytest.raises(ValueError, match="cannot read"):
        version_at("0" * 40, ROOT)


def test_the_command_exits_1_on_a_run_outside_and_0_when_identical(tmp_path, capsys):
    results = _study(tmp_path, [TRAINER_VERSION] * 3)
    study = tmp_path / "study.yaml"
    study.write_text("grid: []\n")
    assert main(["publish", "--results", str(results), "--study", str(study), "--out", str(tmp_path / "pub")]) == 0
    assert main(["compare", "--results", str(results), "--published", str(tmp_path / "pub")]) == 0
    assert "3 identical" in capsys.readouterr().out
    _runs({("spo_adam", 1, "window_success"): 0.9}).iloc[:3].to_parquet(results / "runs.parquet")
    assert main(["compare", "--results", str(results), "--published", str(tmp_path / "pub")]) == 1
    assert "outside" in capsys.readouterr().out
    assert main(["compare", "--results", str(tmp_path), "--published", str(tmp_path / "pub")]) == 2
    assert "runs.parquet: missing" in capsys.readouterr().err


def test_the_module_runs_as_a_command():
    run = subprocess.run([sys.executable, "-m", "trainer.published", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "compare" in run.stdout


def test_recompute_rebuilds_a_published_summary_from_its_runs_with_t_intervals_and_degradation(tmp_path):
    """No retraining: the summary of a published arms study from its runs.csv alone, each arm's interval Student's
    t over its 2 seeds (mean +- t(0.975, 1) |a - b| / 2, t(0.975, 1) = 12.7062), the degradation verdict added."""
    from trainer.published import recompute

    folder = tmp_path / "edge-warmstarts"
    shutil.copytree(ROOT / "docs" / "results" / "edge-warmstarts", folder)
    runs, _ = read_published(folder)
    summary = recompute(folder, ROOT).set_index(["model", "arm"])
    seeds = runs[(runs["model"] == "qwen-tiny-w3") & (runs["arm"] == "adamw_lr3e-4")]["window_success"] * 100
    a, b = seeds.tolist()
    row = summary.loc[("qwen-tiny-w3", "adamw_lr3e-4")]
    assert row["final_pct_mean"] == pytest.approx((a + b) / 2, abs=1e-4)
    half = 12.706204736174705 * abs(a - b) / 2
    assert (row["final_pct_ci_low"], row["final_pct_ci_high"]) == pytest.approx(
        ((a + b) / 2 - half, (a + b) / 2 + half), abs=1e-3
    )
    again, _ = read_published(folder)
    assert "degraded" in again.columns and summary["n_degraded"].sum() == again["degraded"].sum()
    # a run's verdict: its gain below -6.8 points (16 episodes x 20 updates per fifth)
    assert (again["degraded"] == (again["gain"] < -0.0681)).all()


def test_compare_judges_one_rerun_cell_against_its_published_seeds(tmp_path, capsys):
    """One cell of E1 across base policies rerun (here: a synthetic log at its published seeds' level): judged with
    the published study's own analysis settings, against that cell's seeds only, consistent: exit 0."""
    from trainer.analysis.synthetic import cell_path, synthetic_metrics, write_metrics

    published = ROOT / "docs" / "results" / "edge-warmstarts"
    log = cell_path(tmp_path / "cells", "qwen-tiny-w2", "spo_muon", "muon", 0, arm="muon_m3e-4_r1e-4")
    cell = log.parent
    columns = synthetic_metrics(100, 0.43, np.random.default_rng(0), start=0.3, eval_every=25)
    write_metrics(log, columns)
    assert main(["compare", "--results", str(cell), "--published", str(published)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0 identical, 1 within, 0 untestable, 0 outside, 0 missing, 0 extra")
    assert "consistent with the published runs" in out
    # at 2 published seeds (df 1) only a gross difference is detectable; at E1-rerun's 3 seeds of 47.1% +- 2.8, a
    # cell ending at 2% is outside
    log = cell_path(tmp_path / "cells", "qwen-tiny", "spo_muon", "muon", 0, arm="muon_m3e-4_r1e-4")
    columns = synthetic_metrics(100, 0.02, np.random.default_rng(0), start=0.02, eval_every=25)
    write_metrics(log, columns)
    rerun = ROOT / "docs" / "results" / "edge-rerun"
    assert main(["compare", "--results", str(log.parent), "--published", str(rerun)]) == 1
    assert "1 outside" in capsys.readouterr().out


def test_why_a_rerun_is_not_identical_names_the_cpu_kind_and_the_packages():
    from trainer.published import why_not_identical

    published = {
        "trainer_version": "6",
        "machine": {"processor": "AMD EPYC", "cpu_features": ["avx2", "fma"]},
        "versions": {"torch": "2.13.0+cpu", "numpy": "2.4.6"},
    }
    rerun = {
        "trainer_version": "6",
        "hardware": {"processor": "Intel Xeon", "cpu_features": ["avx2", "avx512f", "amx_bf16"]},
        "versions": {"torch": "2.13.0+cpu", "numpy": "2.5.0"},
    }
    reasons = why_not_identical(published, [rerun])
    assert len(reasons) == 2
    assert reasons[0].startswith("other kernels: published 'AMD EPYC' (avx2, fma); this rerun 'Intel Xeon'")
    assert reasons[0].endswith(  # an AVX2 machine's kernels, run here by capping
        "rerun with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
    )
    assert reasons[1] == "numpy 2.5.0 vs published 2.4.6"
    assert (
        why_not_identical(
            {**published, "versions": rerun["versions"]},
            [{**rerun, "hardware": {"processor": "AMD EPYC", "cpu_features": ["fma", "avx2"]}}],
        )
        == []
    )
    unknown = why_not_identical({**published, "machine": {"processor": "AMD EPYC"}}, [rerun])
    assert "records no CPU features" in unknown[0]


def test_capped_kernels_are_told_apart_from_the_cpu_they_ran_on():
    """Cells of an AVX-512 CPU capped at AVX2 ran another kernel set than the same CPU uncapped, and the same level
    as an AVX2 CPU's: compare says which, and how to cap a rerun like them."""
    from trainer.published import why_not_identical

    caps = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    zen4 = {"processor": "AMD EPYC", "cpu_features": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    published = {"trainer_version": "6", "machine": {**zen4, "kernel_caps": caps}, "versions": {}}
    same = why_not_identical(published, [{"trainer_version": "6", "hardware": {**zen4, "kernel_caps": dict(caps)}}])
    assert same == []
    uncapped = why_not_identical(published, [{"trainer_version": "6", "hardware": zen4}])
    assert len(uncapped) == 1 and uncapped[0].startswith("other kernels: published 'AMD EPYC' (avx2, fma, avx512f")
    assert "capped ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2)" in uncapped[0]
    assert uncapped[0].endswith("ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2")
    zen3 = {"processor": "AMD EPYC 7B13", "cpu_features": ["avx2", "fma"]}
    level = why_not_identical(published, [{"trainer_version": "6", "hardware": zen3}])
    assert len(level) == 1 and level[0].startswith("another CPU kind, both at avx2 kernels")
    two = [{"hardware": {**zen4, "kernel_caps": caps}}, {"hardware": zen4}]
    assert why_not_identical(published, two)[-1] == "the rerun's own cells ran on 2 CPU kinds"


def test_curves_are_every_cells_success_per_update_with_its_keys(tmp_path):
    """What publish writes as curves.csv: enough to apply a later collapse rule to a published study."""
    from trainer.analysis.synthetic import cell_path, synthetic_metrics, write_metrics
    from trainer.published import curves

    for seed in (0, 1):
        columns = synthetic_metrics(30, 0.5, np.random.default_rng(seed), eval_every=10)
        write_metrics(cell_path(tmp_path / "cells", "q", "spo_muon", "muon", seed, arm="a"), columns)
    table = curves(tmp_path)
    assert list(table.columns) == [
        "model",
        "recipe",
        "optimizer",
        "arm",
        "seed",
        "update",
        "success_rate",
        "eval_success",
    ]
    assert len(table) == 60 and table.groupby("seed")["update"].max().tolist() == [29, 29]
    assert table["eval_success"].notna().sum() < 60  # held-out only where evaluated


def test_compare_says_when_the_published_cells_trained_with_the_pad_row_frozen(tmp_path, monkeypatch):
    """Cells of commits from PAD_ROW_FROZEN's first up to its second differ from the rest of the version's; told by
    git ancestry (here a repository of four commits: before, the change, between, the fix, after)."""
    import subprocess

    import trainer.published as published_module
    from trainer.published import pad_row_frozen, why_not_identical

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    commits = []
    for name in ("before", "change", "between", "fix", "after"):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", name)
        commits.append(git("rev-parse", "HEAD").strip())
    before, change, between, fix, after = commits
    monkeypatch.setattr(published_module, "PAD_ROW_FROZEN", (change, fix))
    assert [pad_row_frozen(c, tmp_path) for c in commits] == [False, True, True, False, False]
    assert pad_row_frozen("0" * 40, tmp_path) is None
    machine = {"cpu_features": ["avx2"]}
    published = {"trainer_version": "6", "commits": [change, between], "machine": machine, "versions": {}}
    rerun = [{"trainer_version": "6", "git": {"commit": after}, "hardware": machine}]
    reasons = why_not_identical(published, rerun, tmp_path)
    assert len(reasons) == 1 and reasons[0].startswith("the published cells were trained with a tiny policy's pad row")
    assert why_not_identical({**published, "commits": [before]}, rerun, tmp_path) == []
    assert why_not_identical(published, rerun) == []  # no repository: nothing said
