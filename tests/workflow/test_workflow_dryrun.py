"""`snakemake` itself as a subprocess on a temporary copy of the repository: dry runs for the DAG's shape,
`--lint`, and every kind of bad config failing before any job starts, with the key named. Outside CI these skip
when Snakemake is missing; with CI=true that is a failure.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml
from workflow_runner import copy_repo, job_counts, read_study, require_snakemake, snakemake

import trainer.study as cc

SMOKE = ["--configfile", "configs/smoke.yaml"]
SMOKE_DIR = Path("studies/smoke")  # configs/smoke.yaml's workdir: targets and outputs are relative to it


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory):
    """One copy for the dry-run and bad-input tests (they never leave outputs behind)."""
    require_snakemake()
    return copy_repo(tmp_path_factory.mktemp("dry") / "repo")


def test_dry_run_of_the_default_study_has_one_train_job_per_cell(scratch_repo):
    r = snakemake(scratch_repo, "-n", "--cores", "all")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout + r.stderr)
    assert counts == {
        "warm_start_config": 2,
        "warm_start": 2,
        "cell_config": 60,
        "train": 60,
        "summarize": 1,
        "figures": 1,
        "all": 1,
    }
    out = r.stdout + r.stderr
    assert "results/cells/model=qwen-tiny/recipe=no_length_seqmean_no_tis/optimizer=adam/seed=0/metrics.parquet" in out
    assert "results/cells/model=minicpm-tiny/recipe=spo_adam/optimizer=adam/seed=2/metrics.parquet" in out
    assert not (scratch_repo / "results").exists()


@pytest.mark.slow
def test_paper_study_uses_checkpoints_instead_of_a_warm_start(scratch_repo):
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/paper.yaml")
    assert r.returncode != 0
    assert "models.MiniCPM5-2B.path: 'checkpoints/MiniCPM5-2B' does not exist" in r.stderr + r.stdout
    for name in ("MiniCPM5-2B", "Qwen3.5-4B"):
        (scratch_repo / "checkpoints" / name).mkdir(parents=True)
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/paper.yaml")
    assert r.returncode != 0
    assert "cell.env.options.tasks_file: 'data/r2e-gym-tasks.jsonl' does not exist" in r.stderr + r.stdout
    (scratch_repo / "data").mkdir()
    (scratch_repo / "data" / "r2e-gym-tasks.jsonl").write_text("")
    try:
        r = snakemake(scratch_repo, "-n", "-p", "--cores", "all", "--configfile", "configs/paper.yaml")
    finally:
        shutil.rmtree(scratch_repo / "checkpoints")
        shutil.rmtree(scratch_repo / "data")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    # the study file replaces config.yaml: no tiny models, no warm start; R2E-Gym tasks in Docker: the preflight
    # (a CPU job) before any cell
    assert job_counts(out) == {"preflight": 1, "cell_config": 60, "train": 60, "summarize": 1, "figures": 1, "all": 1}
    assert "python -m trainer.environments.swe.preflight" in out and "--min-gold-share 0.9" in out
    assert "model=Qwen3.5-4B/recipe=full/optimizer=muon/seed=2" in out and "tiny" not in out
    assert "gpu=8" in out and "runtime=2880" in out and "cpus_per_task=16" in out  # 2 processes x 8 threads
    assert "nodes=1, slurm_extra=--exclusive" in out  # a whole node, never spread over two
    assert "--save-policy results/cells/model=Qwen3.5-4B/" in out and "--checkpoint-last" in out  # keep: both
    assert "python -m torch.distributed.run --standalone --nproc-per-node=2 -m trainer train" in out  # -p


def test_paths_are_rebased_from_the_repository_root_to_the_studys_workdir(tmp_path):
    (tmp_path / "checkpoints" / "A").mkdir(parents=True)
    (tmp_path / "B").mkdir()
    (tmp_path / "data" / "alf").mkdir(parents=True)
    study = {
        "models": {"a": {"path": "checkpoints/A"}, "b": {"path": str(tmp_path / "B")}, "t": {"preset": "qwen-tiny"}},
        "grid": [{"recipes": ["full"], "seeds": [0]}],
        "cell": {"env": {"name": "alfworld", "options": {"data_dir": "data/alf", "action_format": "plain"}}},
    }
    checked = cc.check_study(study, root=tmp_path)
    got = cc.paths_from_workdir(checked, "/repo", "/repo/studies/p")
    assert {name: entry.path for name, entry in got.models.items()} == {
        "a": "../../checkpoints/A",
        "b": str(tmp_path / "B"),
        "t": None,
    }
    assert got.cell["env"]["options"] == {"data_dir": "../../data/alf", "action_format": "plain"}  # only path keys
    assert checked.models["a"].path == "checkpoints/A" and checked.cell["env"]["options"]["data_dir"] == "data/alf"
    assert cc.paths_from_workdir(checked, "/repo", "/repo").models["a"].path == "checkpoints/A"
    # a workdir behind a link (scratch storage): the path must resolve from where the job really runs
    (tmp_path / "scratch" / "p").mkdir(parents=True)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "p").symlink_to(tmp_path / "scratch" / "p")
    linked = cc.paths_from_workdir(checked, tmp_path, tmp_path / "studies" / "p").models["a"].path
    assert (tmp_path / "scratch" / "p" / linked).resolve() == (tmp_path / "checkpoints" / "A").resolve()
    # check_study looks from the repository root, wherever the process runs (a cluster job: in the workdir)
    only_a = {"models": {"a": study["models"]["a"]}, "grid": [{"recipes": ["full"], "seeds": [0]}]}
    cc.check_study(only_a, root=tmp_path)
    with pytest.raises(cc.StudyError, match="models.a.path: 'checkpoints/A' does not exist"):
        cc.check_study(only_a, root=tmp_path / "studies" / "p")


def test_a_models_options_reach_its_cells_and_a_template_file_is_checked_and_rebased(tmp_path):
    """`models.NAME.model_options`: how that family's checkpoint loads, merged over cell.model into its cells only;
    a template file is looked for from the repository root and rebased like the checkpoint; a shipped name is not."""
    (tmp_path / "checkpoints" / "A").mkdir(parents=True)
    (tmp_path / "checkpoints" / "B").mkdir(parents=True)
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    study = {
        "models": {
            "a": {"path": "checkpoints/A", "model_options": {"chat_template": "t.jinja", "trust_remote_code": True}},
            "b": {"path": "checkpoints/B", "model_options": {"chat_template": "qwen3-stable"}},
        },
        "grid": [{"recipes": ["full"], "seeds": [0]}],
        "cell": {"model": {"template_options": {"enable_thinking": False}}},
    }
    study["workdir"] = "studies/p"
    loaded = cc.Study.load(study, root=tmp_path)
    cells = {m: loaded.cell_config(cc.CellKey(m, "full", "muon", 0))["model"] for m in "ab"}
    assert cells["a"] == {
        "template_options": {"enable_thinking": False},
        "chat_template": "../../t.jinja",
        "trust_remote_code": True,
        "path": "../../checkpoints/A",
    }
    assert cells["b"]["chat_template"] == "qwen3-stable" and "trust_remote_code" not in cells["b"]
    study["models"]["a"]["model_options"]["chat_template"] = "missing.jinja"
    with pytest.raises(cc.StudyError, match="models.a.model_options.chat_template: 'missing.jinja'"):
        cc.check_study(study, root=tmp_path)
    study["models"]["a"]["model_options"] = {"path": "elsewhere"}
    with pytest.raises(cc.StudyError, match="model_options.path: give the model's path as the entry's own"):
        cc.check_study(study, root=tmp_path)


@pytest.mark.slow
def test_a_study_with_a_workdir_and_a_checkpoint_writes_cells_that_find_it(tmp_path):
    """configs/companion-paper.yaml: repository-relative checkpoint and game paths, jobs in studies/companion-paper/.
    The cell config rule runs for real; the paths in cell.yaml must resolve from the folder the job runs in."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    (repo / "checkpoints" / "Qwen2.5-0.5B-Instruct").mkdir(parents=True)
    (repo / "data" / "alfworld").mkdir(parents=True)
    target = "results/cells/model=Qwen2.5-0.5B-Instruct/recipe=gigpo/optimizer=muon/seed=0/cell.yaml"
    r = snakemake(repo, target, "--cores", "1", "--configfile", "configs/companion-paper.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    study = repo / "studies" / "companion-paper"
    cell = yaml.safe_load((study / target).read_text())
    assert (study / cell["model"]["path"]).resolve() == (repo / "checkpoints" / "Qwen2.5-0.5B-Instruct").resolve()
    assert (study / cell["env"]["options"]["data_dir"]).resolve() == (repo / "data" / "alfworld").resolve()


@pytest.mark.slow
def test_dry_run_of_the_companion_study(scratch_repo):
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/companion.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert job_counts(out) == {
        "warm_start_config": 1,
        "warm_start": 1,
        "cell_config": 27,
        "train": 27,
        "summarize": 1,
        "figures": 1,
        "all": 1,
    }
    assert "model=qwen2.5-tiny/recipe=graphgpo/optimizer=adam_high_lr/seed=2/metrics.parquet" in out
    assert "figures/companion_bars.pdf" in out and "fig2" not in out


@pytest.mark.slow
def test_dry_run_of_the_stability_and_horizon_studies(scratch_repo):
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/stability.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    # 2 models x 2 optimizers x 5 lrs x 2 seeds; config.yaml's models, warm starts and settings (its `base`)
    assert job_counts(out) == {
        "warm_start_config": 2,
        "warm_start": 2,
        "cell_config": 40,
        "train": 40,
        "summarize": 1,
        "figures": 1,
        "all": 1,
    }
    assert "results/cells/model=qwen-tiny/recipe=spo_muon/optimizer=muon/lr=3e-03/seed=1/metrics.parquet" in out
    assert "results/selected_lr.yaml" in out and "figures/stability.pdf" in out and "fig2" not in out
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/horizon.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    # 4 horizons (sharing one warm-started policy) x 3 recipes x 3 seeds; config.yaml's own models are not run
    assert job_counts(out) == {
        "warm_start_config": 1,
        "warm_start": 1,
        "cell_config": 36,
        "train": 36,
        "summarize": 1,
        "figures": 1,
        "all": 1,
    }
    assert "results/cells/model=qwen-h4/recipe=full/optimizer=muon/seed=2/metrics.parquet" in out
    assert "results/policies/qwen-base" in out
    assert "figures/horizon.png" in out and "lr=" not in out and "minicpm-tiny" not in out


@pytest.mark.slow
def test_lint_passes(scratch_repo):
    r = snakemake(scratch_repo, "--lint")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations" in r.stdout + r.stderr


def _bad_study(edit) -> dict:
    study = read_study("configs/smoke.yaml")
    edit(study)
    return study


@pytest.mark.parametrize(
    "edit, named",
    [
        pytest.param(
            lambda s: s["grid"][0]["recipes"].append("fulll"),
            "grid[0].recipes: 'fulll' is not a recipe",
            id="recipe",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["grid"][1].update(seeds=[0, -1]),
            "grid[1].seeds: must be >= 0, got -1",
            id="seed",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["models"].update(big={"path": "checkpoints/nowhere"}),
            "models.big.path: 'checkpoints/nowhere'",
            id="model-path",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["cell"].update(loss={"clip_hihg": 0.3}),
            "unknown config key 'cell.loss.clip_hihg'",
            id="typo",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s.update(grdi=[]), "unknown config key 'grdi'", id="top-level-typo", marks=pytest.mark.slow
        ),
        pytest.param(
            lambda s: s["cell"]["run"].update(updates="ten"),
            "cell.run.updates: expected an integer, got 'ten'",
            id="type",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["cell"]["run"].update(updates=0),
            "cell.run.updates: must be >= 1, got 0",
            id="range",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["cell"].update(loss={"tis_cap": 3.0}),
            "cell.loss.tis_cap: each cell sets it",
            id="recipe-key",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["cell"]["env"]["options"].update(max_turnz=6),
            "cell.env.options: unknown config key 'env.options.max_turnz'",
            id="env-option-typo",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["cell"]["env"]["options"].update(max_turns="six"),
            "cell.env.options: env.options.max_turns: expected an integer, got 'six'",
            id="env-option-value",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["cell"].update(rl={"group_size": 3}),
            "rollout.batch_size 4 is not a multiple of rl.group_size 3",
            id="trainer-cross-key",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s.update(study="companion"),
            "recipes ['full', 'no_length',",
            id="companion-recipes",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s.update(base="configs/nope.yaml"),
            "base: 'configs/nope.yaml' is not a study file",
            id="missing-base",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s.update(lr={"adma": 1e-3}),
            "unknown config key 'lr.adma'",
            id="lr-table-typo",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["grid"][0].update(lrs=[1e-3]),
            "grid[0].lrs: only a `study: stability` has an lr axis",
            id="lr-axis-in-main",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda s: s["models"]["qwen-tiny"].update(env_options={"max_bugs": 9}),
            "cell.env.options with models.qwen-tiny.env_options: MiniRepoConfig",
            id="model-env-options",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_config_fails_before_any_job_with_the_key_named(scratch_repo, edit, named):
    study = scratch_repo / f"bad_{os.getpid()}_{time.monotonic_ns()}.yaml"
    study.write_text(yaml.safe_dump(_bad_study(edit), sort_keys=False))
    try:
        r = snakemake(scratch_repo, "--cores", "1", "--configfile", study.name)
    finally:
        study.unlink()
    assert r.returncode != 0
    assert named in r.stdout + r.stderr
    assert not (scratch_repo / SMOKE_DIR / "results").exists() and not (scratch_repo / "results").exists()


@pytest.mark.slow
def test_a_studys_trackers_reach_its_train_jobs(scratch_repo):
    """`trackers:` adds the trainer's --track flags: the study file's name as the group, the cell's folder as the
    run's name; without the key, no flag."""
    study = scratch_repo / "configs" / "smoke-tracked.yaml"
    study.write_text("base: configs/smoke.yaml\ntrackers: {tensorboard: true, wandb: true}\n")
    try:
        r = snakemake(scratch_repo, "-n", "-p", "--cores", "all", "--configfile", "configs/smoke-tracked.yaml")
    finally:
        study.unlink()
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "--track tensorboard wandb --track-group smoke-tracked --track-name model=" in out
    plain = snakemake(scratch_repo, "-n", "-p", "--cores", "all", *SMOKE)
    assert plain.returncode == 0 and "--track" not in plain.stdout + plain.stderr
