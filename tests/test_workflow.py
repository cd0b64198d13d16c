"""The Snakemake workflow: study configs -> cells, the DAG, bad input, and real runs of the smoke study.

Three layers. (1) The study model (trainer/study.py) against hand-written expectations, and its checks of the
trainer blocks naming the key. (2) `snakemake` itself as a
subprocess on a temporary copy of the repository: dry-runs for the DAG shape, `--lint`, and every kind of bad
config failing before any job starts. (3) The users' commands for real on configs/smoke.yaml (run once, shared
by a module fixture): the whole study, rerunning one cell and then its figures, regenerating only the figures,
and a SIGKILLed workflow recovering with --rerun-incomplete without touching finished cells.
Outside CI the snakemake tests skip when Snakemake is missing; with CI=true that is a failure.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import trainer
import trainer.study as cc
from trainer.config import RECIPES, config_from_dict, load_sft_config

REPO = Path(__file__).resolve().parents[1]
COPIED = ["Snakefile", "config.yaml", "configs", "workflow", "envs", "slurm", "trainer"]
"""What a temporary copy of the repository needs to run the workflow from its root."""
SMOKE = ["--configfile", "configs/smoke.yaml"]
SMOKE_DIR = Path("studies/smoke")  # configs/smoke.yaml's workdir: targets and outputs are relative to it
TIMING = ["rollout_s", "train_s", "wall_s"]


def _study(name: str) -> dict:
    """A study file as the workflow reads it: with its `base` study merged under it."""
    return cc.resolve_base(yaml.safe_load((REPO / name).read_text()), root=REPO, source=REPO / name)


STUDY_FILES = ["config.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))]


# -- (1) pure helpers ------------------------------------------------------------------------------------------
def test_a_companion_study_must_validate_and_compare_estimators():
    study = _study("configs/companion-smoke.yaml")
    cc.check_study(study)
    for section, key in (("run", "eval_every"), ("env", "eval_tasks")):
        bad = yaml.safe_load(yaml.safe_dump(study))
        bad["cell"].setdefault(section, {})[key] = 0
        with pytest.raises(cc.StudyError, match=f"cell.{section}.{key}: the companion study's headline"):
            cc.check_study(bad)
    bad = yaml.safe_load(yaml.safe_dump(study))
    bad["grid"][0]["recipes"] = ["full"]
    with pytest.raises(cc.StudyError, match=r"recipes \['full'\] belong to the main study"):
        cc.check_study(bad)


def test_grid_of_the_default_study():
    grid = cc.grid_frame(_study("config.yaml"))
    # 2 models x (8 recipes x 3 seeds + 6 Adam versions x 1 seed) = 2 x 30 = 60
    assert len(grid) == 60 and list(grid.columns) == ["model", "recipe", "optimizer", "seed"]
    assert not grid.duplicated().any()
    per_model = grid.groupby("model").size().to_dict()
    assert per_model == {"minicpm-tiny": 30, "qwen-tiny": 30}
    fig2 = grid[grid.seed > 0]  # only the Figure-2 block has seeds 1 and 2
    figure2_recipes = {r: o for r, o in cc.RECIPE_OPTIMIZER.items() if r not in cc.GROUP_RECIPES}
    assert set(zip(fig2.recipe, fig2.optimizer)) == set(figure2_recipes.items())
    adam = grid[(grid.optimizer == "adam") & (grid.recipe != "spo_adam")]
    assert sorted(adam.recipe.unique()) == sorted(set(figure2_recipes) - {"spo_adam", "spo_muon"})
    assert adam.seed.unique().tolist() == [0]
    assert len(cc.grid_frame(_study("configs/smoke.yaml"))) == 28  # 2 x (8 + 6), one seed


grid_blocks = st.lists(st.fixed_dictionaries(
    {"recipes": st.lists(st.sampled_from(list(RECIPES)), min_size=1, max_size=4),
     "seeds": st.lists(st.integers(0, 3), min_size=1, max_size=3),
     "optimizer": st.sampled_from(["recipe", *cc.OPTIMIZERS])},
    optional={"models": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2)}), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(grid_blocks)
def test_grid_is_the_union_of_block_products(blocks):
    study = {"models": {"a": {"preset": "minicpm-tiny"}, "b": {"preset": "qwen-tiny"}}, "grid": blocks}
    grid = cc.grid_frame(study)
    expected = set()
    for block in blocks:
        for m, r, s in itertools.product(block.get("models", ["a", "b"]), block["recipes"], block["seeds"]):
            expected.add((m, r, cc.RECIPE_OPTIMIZER[r] if block["optimizer"] == "recipe" else block["optimizer"], s))
    rows = list(grid.itertuples(index=False, name=None))
    assert len(rows) == len(set(rows)) and set(rows) == expected


def test_cell_config_is_the_shared_block_plus_the_cell_keys():
    study = {"models": {"m": {"preset": "qwen-tiny"}},
             "cell": {"model": {"dtype": "float32"}, "env": {"name": "minirepo", "options": {"max_depth": 1}},
                      "optim": {"lr": 0.5}, "rl": {"length_threshold": 7}, "run": {"updates": 3}}}
    got = cc.cell_config(study, "m", "no_tool", "adam", 2, "results/policies/m", threads=4)
    assert got == {"recipe": "no_tool", "model": {"dtype": "float32", "path": "results/policies/m"},
                   "optim": {"lr": 0.5, "name": "adam"}, "env": {"name": "minirepo", "options": {"max_depth": 1}},
                   "rl": {"length_threshold": 7}, "run": {"updates": 3, "seed": 2, "threads": 4}}
    got["env"]["options"]["max_depth"] = 9  # a deep copy: the study is not modified through the cell
    assert study["cell"]["env"]["options"]["max_depth"] == 1


def test_warm_start_config_takes_the_cells_env_and_token_limits():
    study = {"models": {"m": {"preset": "minicpm-tiny"}},
             "cell": {"model": {"dtype": "float32", "init_seed": 3}, "env": {"name": "minirepo"},
                      "rollout": {"batch_size": 8, "max_turn_tokens": 12, "max_episode_tokens": 256}},
             "warm_start": {"n_demos": 10, "band": [0.0, 1.0], "allow_out_of_band": True}}
    assert cc.warm_start_config(study, "m", threads=2) == {
        "model": {"preset": "minicpm-tiny", "dtype": "float32", "init_seed": 3}, "env": {"name": "minirepo"},
        "rollout": {"max_turn_tokens": 12, "max_episode_tokens": 256},  # batch_size is not the warm start's
        "n_demos": 10, "band": [0.0, 1.0], "threads": 2}


def test_a_models_warm_start_seed_seeds_its_warm_start_and_initialisation():
    study = {"models": {"m": {"preset": "qwen-tiny"}, "m2": {"preset": "qwen-tiny", "warm_start_seed": 2}},
             "cell": {"model": {"init_seed": 3}, "env": {"name": "minirepo"}}, "warm_start": {"seed": 5}}
    first, second = (cc.warm_start_config(study, m, threads=1) for m in ("m", "m2"))
    assert (first["seed"], first["model"]["init_seed"]) == (5, 3)
    assert (second["seed"], second["model"]["init_seed"]) == (2, 2)


@pytest.mark.parametrize("study_file", STUDY_FILES)
def test_every_cell_of_every_study_is_a_valid_trainer_config(study_file, tmp_path):
    """What the workflow writes must pass the trainer's own validation (model.path: any existing dir, with the
    offline statistics a warm start writes there)."""
    study = _study(study_file)
    (tmp_path / cc.OFFLINE_STATS_FILE).write_text("{}")
    grid = cc.grid_frame(study)
    for row in grid.itertuples(index=False):
        lr = float(row.lr) if "lr" in grid.columns else None
        arm = row.arm if "arm" in grid.columns else None
        cfg = config_from_dict(cc.cell_config(study, row.model, row.recipe, row.optimizer, row.seed,
                                              str(tmp_path), threads=1, lr=lr, arm=arm))
        assert (cfg.recipe, cfg.optim.name, cfg.run.seed) == (row.recipe, row.optimizer, row.seed)
        assert lr is None or cfg.optim.lr == lr
        own = (cc.arm_cell(study, arm).get("optim") or {})
        assert all(getattr(cfg.optim, key) == own[key] for key in ("lr", "muon_lr") if key in own)
        # PPO as the papers' base setups run it: several optimizer steps per rollout batch, so the clip binds;
        # and one step-size rule (Muon's update RMS matched to AdamW's) in every study but the arms that set theirs
        assert cfg.run.minibatches * cfg.run.epochs >= 2, (study_file, "one optimizer step per batch")
        assert cfg.optim.adjust_lr_fn == own.get("adjust_lr_fn", "match_rms_adamw"), study_file
    for model in cc.warm_started_models(study, grid):
        path = tmp_path / f"{model}.yaml"
        cc.write_yaml(cc.warm_start_config(study, model, threads=1), path, header="test")
        assert load_sft_config(path).model.preset == study["models"][model]["preset"]


@pytest.mark.parametrize("edit, named", [
    pytest.param(lambda s: s["models"]["m"].update(path="x"), "models.m: give exactly one", id="preset+path"),
    pytest.param(lambda s: s["models"]["m"].pop("preset"), "models.m: give exactly one", id="neither"),
    pytest.param(lambda s: s["models"]["m"].update(policy="m"), "models.m: give exactly one", id="preset+policy"),
    pytest.param(lambda s: s["models"].update(h={"policy": "nope"}), "models.h.policy: 'nope' is not a model",
                 id="policy-unknown"),
    pytest.param(lambda s: s["models"].update(h={"policy": "h2"}, h2={"path": "."}),
                 "models.h.policy: 'h2' is not a model of this study with a `preset`", id="policy-of-a-checkpoint"),
    pytest.param(lambda s: s["models"].update(p={"path": "/no/such/checkpoint"}), "models.p.path", id="no-path"),
    pytest.param(lambda s: s["models"].update(h={"policy": "m", "warm_start_seed": 1}),
                 "models.h.warm_start_seed: only a model with a `preset` is warm-started", id="seed-without-preset"),
    pytest.param(lambda s: s["grid"][0].update(models=["m", "nope"]), r"grid\[0\].models: 'nope'",
                 id="unknown-model"),
    pytest.param(lambda s: s.update(warm_start={"band": [0.5, 0.2]}), "warm_start.band", id="band"),
    pytest.param(lambda s: s["grid"][0].update(recipes=["gigpo"]), r"rl.estimator 'gigpo' needs rl.group_size >= 2",
                 id="group-estimator-without-groups"),
    pytest.param(lambda s: s.update(workdir="../../x"), r"workdir: '../../x' is outside the repository",
                 id="workdir-up"),
    pytest.param(lambda s: s.update(workdir="/tmp/x"), r"workdir: '/tmp/x' is outside the repository",
                 id="workdir-absolute"),
    # the trainer blocks, checked by the trainer's own dataclasses
    pytest.param(lambda s: s.update(cell={"recipe": "full"}), r"cell.recipe: each cell's recipe comes from the grid",
                 id="cell-recipe"),
    pytest.param(lambda s: s.update(cell={"optim": {"name": "adam"}}), r"cell.optim.name: each cell sets it",
                 id="cell-optimizer"),
    pytest.param(lambda s: s.update(cell={"run": {"seed": 3}}), r"cell.run.seed: each cell sets it", id="cell-seed"),
    pytest.param(lambda s: s.update(cell={"rl": {"agg": "token-mean"}}), r"cell.rl.agg: each cell sets it",
                 id="cell-recipe-key"),
    pytest.param(lambda s: s.update(cell={"rollout": {"top_p": 1.5}}), r"cell.rollout.top_p: must be <= 1, got 1.5",
                 id="cell-range"),
    pytest.param(lambda s: s.update(cell={"optim": {"betas": [0.9, 1.0]}}), r"cell.optim.betas: must be < 1, got 1.0",
                 id="cell-tuple-range"),
    pytest.param(lambda s: s.update(cell={"rollout": {"batch_size": 10 ** 9}}),
                 r"cell.rollout.batch_size: 1,000,000,000 is above 65,536", id="cell-limit"),
    pytest.param(lambda s: s.update(cell={"env": {"eval_taks": 3}}), r"unknown config key 'cell.env.eval_taks'",
                 id="cell-typo"),
    pytest.param(lambda s: s.update(warm_start={"nosie": 0.1}), r"unknown config key 'warm_start.nosie'",
                 id="warm-start-typo"),
    pytest.param(lambda s: s.update(warm_start={"vocab_size": 100}), r"warm_start.vocab_size: must be >= 261",
                 id="warm-start-range"),
    pytest.param(lambda s: s.update(warm_start={"threads": 2}), r"warm_start.threads: set per model",
                 id="warm-threads"),
    pytest.param(lambda s: s["models"]["m"].update(preset="gpt-tiny"), r"models.m.preset: 'gpt-tiny' is not a tiny",
                 id="preset"),
    pytest.param(lambda s: s["grid"][0].update(optimizer="sgd"), r"grid\[0\].optimizer: 'sgd' is not 'recipe'",
                 id="optimizer"),
    pytest.param(lambda s: s.update(analysis={"collapse": {"warmpu": 3}}), r"analysis.collapse: .*'warmpu'",
                 id="collapse-typo"),
    pytest.param(lambda s: s.update(cell={"rollout": {"engine": "vllm", "server": True}},
                                    resources={"train": {"gpu": 8, "processes": 8}}),
                 r"resources.train.gpu: 8 GPUs for 8 trainer process\(es\) and a vLLM rollout server .*ask for 9",
                 id="server-gpu"),
    pytest.param(lambda s: s.update(cell={"rollout": {"engine": "hf", "server": True}}),
                 r"rollout.server: the hf engine runs in the trainer", id="server-hf"),
    pytest.param(lambda s: s.update(analysis={"collapse": {"drop_fraction": 1.5}}),
                 r"analysis.collapse: .*drop_fraction", id="collapse-range"),
])
def test_check_study_names_the_broken_key(edit, named):
    def check(study):  # what common.smk runs before any job
        cc.check_study(study)
        cc.check_cells(study, cc.grid_frame(study), root=REPO)

    study = {"models": {"m": {"preset": "qwen-tiny"}}, "grid": [{"recipes": ["full"], "seeds": [0]}]}
    check(study)  # the unedited study is fine
    edit(study)
    with pytest.raises(cc.StudyError, match=named):
        check(study)


def test_an_external_workdir_is_allowed_when_the_study_says_so(tmp_path):
    study = {"models": {"m": {"preset": "qwen-tiny"}}, "grid": [{"recipes": ["full"], "seeds": [0]}],
             "workdir": "/tmp/elsewhere", "external_workdir": True}
    cc.check_study(study)
    # a folder of the checkout that links to another disk is inside, as written
    (tmp_path / "disk").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "studies").symlink_to(tmp_path / "disk")
    cc.check_study(dict(study, workdir="studies/x/../y", external_workdir=False), root=tmp_path / "repo")


def test_rules_name_existing_conda_environments():
    """Every `conda:` of the rules is an env file of envs/ with a pinned python and the packages jobs import."""
    rules = "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    named = set(re.findall(r'"\.\./\.\./(envs/[\w-]+\.yaml)"', rules))
    assert named == {"envs/trainer-cpu.yaml", "envs/trainer-gpu.yaml", "envs/analysis.yaml"}
    for path in named:
        env = yaml.safe_load((REPO / path).read_text())
        deps = [d for d in env["dependencies"] if isinstance(d, str)]
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        names = {re.split(r"[ =<>]", d)[0] for d in deps + pip}
        assert env["channels"][0] == "conda-forge" and "python" in names, path
        assert {"pandas", "pyarrow", "numpy"} <= names, path
        needed = {"envs/trainer-cpu.yaml": {"torch", "transformers", "tokenizers"},
                  "envs/trainer-gpu.yaml": {"vllm", "transformers", "tokenizers"},  # vllm brings its CUDA torch
                  "envs/analysis.yaml": {"matplotlib-base", "seaborn-base", "torch"}}[path]
        assert needed <= names, path
    people = yaml.safe_load((REPO / "environment.yml").read_text())
    assert "-e ." in next(d["pip"] for d in people["dependencies"] if isinstance(d, dict))


# -- the lr axis, per-optimizer lrs, per-model env options, offline statistics, base studies ----------------------
def _tiny(**extra) -> dict:
    return {"models": {"a": {"preset": "minicpm-tiny"}, "b": {"preset": "qwen-tiny"}},
            "grid": [{"recipes": ["spo_adam", "spo_muon"], "seeds": [0]}], **extra}


def test_a_grid_without_lrs_keeps_the_four_key_layout():
    from snakemake.utils import Paramspace
    grid = cc.grid_frame(_tiny())
    assert list(grid.columns) == cc.GRID_COLUMNS and not cc.has_lr_axis(_tiny())
    assert next(Paramspace(grid, param_sep="=").instance_patterns) == "model=a/recipe=spo_adam/optimizer=adam/seed=0"


def test_a_grid_with_lrs_gets_an_lr_column_and_folder():
    from snakemake.utils import Paramspace
    study = _tiny(study="stability")
    study["grid"][0]["lrs"] = [1.0e-4, 3.0e-4, 0.0003]  # 3.0e-4 and 0.0003 are one lr: one cell
    grid = cc.grid_frame(study)
    assert list(grid.columns) == cc.LR_GRID_COLUMNS == ["model", "recipe", "optimizer", "lr", "seed"]
    assert len(grid) == 2 * 2 * 2 and sorted(set(grid["lr"])) == ["1e-04", "3e-04"]
    space = Paramspace(grid, param_sep="=")
    assert space.wildcard_pattern == "model={model}/recipe={recipe}/optimizer={optimizer}/lr={lr}/seed={seed}"
    assert "model=b/recipe=spo_muon/optimizer=muon/lr=3e-04/seed=0" in set(space.instance_patterns)
    cc.check_study(study)


@pytest.mark.parametrize("lr", [1e-4, 3e-4, 2.5e-4, 1e-2, 0.1, 1.0, 1.234567e-5, 7e-7])
def test_the_lr_folder_name_reads_back_exactly(lr):
    assert float(cc.lr_label(lr)) == lr


def test_per_optimizer_lrs_and_adam_high_lr():
    study = _tiny(lr={"adam": 3.0e-4, "muon": 1.0e-3}, cell={"optim": {"weight_decay": 0.1}})
    cell = lambda optimizer, lr=None: cc.cell_config(study, "a", "full", optimizer, 0, "p", 1, lr=lr)["optim"]
    assert cell("adam") == {"weight_decay": 0.1, "name": "adam", "lr": 3.0e-4}
    assert cell("muon") == {"weight_decay": 0.1, "name": "muon", "lr": 1.0e-3}  # Muon's hidden matrices too
    assert cell("adam_high_lr") == {"weight_decay": 0.1, "name": "adam_high_lr", "muon_lr": 1.0e-3}
    assert cell("adam", lr=1e-2)["lr"] == 1e-2  # a grid lr wins over the table
    for optimizer, lr, muon_lr in (("adam", 3e-4, None), ("muon", 1e-3, None), ("adam_high_lr", 1e-3, 1e-3)):
        cfg = config_from_dict(cc.cell_config(study, "a", "full", optimizer, 0, str(REPO), 1))
        assert (cfg.optim.lr if optimizer != "adam_high_lr" else cfg.optim.muon_lr, cfg.optim.muon_lr) == (lr, muon_lr)
    # no table, no grid lr: the shared block's rates, untouched
    plain = _tiny(cell={"optim": {"lr": 5e-4, "muon_lr": 2e-3}})
    assert cc.cell_config(plain, "a", "full", "muon", 0, "p", 1)["optim"] == {"lr": 5e-4, "muon_lr": 2e-3,
                                                                              "name": "muon"}


@pytest.mark.parametrize("edit, named", [
    pytest.param(lambda s: s["grid"][0].update(lrs=[1e-3, 0]), r"grid\[0\].lrs: learning rates must be numbers > 0",
                 id="lrs-positive"),
    pytest.param(lambda s: s.update(lr={"adam_high_lr": 1e-3}), r"lr.adam_high_lr: the lr table names", id="lr-key"),
    pytest.param(lambda s: s.update(lr={"adam": -1}), r"lr.adam: a learning rate must be a number > 0",
                 id="lr-positive"),
    pytest.param(lambda s: s.update(study="main"), r"grid\[0\].lrs: only a `study: stability` has an lr axis",
                 id="lrs-outside-stability"),
    pytest.param(lambda s: s["grid"][0].pop("lrs"), "grid: a stability study sweeps learning rates",
                 id="stability-without-lrs"),
    pytest.param(lambda s: s["grid"].append({"recipes": ["full"], "seeds": [0]}), r"grid\[1\].lrs: missing",
                 id="block-without-lrs"),
    pytest.param(lambda s: s["grid"][0].update(optimizer="adam_high_lr"), r"grid\[0\].lrs: adam_high_lr runs",
                 id="lrs-on-adam-high-lr"),
    pytest.param(lambda s: s.update(cell={"optim": {"muon_lr": 2e-3}}), "cell.optim.muon_lr: the study sets",
                 id="shared-muon-lr"),
])
def test_check_study_names_the_broken_lr_key(edit, named):
    study = _tiny(study="stability")
    study["grid"][0]["lrs"] = [1e-4, 1e-3]
    cc.check_study(study)
    edit(study)
    with pytest.raises(cc.StudyError, match=named):
        cc.check_study(study)
    # a shared muon_lr is fine where no Muon cell gets its lr from the study
    cc.check_study(_tiny(cell={"optim": {"muon_lr": 2e-3}}, lr={"adam": 1e-4}))


def test_env_options_of_a_model_merge_into_its_cells_and_warm_start():
    study = {"models": {"h1": {"preset": "qwen-tiny", "horizon": 1},
                        "h4": {"preset": "qwen-tiny", "horizon": 4,
                               "env_options": {"min_bugs": 4, "max_bugs": 4, "max_turns": 18}}},
             "grid": [{"recipes": ["full"], "seeds": [0]}],
             "cell": {"env": {"name": "minirepo", "options": {"max_depth": 0, "max_turns": 8, "min_files": 4},
                              "eval_tasks": 4}}}
    h4 = cc.cell_config(study, "h4", "full", "muon", 0, "p", 1)["env"]
    assert h4 == {"name": "minirepo", "options": {"max_depth": 0, "max_turns": 18, "min_files": 4, "min_bugs": 4,
                                                  "max_bugs": 4}, "eval_tasks": 4}
    assert cc.cell_config(study, "h1", "full", "muon", 0, "p", 1)["env"] == study["cell"]["env"]
    assert cc.warm_start_config(study, "h4", threads=1)["env"] == h4
    assert study["cell"]["env"]["options"]["max_turns"] == 8  # the study is not modified
    cc.check_env_options(study, REPO)
    study["models"]["h4"]["env_options"]["min_files"] = 1  # 4 bugs no longer fit the smallest repository
    with pytest.raises(cc.StudyError, match=r"cell.env.options with models.h4.env_options: MiniRepoConfig: max_bugs"):
        cc.check_env_options(study, REPO)


def test_models_can_share_a_warm_started_policy():
    """`policy: base`: the cells of h2 start from base's warm-started policy on h2's own tasks; only base is
    warm-started, and h2's cells get no offline statistics (base's offline pass played other tasks)."""
    study = {"models": {"base": {"preset": "qwen-tiny", "env_options": {"min_bugs": 1, "max_bugs": 2}},
                        "h2": {"policy": "base", "env_options": {"min_bugs": 2, "max_bugs": 2}}},
             "grid": [{"models": ["h2"], "recipes": ["full"], "seeds": [0, 1]}],
             "cell": {"env": {"name": "minirepo", "options": {"max_depth": 0}}},
             "warm_start": {"offline_samples": 2}}
    cc.check_study(study)
    grid = cc.grid_frame(study)
    assert cc.warm_started_models(study, grid) == ["base"] and cc.policy_model(study, "h2") == "base"
    cell = cc.cell_config(study, "h2", "full", "muon", 0, "results/policies/base", 1)
    assert cell["env"]["options"] == {"max_depth": 0, "min_bugs": 2, "max_bugs": 2}
    assert "offline_stats" not in cell.get("rl", {})
    assert cc.warm_start_config(study, "base", threads=1)["env"]["options"]["max_bugs"] == 2


def test_a_horizon_study_labels_every_model_of_its_grid():
    study = {"study": "horizon", "models": {"h1": {"preset": "qwen-tiny", "horizon": 1, "paper_name": "Q"},
                                            "h2": {"preset": "qwen-tiny", "horizon": 2, "paper_name": "Q"},
                                            "unused": {"preset": "qwen-tiny"}},
             "grid": [{"models": ["h1", "h2"], "recipes": ["spo_adam"], "seeds": [0]}]}
    cc.check_study(study)  # a model the grid leaves out needs no label
    assert cc.horizons(study) == {"h1": 1, "h2": 2}
    study["grid"][0]["models"].append("unused")
    with pytest.raises(cc.StudyError, match="models.unused.horizon: a horizon study labels every model"):
        cc.check_study(study)
    study["models"]["unused"].update(horizon=2, paper_name="Q")
    with pytest.raises(cc.StudyError, match="models.unused.horizon: h2 has the same paper_name and horizon 2"):
        cc.check_study(study)


def test_offline_stats_path_in_the_cells_of_warm_started_models(tmp_path):
    (tmp_path / "ckpt").mkdir()
    study = _tiny(warm_start={"offline_samples": 2})
    study["models"]["c"] = {"path": str(tmp_path / "ckpt")}
    cell = cc.cell_config(study, "a", "spo_muon", "muon", 0, "results/policies/a", 1)
    assert cell["rl"] == {"offline_stats": "results/policies/a/offline_stats.json"}  # relative as model.path is
    assert "rl" not in cc.cell_config(study, "c", "spo_muon", "muon", 0, str(tmp_path / "ckpt"), 1)  # a checkpoint
    assert "rl" not in cc.cell_config(_tiny(), "a", "spo_muon", "muon", 0, "results/policies/a", 1)
    # before any policy exists, the cells pass the trainer's checks (its file check would fail on ".")
    cc.check_cells(study, cc.grid_frame(study), root=REPO)


def test_deep_merge_merges_mappings_and_replaces_lists_and_scalars():
    base = {"models": {"a": {"preset": "x"}}, "grid": [{"recipes": ["full"]}], "cell": {"env": {"name": "m",
            "options": {"seed": 0, "max_turns": 8}}, "run": {"updates": 100}}, "workdir": "."}
    over = {"models": {"b": {"preset": "y"}}, "grid": [{"recipes": ["spo_adam"]}],
            "cell": {"env": {"options": {"max_turns": 6}}}, "workdir": "studies/x"}
    assert cc.deep_merge(base, over) == {
        "models": {"a": {"preset": "x"}, "b": {"preset": "y"}}, "grid": [{"recipes": ["spo_adam"]}],
        "cell": {"env": {"name": "m", "options": {"seed": 0, "max_turns": 6}}, "run": {"updates": 100}},
        "workdir": "studies/x"}
    assert base["cell"]["env"]["options"]["max_turns"] == 8  # a copy


def test_a_study_file_may_name_a_base_study(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "root.yaml").write_text("models: {a: {preset: qwen-tiny}}\ncell: {run: {updates: 10, eval_every: 5}}\n")
    (tmp_path / "configs" / "mid.yaml").write_text("base: root.yaml\ncell: {run: {updates: 3}}\nworkdir: mid\n")
    study = {"base": "configs/mid.yaml", "workdir": "top", "grid": [{"recipes": ["full"], "seeds": [0]}]}
    assert cc.resolve_base(study, tmp_path, tmp_path / "top.yaml") == {
        "models": {"a": {"preset": "qwen-tiny"}}, "cell": {"run": {"updates": 3, "eval_every": 5}}, "workdir": "top",
        "grid": [{"recipes": ["full"], "seeds": [0]}]}
    assert cc.resolve_base({"workdir": "x"}, tmp_path) == {"workdir": "x"}  # no base: the study as is
    with pytest.raises(cc.StudyError, match=r"top.yaml: base: 'configs/nope.yaml' is not a study file"):
        cc.resolve_base({"base": "configs/nope.yaml"}, tmp_path, "top.yaml")
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(cc.StudyError, match=r"base: 'self.yaml' loops back"):
        cc.resolve_base({"base": "self.yaml"}, tmp_path, tmp_path / "self.yaml")
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(cc.StudyError, match=r"top.yaml: base: 'empty.yaml' is empty"):
        cc.resolve_base({"base": "empty.yaml"}, tmp_path, "top.yaml")
    (tmp_path / "latin.yaml").write_bytes(b"workdir: caf\xe9\n")
    with pytest.raises(cc.StudyError, match=r"top.yaml: base: 'latin.yaml' is not a readable YAML file"):
        cc.resolve_base({"base": "latin.yaml"}, tmp_path, "top.yaml")
    (tmp_path / "x.yaml").write_text("base: y.yaml\n")
    (tmp_path / "y.yaml").write_text("base: x.yaml\n")
    with pytest.raises(cc.StudyError, match=r"y.yaml: base: 'x.yaml' loops back .*x.yaml -> y.yaml"):
        cc.resolve_base({"base": "x.yaml"}, tmp_path, tmp_path / "top.yaml")


@pytest.mark.parametrize("study_file", ["configs/stability.yaml", "configs/stability-smoke.yaml",
                                        "configs/horizon.yaml", "configs/horizon-smoke.yaml"])
def test_the_new_studies_hold_only_their_differences_and_pass_every_check(study_file):
    raw = yaml.safe_load((REPO / study_file).read_text())
    assert raw["base"] in ("config.yaml", "configs/smoke.yaml") and "resources" not in raw
    # an analysis key only where it differs: the horizon study's collapse rule, calibrated for its batch size
    assert set(raw.get("analysis", {})) <= {"collapse"} and set(raw.get("analysis", {}).get("collapse", {})) <= {
        "drop_fraction"}
    study = _study(study_file)
    cc.check_study(study, root=REPO)
    cc.check_env_options(study, root=REPO)
    cc.check_cells(study, cc.grid_frame(study), root=REPO)
    assert study["workdir"] == "studies/" + Path(study_file).stem


# -- (2) snakemake on a copy of the repository -----------------------------------------------------------------
def _require_snakemake() -> None:
    if importlib.util.find_spec("snakemake") is None:
        message = "Snakemake is not installed in this interpreter (pip install -e .)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the workflow tests must run, but: {message}")
        pytest.skip(message)


def copy_repo(dest: Path) -> Path:
    """The files the workflow needs, copied to `dest` (no results, no .snakemake, no caches)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`snakemake ARGS` from the copy's root, with this interpreter (its virtual environment need not be active)."""
    return subprocess.run([sys.executable, "-m", "snakemake", *args], check=False, cwd=workdir, capture_output=True,
                          text=True, timeout=timeout)


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a snakemake run or dry-run, as {rule: count}."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE) if m[1] != "total"}


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory):
    """One copy for the dry-run and bad-input tests (they never leave outputs behind)."""
    _require_snakemake()
    return copy_repo(tmp_path_factory.mktemp("dry") / "repo")


