"""A contrast pooled over published studies: a run published twice counts once, a base policy once."""

import json

import pandas as pd
import pytest
import yaml

from trainer.meta import load_runs, main, pooled_contrast


def _publish(folder, study_file, runs, cpu=("avx2",)):
    folder.mkdir(parents=True)
    pd.DataFrame(runs).to_csv(folder / "runs.csv", index=False)
    (folder / "summary.csv").write_text("x\n")
    prov = {"trainer_version": "6", "study_file": str(study_file), "machine": {"cpu_features": list(cpu)}}
    (folder / "provenance.json").write_text(json.dumps(prov))


def _run(model, arm, seed, value, recipe=None):
    recipe = recipe or ("spo_muon" if arm == "m" else "spo_adam")
    return {
        "model": model,
        "recipe": recipe,
        "optimizer": recipe.split("_")[1],
        "arm": arm,
        "seed": seed,
        "window_success": value,
        "gain": value / 3,
        "update_rms": 1e-4 + value,
    }


@pytest.fixture
def studies(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "models": {"q": {"preset": "qwen-tiny"}, "w": {"preset": "qwen-tiny", "warm_start_seed": 1}},
                "grid": [{"recipes": ["spo_muon"], "seeds": [0]}],
            }
        )
    )
    # study one: bases q and w; study two: base q again (one run shared, bit-identical), and a new arm
    one = [_run("q", "m", 0, 0.5), _run("q", "a", 0, 0.2), _run("w", "m", 0, 0.4), _run("w", "a", 0, 0.3)]
    two = [_run("q", "m", 0, 0.5), _run("q", "m", 1, 0.7), _run("q", "a", 1, 0.1)]
    _publish(tmp_path / "one", study, one)
    _publish(tmp_path / "two", study, two)
    return [tmp_path / "one", tmp_path / "two"]


def test_a_run_published_twice_is_one_run_and_its_bases_one_base(studies):
    runs = load_runs(studies)
    assert len(runs) == 6  # 7 rows, one of them the same run twice
    table, est = pooled_contrast(runs, "m:spo_muon", "a:spo_adam", "window_success")
    by_model = table.set_index("model")
    # base q: m runs 0.5, 0.7 -> 60; a runs 0.2, 0.1 -> 15; base w: 40 - 30
    assert by_model.loc["q", "difference_pts"] == pytest.approx(45)
    assert (by_model.loc["q", "runs_first"], by_model.loc["q", "studies"]) == (2, "one, two")
    assert by_model.loc["w", "difference_pts"] == pytest.approx(10)
    assert (est.n, est.estimate) == (2, pytest.approx(27.5))


def test_bases_on_another_cpu_kind_are_other_bases(studies, tmp_path):
    prov = json.loads((studies[1] / "provenance.json").read_text())
    prov["machine"]["cpu_features"] = ["avx2", "avx512f"]
    (studies[1] / "provenance.json").write_text(json.dumps(prov))
    runs = pd.read_csv(studies[1] / "runs.csv")
    runs.loc[0, "window_success"] = 0.55  # no shared run any more
    runs.to_csv(studies[1] / "runs.csv", index=False)
    table, est = pooled_contrast(load_runs(studies), "m:spo_muon", "a:spo_adam", "window_success")
    assert est.n == 3


def test_bases_made_under_kernel_caps_are_other_bases(studies):
    """The same CPU capped at AVX2 runs another kernel set, so its warm start is another base policy."""
    prov = json.loads((studies[1] / "provenance.json").read_text())
    prov["machine"]["kernel_caps"] = {"ATEN_CPU_CAPABILITY": "avx2"}
    (studies[1] / "provenance.json").write_text(json.dumps(prov))
    runs = pd.read_csv(studies[1] / "runs.csv")
    runs.loc[0, "window_success"] = 0.55
    runs.to_csv(studies[1] / "runs.csv", index=False)
    table, est = pooled_contrast(load_runs(studies), "m:spo_muon", "a:spo_adam", "window_success")
    assert est.n == 3


def test_the_command_prints_the_pooled_interval(studies, capsys):
    assert main([*map(str, studies), "--first", "m", "--second", "a"]) == 0
    assert "+27.5 points over 2 base policies" in capsys.readouterr().out
    assert main([*map(str, studies), "--first", "m", "--second", "a", "--outcome", "nope"]) == 2