def test_dry_run_of_the_default_study_has_one_train_job_per_cell(scratch_repo):
    r = snakemake(scratch_repo, "-n", "--cores", "all")
    assert r.returncode == 0, r.stderr[-3000:]
    counts = job_counts(r.stdout + r.stderr)
    assert counts == {"warm_start_config": 2, "warm_start": 2, "cell_config": 60, "train": 60, "summarize": 1,
                      "figures": 1, "all": 1}
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
    # the study file replaces config.yaml: no tiny models, no warm start
    assert job_counts(out) == {"cell_config": 60, "train": 60, "summarize": 1, "figures": 1, "all": 1}
    assert "model=Qwen3.5-4B/recipe=full/optimizer=muon/seed=2" in out and "tiny" not in out
    assert "gpu=8" in out and "runtime=2880" in out and "cpus_per_task=56" in out  # 7 processes x 8 threads
    assert "python -m torch.distributed.run --standalone --nproc-per-node=7 -m trainer train" in out  # -p


def test_paths_are_rebased_from_the_repository_root_to_the_studys_workdir(tmp_path):
    study = {"models": {"a": {"path": "checkpoints/A"}, "b": {"path": "/abs/B"}, "t": {"preset": "qwen-tiny"}},
             "grid": [], "cell": {"env": {"name": "alfworld", "options": {"data_dir": "data/alf", "x": "data/y"}}}}
    got = cc.paths_from_workdir(study, "/repo", "/repo/studies/p")
    assert got["models"] == {"a": {"path": "../../checkpoints/A"}, "b": {"path": "/abs/B"},
                             "t": {"preset": "qwen-tiny"}}
    assert got["cell"]["env"]["options"] == {"data_dir": "../../data/alf", "x": "data/y"}  # only path keys
    assert study["models"]["a"]["path"] == "checkpoints/A"  # a copy
    assert cc.paths_from_workdir(study, "/repo", "/repo")["models"]["a"]["path"] == "checkpoints/A"
    # check_study looks from the repository root, wherever the process runs (a cluster job: in the workdir)
    (tmp_path / "checkpoints" / "A").mkdir(parents=True)
    (tmp_path / "data" / "alf").mkdir(parents=True)
    # a workdir behind a link (scratch storage): the path must resolve from where the job really runs
    (tmp_path / "scratch" / "p").mkdir(parents=True)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "p").symlink_to(tmp_path / "scratch" / "p")
    linked = cc.paths_from_workdir(study, tmp_path, tmp_path / "studies" / "p")["models"]["a"]["path"]
    assert (tmp_path / "scratch" / "p" / linked).resolve() == (tmp_path / "checkpoints" / "A").resolve()
    only_a = {**study, "models": {"a": study["models"]["a"]}}
    cc.check_study(only_a, root=tmp_path)
    with pytest.raises(cc.StudyError, match="models.a.path: 'checkpoints/A' does not exist"):
        cc.check_study(only_a, root=tmp_path / "studies" / "p")


@pytest.mark.slow
def test_a_study_with_a_workdir_and_a_checkpoint_writes_cells_that_find_it(tmp_path):
    """configs/companion-paper.yaml: repository-relative checkpoint and game paths, jobs in studies/companion-paper/.
    The cell config rule runs for real; the paths in cell.yaml must resolve from the folder the job runs in."""
    _require_snakemake()
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
    assert job_counts(out) == {"warm_start_config": 1, "warm_start": 1, "cell_config": 27, "train": 27,
                               "summarize": 1, "figures": 1, "all": 1}
    assert "model=qwen2.5-tiny/recipe=graphgpo/optimizer=adam_high_lr/seed=2/metrics.parquet" in out
    assert "figures/companion_bars.pdf" in out and "fig2" not in out


@pytest.mark.slow
def test_dry_run_of_the_stability_and_horizon_studies(scratch_repo):
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/stability.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    # 2 models x 2 optimizers x 5 lrs x 2 seeds; config.yaml's models, warm starts and settings (its `base`)
    assert job_counts(out) == {"warm_start_config": 2, "warm_start": 2, "cell_config": 40, "train": 40,
                               "summarize": 1, "figures": 1, "all": 1}
    assert "results/cells/model=qwen-tiny/recipe=spo_muon/optimizer=muon/lr=3e-03/seed=1/metrics.parquet" in out
    assert "results/selected_lr.yaml" in out and "figures/stability.pdf" in out and "fig2" not in out
    r = snakemake(scratch_repo, "-n", "--cores", "all", "--configfile", "configs/horizon.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    # 4 horizons (sharing one warm-started policy) x 3 recipes x 3 seeds; config.yaml's own models are not run
    assert job_counts(out) == {"warm_start_config": 1, "warm_start": 1, "cell_config": 36, "train": 36,
                               "summarize": 1, "figures": 1, "all": 1}
    assert "results/cells/model=qwen-h4/recipe=full/optimizer=muon/seed=2/metrics.parquet" in out
    assert "results/policies/qwen-base" in out
    assert "figures/horizon.png" in out and "lr=" not in out and "minicpm-tiny" not in out


@pytest.mark.slow
def test_lint_passes(scratch_repo):
    r = snakemake(scratch_repo, "--lint")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations" in r.stdout + r.stderr


def _bad_study(edit) -> dict:
    study = _study("configs/smoke.yaml")
    edit(study)
    return study


@pytest.mark.parametrize("edit, named", [
    pytest.param(lambda s: s["grid"][0]["recipes"].append("fulll"), "grid[0].recipes: 'fulll' is not a recipe",
                 id="recipe", marks=pytest.mark.slow),
    pytest.param(lambda s: s["grid"][1].update(seeds=[0, -1]), "-1 is less than the minimum of 0", id="seed",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s["models"].update(big={"path": "checkpoints/nowhere"}),
                 "models.big.path: 'checkpoints/nowhere'", id="model-path", marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["rl"].update(clip_hihg=0.3), "unknown config key 'cell.rl.clip_hihg'", id="typo",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s.update(grdi=[]), "'grdi' was unexpected", id="top-level-typo", marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["run"].update(updates="ten"), "cell.run.updates: expected an integer, got 'ten'",
                 id="type", marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["run"].update(updates=0), "cell.run.updates: must be >= 1, got 0", id="range",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["rl"].update(tis_cap=3.0), "cell.rl.tis_cap: each cell sets it", id="recipe-key",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["env"]["options"].update(max_turnz=6),
                 "cell.env.options: unknown config key 'env.options.max_turnz'", id="env-option-typo",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["env"]["options"].update(max_turns="six"),
                 "cell.env.options: env.options.max_turns: expected an integer, got 'six'", id="env-option-value",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s["cell"]["rl"].update(group_size=3),
                 "rollout.batch_size 4 is not a multiple of rl.group_size 3", id="trainer-cross-key",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s.update(study="companion"), "recipes ['full', 'no_length',", id="companion-recipes",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s.update(base="configs/nope.yaml"), "base: 'configs/nope.yaml' is not a study file",
                 id="missing-base", marks=pytest.mark.slow),
    pytest.param(lambda s: s.update(lr={"adma": 1e-3}), "'adma' was unexpected", id="lr-table-typo",
                 marks=pytest.mark.slow),
    pytest.param(lambda s: s["grid"][0].update(lrs=[1e-3]), "grid[0].lrs: only a `study: stability` has an lr axis",
                 id="lr-axis-in-main", marks=pytest.mark.slow),
    pytest.param(lambda s: s["models"]["qwen-tiny"].update(env_options={"max_bugs": 9}),
                 "cell.env.options with models.qwen-tiny.env_options: MiniRepoConfig", id="model-env-options",
                 marks=pytest.mark.slow),
])
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


# -- (3) the users' commands, for real, on the smoke studies ----------------------------------------------------
@pytest.mark.slow
def test_companion_smoke_study_writes_its_table_and_figures_in_its_own_folder(tmp_path):
    """`snakemake --cores all --configfile configs/companion-smoke.yaml`: 9 cells (3 estimators x 3 optimizers),
    the companion summary and figures, all under the study's workdir; the default study's folders stay empty."""
    _require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    r = snakemake(repo, "--cores", "all", "--configfile", "configs/companion-smoke.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    study = repo / "studies" / "companion-smoke"
    cells = sorted((study / "results" / "cells").glob("model=*/recipe=*/optimizer=*/seed=*/metrics.parquet"))
    assert {tuple(p.parent.relative_to(study / "results" / "cells").parts[1:3]) for p in cells} == {
        (f"recipe={r}", f"optimizer={o}") for r in ("grpo", "gigpo", "graphgpo") for o in cc.OPTIMIZERS}
    for path in cells:
        metrics = pd.read_parquet(path)
        assert metrics["eval_success"].notna().all() and "grad_snr" in metrics  # eval_every 1
    summary = pd.read_csv(study / "results" / "summary.csv")
    assert len(summary) == 9
    for fig in ("companion_curves", "companion_bars", "companion_diagnostics"):
        for ext in ("png", "pdf"):
            assert (study / "figures" / f"{fig}.{ext}").stat().st_size > 0
    assert not (repo / "results").exists() and not (repo / "figures").exists()
    report = snakemake(repo, "--configfile", "configs/companion-smoke.yaml", "--report", "report.zip")
    assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
    with zipfile.ZipFile(study / "report.zip") as z:  # relative to the study's workdir
        names = {Path(n).name for n in z.namelist()}
    assert {"report.html", "companion_curves.png", "companion_bars.pdf", "summary.md"} <= names


@pytest.mark.slow
def test_stability_smoke_study_sweeps_lrs_and_writes_the_selected_lrs(tmp_path):
    """`snakemake --cores all --configfile configs/stability-smoke.yaml`: 8 cells (2 optimizers x 2 lrs x 2 seeds)
    in lr= folders, each trained at its folder's lr, then the stability table, selected lrs and figure."""
    _require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    r = snakemake(repo, "--cores", "all", "--configfile", "configs/stability-smoke.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    study = repo / "studies" / "stability-smoke"
    cells = sorted((study / "results" / "cells").glob("model=*/recipe=*/optimizer=*/lr=*/seed=*/metrics.parquet"))
    assert len(cells) == 8
    for path in cells:
        lr = float(path.parent.parent.name.removeprefix("lr="))
        optim = yaml.safe_load((path.parent / "cell.yaml").read_text())["optim"]
        assert optim["lr"] == lr and optim.get("muon_lr") is None
    summary = pd.read_csv(study / "results" / "summary.csv")
    assert len(summary) == 4 and set(summary["lr"]) == {1e-4, 1e-3} and (summary["n_seeds"] == 2).all()
    selected = yaml.safe_load((study / "results" / "selected_lr.yaml").read_text())
    # per family, and `lr`: pooled over the families, the table a study's top-level `lr:` takes as it is
    assert set(selected) == {"qwen-tiny", "lr"}
    for chosen in (selected["qwen-tiny"], selected["lr"]):
        assert set(chosen) == {"adam", "muon"} and set(chosen.values()) <= {1e-4, 1e-3}
    assert selected["lr"] == selected["qwen-tiny"]  # one family: pooling changes nothing
    assert "## Selected learning rates" in (study / "results" / "summary.md").read_text()
    for ext in ("png", "pdf"):
        assert (study / "figures" / f"stability.{ext}").stat().st_size > 0
    assert not (repo / "results").exists() and not (repo / "studies" / "smoke").exists()


@pytest.mark.slow
def test_horizon_smoke_study_trains_one_family_per_horizon_with_offline_stats(tmp_path):
    """`snakemake --cores all --configfile configs/horizon-smoke.yaml`: one warm start (qwen-base, 1-2 bugs per
    task) whose policy every horizon's cells load on their own tasks, without offline statistics (the offline pass
    played qwen-base's tasks, not the horizon's); then the horizon table and figure."""
    _require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    r = snakemake(repo, "--cores", "all", "--configfile", "configs/horizon-smoke.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    study = repo / "studies" / "horizon-smoke"
    cells = sorted((study / "results" / "cells").glob("model=*/recipe=*/optimizer=*/seed=*/metrics.parquet"))
    assert len(cells) == 4
    for path in cells:
        model = path.parts[-5].removeprefix("model=")
        cell = yaml.safe_load((path.parent / "cell.yaml").read_text())
        assert cell["model"]["path"] == "results/policies/qwen-base" and "offline_stats" not in cell["rl"]
        bugs = {"qwen-h1": 1, "qwen-h2": 2}[model]
        assert cell["env"]["options"]["min_bugs"] == cell["env"]["options"]["max_bugs"] == bugs
    summary = pd.read_csv(study / "results" / "summary.csv")
    assert len(summary) == 4 and sorted(set(summary["horizon"])) == [1.0, 2.0]
    assert sorted(p.name for p in (study / "results" / "policies").glob("*.yaml")) == ["qwen-base.yaml"]
    for ext in ("png", "pdf"):
        assert (study / "figures" / f"horizon.{ext}").stat().st_size > 0
    assert not (repo / "results").exists()


def _cells(repo: Path) -> list[Path]:
    return sorted((repo / SMOKE_DIR / "results" / "cells").glob("model=*/recipe=*/optimizer=*/seed=*/metrics.parquet"))


def _stamp(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`snakemake --cores all --configfile configs/smoke.yaml` once, on a fresh copy."""
    _require_snakemake()
    repo = copy_repo(tmp_path_factory.mktemp("smoke") / "repo")
    t0 = time.perf_counter()
    r = snakemake(repo, "--cores", "all", *SMOKE)
    return repo, r, time.perf_counter() - t0


@pytest.mark.slow
def test_smoke_study_trains_every_cell(smoke_run):
    repo, r, seconds = smoke_run
    cells = _cells(repo)
    assert len(cells) == 28, (r.stdout + r.stderr)[-3000:]
    from trainer.logs.parquet_log import read_log
    for path in cells:
        keys = dict(part.split("=") for part in path.parent.relative_to(repo / SMOKE_DIR / "results" / "cells").parts)
        df, provenance = read_log(path)
        assert df["update"].tolist() == [0, 1]  # configs/smoke.yaml: run.updates 2
        cfg = provenance["config"]
        assert (cfg["recipe"], cfg["optim"]["name"], cfg["run"]["seed"]) == (
            keys["recipe"], keys["optimizer"], int(keys["seed"]))
        assert cfg["model"]["path"] == f"results/policies/{keys['model']}"
        # the shell rule wrote exactly the pure helper's config (quoting through the shell lost nothing)
        study = _study("configs/smoke.yaml")
        assert yaml.safe_load((path.parent / "cell.yaml").read_text()) == cc.cell_config(
            study, keys["model"], keys["recipe"], keys["optimizer"],
            int(keys["seed"]), f"results/policies/{keys['model']}", threads=1)
        assert (path.parent / "episodes.parquet").is_file() and (path.parent / "train.log").is_file()
        assert not (path.parent / "checkpoints").exists()  # a finished cell keeps no checkpoints
    for model in ("minicpm-tiny", "qwen-tiny"):
        assert (repo / SMOKE_DIR / "results" / "policies" / model / "warm_start.json").is_file()
    assert not (repo / "results").exists()  # the default study's folder is untouched
    print(f"smoke study: {seconds:.0f} s")


@pytest.mark.slow
def test_smoke_study_writes_the_summary_and_every_figure(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    for name in ("results/summary.csv", "results/summary.md", "results/runs.parquet"):
        assert (repo / SMOKE_DIR / name).stat().st_size > 0, name
    for fig in ("fig2", "fig3", "fig4", "fig5", "diagnostics"):
        for ext in ("png", "pdf"):
            assert (repo / SMOKE_DIR / "figures" / f"{fig}.{ext}").stat().st_size > 0
    summary = pd.read_csv(repo / SMOKE_DIR / "results" / "summary.csv")
    assert len(summary) == 28  # model x recipe x optimizer, one seed each
    up_to_date = snakemake(repo, "-n", "--cores", "all", *SMOKE)
    assert "Nothing to be done" in up_to_date.stdout + up_to_date.stderr
    report = snakemake(repo, *SMOKE, "--report", "report.zip")
    assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
    with zipfile.ZipFile(repo / SMOKE_DIR / "report.zip") as z:  # relative to the study's workdir
        names = {Path(n).name for n in z.namelist()}
    assert {"report.html", "fig2.png", "fig5.pdf", "diagnostics.png", "summary.md"} <= names


@pytest.mark.slow
def test_trainer_version_bump_marks_every_cell_and_warm_start_out_of_date(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    init = repo / "trainer" / "__init__.py"
    original = init.read_text()
    init.write_text(original.replace(f'TRAINER_VERSION = "{trainer.TRAINER_VERSION}"',
                                     'TRAINER_VERSION = "bumped"'))
    try:
        dry = snakemake(repo, "-n", "--cores", "all", *SMOKE)
    finally:
        init.write_text(original)
    out = dry.stdout + dry.stderr
    # the base policies too: an environment or trainer change also changes the warm start's demos and its band
    assert job_counts(out) == {"warm_start": 2, "train": 28, "summarize": 1, "figures": 1, "all": 1}
    assert "Params have changed since last execution" in out


@pytest.mark.slow
def test_rerun_one_cell_then_its_figures(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    target = "results/cells/model=qwen-tiny/recipe=no_tool/optimizer=adam/seed=0/metrics.parquet"
    before = {p: _stamp(p) for p in _cells(repo)}
    figure_before = (repo / SMOKE_DIR / "figures" / "fig5.png").stat().st_mtime_ns
    old = pd.read_parquet(repo / SMOKE_DIR / target).drop(columns=TIMING)
    dry = snakemake(repo, "-n", "--cores", "all", *SMOKE, "--forcerun", target)
    assert job_counts(dry.stdout + dry.stderr) == {"train": 1, "summarize": 1, "figures": 1, "all": 1}
    r2 = snakemake(repo, "--cores", "all", *SMOKE, "--forcerun", target)
    assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    for path, stamp in before.items():
        if path == repo / SMOKE_DIR / target:
            assert path.stat().st_mtime_ns > stamp[0]
        else:
            assert _stamp(path) == stamp, path
    assert (repo / SMOKE_DIR / "figures" / "fig5.png").stat().st_mtime_ns > figure_before
    # lagged rollouts are deterministic: the rerun cell has the same numbers (timings aside)
    pd.testing.assert_frame_equal(pd.read_parquet(repo / SMOKE_DIR / target).drop(columns=TIMING), old)


@pytest.mark.slow
def test_regenerate_only_the_figures(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    before = {p: _stamp(p) for p in [*_cells(repo), repo / SMOKE_DIR / "results" / "summary.csv"]}
    figures = {p: p.stat().st_mtime_ns for p in (repo / SMOKE_DIR / "figures").glob("*.p*")}
    r2 = snakemake(repo, "--cores", "all", *SMOKE, "--forcerun", "figures")
    assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    assert job_counts(r2.stdout + r2.stderr) == {"figures": 1, "all": 1}
    assert all(_stamp(p) == stamp for p, stamp in before.items())
    assert len(figures) == 10 and all(p.stat().st_mtime_ns > t for p, t in figures.items())


@pytest.mark.slow
def test_a_killed_cells_checkpoints_resume_only_under_the_same_base_policy(smoke_run):
    """The train rule's resume key holds the warm-started policy's fingerprint: checkpoints a cell left under an
    older base policy are deleted before it reruns; under the current one they are read (an unreadable one is
    skipped with a warning in train.log, which is how this test sees that the trainer looked at it)."""
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    out = repo / SMOKE_DIR
    target = "results/cells/model=minicpm-tiny/recipe=no_tool/optimizer=muon/seed=0/metrics.parquet"
    cell = (out / target).parent
    sha = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    version, cell_hash = trainer.TRAINER_VERSION, sha(cell / "cell.yaml")
    policy_hash = sha(out / "results" / "policies" / "minicpm-tiny" / "warm_start.json")

    def rerun_with_checkpoints_keyed(key: str) -> str:
        (cell / "checkpoints").mkdir(exist_ok=True)
        (cell / "checkpoints" / "RESUME_KEY").write_text(key + "\n")
        (cell / "checkpoints" / "ckpt-00000001.pt").write_bytes(b"left by a killed run")
        r2 = snakemake(repo, target, "--cores", "1", *SMOKE, "--forcerun", target)
        assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
        assert not (cell / "checkpoints").exists()
        return (cell / "train.log").read_text()

    assert "ckpt-00000001.pt" not in rerun_with_checkpoints_keyed(f"{version} {cell_hash} {'0' * 64}")
    assert "ignoring unreadable checkpoint" in rerun_with_checkpoints_keyed(f"{version} {cell_hash} {policy_hash}")


@pytest.mark.slow
def test_editing_the_papers_numbers_redraws_the_summary_and_figures(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    numbers = repo / "trainer" / "analysis" / "paper_numbers.csv"
    original, stat = numbers.read_bytes(), numbers.stat()
    numbers.write_bytes(original + b"\n")  # an edit (Snakemake compares contents, not only times)
    try:
        dry = snakemake(repo, "-n", "--cores", "all", *SMOKE)
    finally:
        numbers.write_bytes(original)
        os.utime(numbers, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert job_counts(dry.stdout + dry.stderr) == {"summarize": 1, "figures": 1, "all": 1}


@pytest.mark.slow
def test_a_replaced_or_missing_cell_log_is_never_summarised_silently(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    cell = repo / SMOKE_DIR / "results/cells/model=qwen-tiny/recipe=no_tool/optimizer=adam/seed=0"
    saved = {name: ((cell / name).read_bytes(), (cell / name).stat()) for name in ("metrics.parquet",
                                                                                  "episodes.parquet")}

    def restore():
        for name, (data, stat) in saved.items():
            (cell / name).write_bytes(data)
            os.utime(cell / name, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    try:
        # a valid log with no rows: the summary fails naming it (it used to drop the cell from summary.csv)
        import pyarrow.parquet as pq
        pq.write_table(pq.read_table(cell / "metrics.parquet").slice(0, 0), cell / "metrics.parquet")
        failed = snakemake(repo, "--cores", "1", *SMOKE, "--forcerun", "summarize")
        log = (repo / SMOKE_DIR / "results" / "logs" / "summarize.log").read_text()
        assert failed.returncode != 0 and "model=qwen-tiny/recipe=no_tool/optimizer=adam/seed=0/metrics.parquet' " \
            "has 0 row(s) (updates none) but its cell ran 2 update(s)" in log, log
        restore()
        # a deleted episode log is a missing input of the summary: its cell reruns
        (cell / "episodes.parquet").unlink()
        dry = snakemake(repo, "-n", "--cores", "all", *SMOKE)
        assert job_counts(dry.stdout + dry.stderr) == {"train": 1, "summarize": 1, "figures": 1, "all": 1}
    finally:
        restore()


KILL_GRID = {"grid": [{"name": "kill_test", "models": ["minicpm-tiny"], "recipes": ["spo_adam", "spo_muon", "full"],
                       "seeds": [0]}],
             "cell": {"run": {"updates": 4}}}  # merged into smoke.yaml: more time between checkpoint and finish


def _finished_train_outputs(log: str) -> set[str]:
    """metrics.parquet of the train jobs snakemake reported finished (jobid -> output from the job blocks)."""
    block = re.compile(r"^(?:local)?rule train:\n(?:    .*\n)*?    output: (\S+?),[^\n]*\n(?:    .*\n)*?"
                       r"    jobid: (\d+)", re.MULTILINE)
    outputs = {jobid: out for out, jobid in block.findall(log)}
    return {outputs[j] for j in re.findall(r"Finished jobid: (\d+) \(Rule: train\)", log)}


def _session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid` (/proc/PID/stat: state is field 3, session field 6)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["head and jobs", "head only"])
def test_sigkilled_workflow_recovers_without_touching_finished_cells(tmp_path, kill):
    _require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    (repo / "kill_grid.yaml").write_text(yaml.safe_dump(KILL_GRID))
    args = [sys.executable, "-m", "snakemake", "--cores", "1", *SMOKE, "kill_grid.yaml"]
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        finished: set[str] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            finished = _finished_train_outputs(log_path.read_text())
            # kill once a cell is finished and another one has written its first checkpoint
            midway = [p for p in (repo / SMOKE_DIR / "results" / "cells").glob("*/*/*/*/checkpoints/ckpt-*.pt")]
            if finished and midway:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the workflow ended before it could be killed:\n" + log_path.read_text()[-3000:]
        if kill == "head and jobs":
            os.killpg(proc.pid, signal.SIGKILL)  # snakemake and its running job die together, as on a node loss
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the head alone: its trainer jobs must not train on as orphans
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session_members(proc.pid), "jobs outlived their killed head"
    finally:
        if _session_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert finished, log_path.read_text()[-3000:]
    kept = {repo / SMOKE_DIR / f: _stamp(repo / SMOKE_DIR / f) for f in finished}
    cells_dir = repo / SMOKE_DIR / "results" / "cells"
    interrupted = [p.parent.parent for p in cells_dir.glob("*/*/*/*/checkpoints/ckpt-*.pt")]
    assert interrupted, "no cell was caught mid-run"
    first_row = pd.read_parquet(interrupted[0] / "metrics.parquet").iloc[0]  # flushed with the checkpoint

    # a plain rerun refuses, naming the interrupted cell's outputs as incomplete; the killed process also left
    # its lock, so the recovery is `snakemake --unlock`, then the same command with --rerun-incomplete
    refused = subprocess.run(args, check=False, cwd=repo, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "IncompleteFilesException" in refused.stdout + refused.stderr
    assert str((interrupted[0] / "metrics.parquet").relative_to(repo / SMOKE_DIR)) in refused.stdout + refused.stderr
    assert snakemake(repo, "--unlock", *SMOKE, "kill_grid.yaml").returncode == 0
    r = snakemake(repo, "--cores", "all", *SMOKE, "kill_grid.yaml", "--rerun-incomplete")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]

    assert len(_cells(repo)) == 3
    for path, stamp in kept.items():
        assert _stamp(path) == stamp, f"{path} was rewritten"
    # the interrupted cell resumed from its checkpoint: its first update's timings are the pre-kill ones
    resumed = pd.read_parquet(interrupted[0] / "metrics.parquet")
    assert resumed["update"].tolist() == [0, 1, 2, 3]
    assert resumed.iloc[0][TIMING].tolist() == first_row[TIMING].tolist()
    assert not (interrupted[0] / "checkpoints").exists()
