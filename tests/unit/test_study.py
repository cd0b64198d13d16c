"""The study model (trainer/study/) against hand-written expectations: grids, cell configs, lrs, models and base
studies, and its checks of the trainer blocks naming the broken key. Pure Python: no Snakemake runs here (the
workflow's dry runs: test_workflow_dryrun.py; its real runs: test_workflow_runs.py).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from workflow_runner import REPO, read_study

import trainer.study as cc
from trainer.analysis.cell_logs import lr_label
from trainer.config import RECIPES, build_config, config_from_dict, load_warm_start_config

STUDY_FILES = ["config.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))]


# -- grids, cell configs, warm starts, study checks -----------------------------------------------------------
def test_a_companion_study_must_validate_and_compare_estimators():
    study = read_study("configs/companion-smoke.yaml")
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
    grid = cc.Study.load(read_study("config.yaml"), REPO).grid
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
    assert len(cc.Study.load(read_study("configs/smoke.yaml"), REPO).grid) == 28  # 2 x (8 + 6), one seed


grid_blocks = st.lists(
    st.fixed_dictionaries(
        {
            "recipes": st.lists(st.sampled_from(list(RECIPES)), min_size=1, max_size=4),
            "seeds": st.lists(st.integers(0, 3), min_size=1, max_size=3),
            "optimizer": st.sampled_from(["recipe", *cc.OPTIMIZERS]),
        },
        optional={"models": st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2)},
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(grid_blocks)
def test_grid_is_the_union_of_block_products(blocks):
    study = {"models": {"a": {"preset": "minicpm-tiny"}, "b": {"preset": "qwen-tiny"}}, "grid": blocks}
    grid = cc.grid_frame(cc.check_study({**study, "lr": {"muon": 1e-3}}))  # adam_high_lr runs at Muon's lr
    expected = set()
    for block in blocks:
        for m, r, s in itertools.product(block.get("models", ["a", "b"]), block["recipes"], block["seeds"]):
            expected.add((m, r, cc.RECIPE_OPTIMIZER[r] if block["optimizer"] == "recipe" else block["optimizer"], s))
    rows = list(grid.itertuples(index=False, name=None))
    assert len(rows) == len(set(rows)) and set(rows) == expected


def test_cell_config_is_the_shared_block_plus_the_cell_keys():
    study = {
        "models": {"m": {"preset": "qwen-tiny"}},
        "grid": [{"recipes": ["no_tool"], "optimizer": "adam", "seeds": [2]}],
        "cell": {
            "model": {"dtype": "float32"},
            "env": {"name": "minirepo", "options": {"max_depth": 1}},
            "optim": {"lr": 0.5},
            "shaping": {"length_threshold": 7},
            "run": {"updates": 3},
        },
        "resources": {"train": {"threads": 4}},
    }
    loaded = cc.Study.load(study, REPO)
    got = loaded.cell_config(cc.CellKey("m", "no_tool", "adam", 2))
    assert got == {
        "recipe": "no_tool",
        "model": {"dtype": "float32", "path": "results/policies/m"},
        "optim": {"lr": 0.5, "name": "adam"},
        "env": {"name": "minirepo", "options": {"max_depth": 1}},
        "shaping": {"length_threshold": 7},
        "run": {"updates": 3, "seed": 2, "threads": 4},
    }
    got["env"]["options"]["max_depth"] = 9  # a deep copy: the study is not modified through the cell
    assert loaded.cell_config(cc.CellKey("m", "no_tool", "adam", 2))["env"]["options"]["max_depth"] == 1


def test_warm_start_config_takes_the_cells_env_and_token_limits():
    study = {
        "models": {"m": {"preset": "minicpm-tiny"}},
        "cell": {
            "model": {"dtype": "float32", "init_seed": 3},
            "env": {"name": "minirepo"},
            "rollout": {"batch_size": 8, "max_turn_tokens": 12, "max_episode_tokens": 256},
        },
        "warm_start": {"n_demos": 10, "band": [0.0, 1.0], "allow_out_of_band": True},
        "grid": [{"recipes": ["full"], "seeds": [0]}],
        "resources": {"warm_start": {"threads": 2}},
    }
    assert cc.Study.load(study, REPO).warm_start_config("m") == {
        "model": {"preset": "minicpm-tiny", "dtype": "float32", "init_seed": 3},
        "env": {"name": "minirepo"},
        "rollout": {"max_turn_tokens": 12, "max_episode_tokens": 256},  # batch_size is not the warm start's
        "n_demos": 10,
        "band": [0.0, 1.0],
        "threads": 2,
    }


def test_a_models_warm_start_seed_seeds_its_warm_start_and_initialisation():
    study = {
        "models": {"m": {"preset": "qwen-tiny"}, "m2": {"preset": "qwen-tiny", "warm_start_seed": 2}},
        "cell": {"model": {"init_seed": 3}, "env": {"name": "minirepo"}},
        "warm_start": {"seed": 5},
        "grid": [{"recipes": ["full"], "seeds": [0]}],
    }
    loaded = cc.Study.load(study, REPO)
    first, second = (loaded.warm_start_config(m) for m in ("m", "m2"))
    assert (first["seed"], first["model"]["init_seed"]) == (5, 3)
    assert (second["seed"], second["model"]["init_seed"]) == (2, 2)


def test_a_models_warm_start_keys_go_over_the_studys():
    study = {
        "models": {
            "m": {"preset": "qwen-tiny"},
            "a": {"preset": "qwen-tiny", "warm_start": {"optim": {"name": "adam", "matrix_lr": 3e-3}}},
        },
        "cell": {"env": {"name": "minirepo"}},
        "warm_start": {"optim": {"lr": 1e-3, "name": "muon"}, "noise": 0.2},
        "grid": [{"recipes": ["full"], "seeds": [0]}],
    }
    loaded = cc.Study.load(study, REPO)
    muon, adamw = (loaded.warm_start_config(m) for m in ("m", "a"))
    assert muon["optim"] == {"name": "muon", "lr": 1e-3} and muon["noise"] == 0.2
    # key by key: the model's optimizer and matrix rate, the study's rate of the rest and its noise
    assert adamw["optim"] == {"name": "adam", "lr": 1e-3, "matrix_lr": 3e-3} and adamw["noise"] == 0.2


@pytest.mark.parametrize("study_file", STUDY_FILES)
def test_every_cell_of_every_study_is_a_valid_trainer_config(study_file, tmp_path):
    """What the workflow writes must pass the trainer's own validation (model.path: any existing dir, with the
    offline statistics a warm start writes there)."""
    # checked as typed keys, its checkpoints left unchecked: the paper-scale ones are not on this machine
    study = cc.Study(build_config(cc.StudyConfig, read_study(study_file)), REPO)
    (tmp_path / cc.OFFLINE_STATS_FILE).write_text("{}")
    for key in study.keys:
        cfg = config_from_dict(study.cell_config(key, model_path=str(tmp_path)))
        assert (cfg.recipe, cfg.optim.name, cfg.run.seed) == (key.recipe, key.optimizer, key.seed)
        assert key.lr is None or cfg.optim.lr == float(key.lr)
        own = study.config.arm_keys(key.arm).get("optim") or {}
        assert all(getattr(cfg.optim, key) == own[key] for key in ("lr", "matrix_lr") if key in own)
        # PPO as the papers' base setups run it: several optimizer steps per rollout batch, so the clip binds;
        # and one step-size rule (Muon's update RMS matched to AdamW's) in every study but the arms that set theirs
        assert cfg.run.minibatches * cfg.run.epochs >= 2, (study_file, "one optimizer step per batch")
        assert cfg.optim.adjust_lr_fn == own.get("adjust_lr_fn", "match_rms_adamw"), study_file
    for model in study.warm_started:
        path = tmp_path / f"{model}.yaml"
        cc.write_yaml(study.warm_start_config(model), path, header="test")
        assert load_warm_start_config(path).model.preset == study.config.models[model].preset


@pytest.mark.parametrize(
    "edit, named",
    [
        pytest.param(lambda s: s["models"]["m"].update(path="x"), "models.m: give exactly one", id="preset+path"),
        pytest.param(lambda s: s["models"]["m"].pop("preset"), "models.m: give exactly one", id="neither"),
        pytest.param(lambda s: s["models"]["m"].update(policy="m"), "models.m: give exactly one", id="preset+policy"),
        pytest.param(
            lambda s: s["models"].update(h={"policy": "nope"}),
            "models.h.policy: 'nope' is not a model",
            id="policy-unknown",
        ),
        pytest.param(
            lambda s: s["models"].update(h={"policy": "h2"}, h2={"path": "."}),
            "models.h.policy: 'h2' is not a model of this study with a `preset`",
            id="policy-of-a-checkpoint",
        ),
        pytest.param(lambda s: s["models"].update(p={"path": "/no/such/checkpoint"}), "models.p.path", id="no-path"),
        pytest.param(
            lambda s: s["models"].update(h={"policy": "m", "warm_start_seed": 1}),
            "models.h.warm_start_seed: only a model with a `preset` is warm-started",
            id="seed-without-preset",
        ),
        pytest.param(
            lambda s: s["models"].update(h={"policy": "m", "warm_start": {"optim": {"name": "adam"}}}),
            "models.h.warm_start: only a model with a `preset` is warm-started",
            id="warm-start-without-preset",
        ),
        pytest.param(
            lambda s: s["models"]["m"].update(warm_start={"seed": 3}),
            "models.m.warm_start.seed: set for the whole study or by the workflow",
            id="warm-start-seed-per-model",
        ),
        pytest.param(
            lambda s: s["models"]["m"].update(warm_start={"optim": {"name": "sgd"}}),
            "models.m.warm_start.optim.name",
            id="warm-start-optimizer-unknown",
        ),
        pytest.param(
            lambda s: s["grid"][0].update(models=["m", "nope"]), r"grid\[0\].models: 'nope'", id="unknown-model"
        ),
        pytest.param(lambda s: s.update(warm_start={"band": [0.5, 0.2]}), "warm_start.band", id="band"),
        pytest.param(
            lambda s: s["grid"][0].update(recipes=["gigpo"]),
            r"rl.estimator 'gigpo' needs rl.group_size >= 2",
            id="group-estimator-without-groups",
        ),
        pytest.param(
            lambda s: s.update(workdir="../../x"), r"workdir: '../../x' is outside the repository", id="workdir-up"
        ),
        pytest.param(
            lambda s: s.update(workdir="/tmp/x"), r"workdir: '/tmp/x' is outside the repository", id="workdir-absolute"
        ),
        # the trainer blocks, checked by the trainer's own dataclasses
        pytest.param(
            lambda s: s.update(cell={"recipe": "full"}),
            r"cell.recipe: each cell sets it \(from the grid\); remove it",
            id="cell-recipe",
        ),
        pytest.param(
            lambda s: s.update(cell={"optim": {"name": "adam"}}),
            r"cell.optim.name: each cell sets it",
            id="cell-optimizer",
        ),
        pytest.param(
            lambda s: s.update(cell={"run": {"seed": 3}}), r"cell.run.seed: each cell sets it", id="cell-seed"
        ),
        pytest.param(
            lambda s: s.update(cell={"loss": {"agg": "token-mean"}}),
            r"cell.loss.agg: each cell sets it",
            id="cell-recipe-key",
        ),
        pytest.param(
            lambda s: s.update(cell={"rollout": {"top_p": 1.5}}),
            r"cell.rollout.top_p: must be <= 1, got 1.5",
            id="cell-range",
        ),
        pytest.param(
            lambda s: s.update(cell={"optim": {"betas": [0.9, 1.0]}}),
            r"cell.optim.betas: must be < 1, got 1.0",
            id="cell-tuple-range",
        ),
        pytest.param(
            lambda s: s.update(cell={"rollout": {"batch_size": 10**9}}),
            r"cell.rollout.batch_size: 1,000,000,000 is above 65,536",
            id="cell-limit",
        ),
        pytest.param(
            lambda s: s.update(cell={"env": {"eval_taks": 3}}),
            r"unknown config key 'cell.env.eval_taks'",
            id="cell-typo",
        ),
        pytest.param(
            lambda s: s.update(warm_start={"nosie": 0.1}),
            r"unknown config key 'warm_start.nosie'",
            id="warm-start-typo",
        ),
        pytest.param(
            lambda s: s.update(warm_start={"vocab_size": 100}),
            r"warm_start.vocab_size: must be >= 261",
            id="warm-start-range",
        ),
        pytest.param(
            lambda s: s.update(warm_start={"threads": 2}), r"warm_start.threads: set per model", id="warm-threads"
        ),
        pytest.param(
            lambda s: s["models"]["m"].update(preset="gpt-tiny"),
            r"models.m.preset: 'gpt-tiny' is not a tiny",
            id="preset",
        ),
        pytest.param(
            lambda s: s["grid"][0].update(optimizer="sgd"),
            r"grid\[0\].optimizer: 'sgd' is not 'recipe'",
            id="optimizer",
        ),
        pytest.param(
            lambda s: s.update(analysis={"collapse": {"warmpu": 3}}),
            r"analysis.collapse: .*'warmpu'",
            id="collapse-typo",
        ),
        pytest.param(
            lambda s: s.update(
                cell={"rollout": {"engine": "vllm", "server": True}}, resources={"train": {"gpu": 8, "processes": 8}}
            ),
            r"resources.train.gpu: 8 GPUs for 8 trainer process\(es\) and 1 vLLM rollout server\(s\) .*ask for 9",
            id="server-gpu",
        ),
        pytest.param(
            lambda s: s.update(
                cell={"rollout": {"engine": "vllm", "server": True, "server_replicas": 6, "loop": "episodes"}},
                resources={"train": {"gpu": 8, "processes": 3}},
            ),
            r"resources.train.gpu: 8 GPUs for 3 trainer process\(es\) and 6 vLLM rollout server\(s\) .*ask for 9",
            id="server-replicas-gpu",
        ),
        pytest.param(
            lambda s: s.update(cell={"rollout": {"engine": "hf", "server": True}}),
            r"rollout.server: the hf engine runs in the trainer",
            id="server-hf",
        ),
        pytest.param(
            lambda s: s.update(analysis={"collapse": {"drop_fraction": 1.5}}),
            r"analysis.collapse: .*drop_fraction",
            id="collapse-range",
        ),
        # the study's own keys, typed by StudyConfig and its sections
        pytest.param(
            lambda s: s["grid"][0].update(models=None), r"grid\[0\].models: a blank value \(null\)", id="blank-models"
        ),
        pytest.param(lambda s: s.update(lr={"adam": None}), r"lr.adam: a blank value \(null\)", id="blank-lr"),
        pytest.param(
            lambda s: s["models"]["m"].update(horizon="4"),
            r"models.m.horizon: '4' is not an int or a float",
            id="number",
        ),
        pytest.param(
            lambda s: s["models"]["m"].update(paper_name=True),
            r"models.m.paper_name: True is true/false, not a string: YAML reads yes",
            id="yaml-bool",
        ),
        pytest.param(lambda s: s.update(grdi=[]), r"unknown config key 'grdi'", id="top-level-typo"),
        pytest.param(lambda s: s.pop("grid"), r"grid: required", id="no-grid"),
        pytest.param(lambda s: s.update(grid=[]), r"grid: give at least one block", id="empty-grid"),
        pytest.param(lambda s: s.update(models={}), r"models: name at least one model", id="no-models"),
        pytest.param(lambda s: s["grid"][0].pop("seeds"), r"grid\[0\].seeds: required", id="no-seeds"),
        pytest.param(lambda s: s["grid"][0].update(recipes=[]), r"grid\[0\].recipes: an empty list", id="no-recipes"),
        pytest.param(lambda s: s["grid"][0].update(seeds=[0, -1]), r"grid\[0\].seeds: must be >= 0, got -1", id="seed"),
        pytest.param(lambda s: s["grid"][0].update(seeds="0"), r"grid\[0\].seeds: expected a list", id="seeds-type"),
        pytest.param(
            lambda s: s["grid"][0].update(model=["m"]), r"unknown config key 'grid\[0\].model'", id="block-typo"
        ),
        pytest.param(
            lambda s: s["models"]["m"].update(preset=3), r"models.m.preset: 3 is an int, not a string", id="preset-type"
        ),
        pytest.param(lambda s: s["models"]["m"].update(horizon=0), r"models.m.horizon: must be > 0", id="horizon"),
        pytest.param(
            lambda s: s["models"].update({"a/b": {"preset": "qwen-tiny"}}), r"models.a/b: a model name", id="name"
        ),
        pytest.param(lambda s: s.update(study="mian"), r"study: 'mian' is not one of \['main'", id="kind"),
        pytest.param(lambda s: s.update(external_workdir="yes"), r"external_workdir: expected true/false", id="flag"),
        pytest.param(
            lambda s: s.update(resources={"train": {"theads": 2}}),
            r"unknown config key 'resources.train.theads'",
            id="resources-typo",
        ),
        pytest.param(
            lambda s: s.update(resources={"warm_start": {"mem_mb": 10}}),
            r"resources.warm_start.mem_mb: must be >= 100, got 10",
            id="resources-range",
        ),
        pytest.param(
            lambda s: s.update(analysis={"window_fraction": 0}),
            r"analysis.window_fraction: must be > 0",
            id="analysis-range",
        ),
        pytest.param(
            lambda s: s.update(warm_start={"allow_out_of_band": "yes"}),
            r"warm_start.allow_out_of_band: expected true/false",
            id="band-flag",
        ),
        pytest.param(lambda s: s.update(cell=None), r"cell: a blank value \(null\)", id="cell-null"),
    ],
)
def test_check_study_names_the_broken_key(edit, named):
    def check(study):  # what common.smk runs before any job
        cc.Study.load(study, REPO)

    study = {"models": {"m": {"preset": "qwen-tiny"}}, "grid": [{"recipes": ["full"], "seeds": [0]}]}
    check(study)  # the unedited study is fine
    edit(study)
    with pytest.raises(cc.StudyError, match=named):
        check(study)


def test_the_checked_study_has_every_default_and_only_the_keys_given():
    """The checked study as a plain mapping (what a Snakemake param carries): the defaults set (the rules read them
    without `.get`), a key not given left out rather than null (the grid's axes are the blocks that give `lrs` or
    `arm`), lists as lists."""
    raw = {"models": {"m": {"preset": "qwen-tiny", "horizon": 2}}, "grid": [{"recipes": ["full"], "seeds": [0, 1]}]}
    checked = cc.check_study(raw)
    study = cc.plain(checked)
    assert study == {
        "models": {"m": {"preset": "qwen-tiny", "horizon": 2}},
        "grid": [{"recipes": ["full"], "seeds": [0, 1], "optimizer": "recipe"}],
        "workdir": ".",
        "external_workdir": False,
        "study": "main",
        "cell": {},
        "warm_start": {"allow_out_of_band": False},
        "resources": {
            job: {
                "threads": 1,
                "mem_mb": 4000,
                "runtime": 120,
                "gpu": 0,
                "processes": 1,
                "nodes": 1,
                "exclusive": False,
            }
            for job in ("train", "warm_start")
        },
        "analysis": {"window_fraction": 0.1, "ema_span": 5, "collapse": {}},
        "preflight": {"min_gold_share": 0.9, "rows_per_repository": 2, "workers": 4, "mem_mb": 8000, "runtime": 120},
        "keep": {"policy": True, "checkpoint": False},
        "trackers": {"tensorboard": False, "wandb": False},
    }
    assert type(study["models"]["m"]["horizon"]) is int  # a label keeps its spelling (the horizon figure's axis)
    assert raw == {
        "models": {"m": {"preset": "qwen-tiny", "horizon": 2}},
        "grid": [{"recipes": ["full"], "seeds": [0, 1]}],
    }
    assert list(cc.grid_frame(checked).columns) == ["model", "recipe", "optimizer", "seed"]
    assert checked.resources.train.threads == 1 and checked.models["m"].horizon == 2  # typed where the rules read it


def test_an_external_workdir_is_allowed_when_the_study_says_so(tmp_path):
    study = {
        "models": {"m": {"preset": "qwen-tiny"}},
        "grid": [{"recipes": ["full"], "seeds": [0]}],
        "workdir": "/tmp/elsewhere",
        "external_workdir": True,
    }
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
        pip = next((d["pip"] for d in env["dependencies"] if isinstance(d, dict)), [])
        names = {re.split(r"[ =<>]", d)[0] for d in deps + pip}
        assert env["channels"][0] == "conda-forge" and "python" in names, path
        assert {"pandas", "pyarrow", "numpy"} <= names, path
        needed = {
            "envs/trainer-cpu.yaml": {"torch", "transformers", "tokenizers"},
            "envs/trainer-gpu.yaml": {"vllm", "transformers", "tokenizers"},  # vllm brings its CUDA torch
            "envs/analysis.yaml": {"matplotlib-base", "seaborn-base", "scipy"},
        }[path]
        assert needed <= names, path
    assert "torch" not in yaml.safe_load((REPO / "envs/analysis.yaml").read_text())["dependencies"]


def test_the_analysis_needs_no_torch():
    """envs/analysis.yaml has no torch: every analysis module and the rules' scripts import without it."""
    modules = sorted(f"trainer.analysis.{p.stem}" for p in (REPO / "trainer/analysis").glob("*.py"))
    modules += ["trainer.study", "trainer.rollout.config"]  # what they import inside their functions
    code = (
        "import sys, importlib, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch': raise ImportError('no torch in the analysis environment')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import trainer.logs.provenance as p; assert 'torch_error' in p.hardware()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    people = yaml.safe_load((REPO / "environment.yml").read_text())
    assert "-e ." in next(d["pip"] for d in people["dependencies"] if isinstance(d, dict))


# -- the lr axis, per-optimizer lrs, per-model env options, offline statistics, base studies ----------------------
def _tiny(**extra) -> dict:
    return {
        "models": {"a": {"preset": "minicpm-tiny"}, "b": {"preset": "qwen-tiny"}},
        "grid": [{"recipes": ["spo_adam", "spo_muon"], "seeds": [0]}],
        **extra,
    }


def test_a_grid_without_lrs_keeps_the_four_key_layout():
    from snakemake.utils import Paramspace

    grid = cc.Study.load(_tiny(), REPO).grid
    assert list(grid.columns) == ["model", "recipe", "optimizer", "seed"]
    assert next(Paramspace(grid, param_sep="=").instance_patterns) == "model=a/recipe=spo_adam/optimizer=adam/seed=0"


def test_a_grid_with_lrs_gets_an_lr_column_and_folder():
    from snakemake.utils import Paramspace

    study = _tiny(study="stability")
    study["grid"][0]["lrs"] = [1.0e-4, 3.0e-4, 0.0003]  # 3.0e-4 and 0.0003 are one lr: one cell
    grid = cc.Study.load(study, REPO).grid
    assert list(grid.columns) == ["model", "recipe", "optimizer", "lr", "seed"]
    assert len(grid) == 2 * 2 * 2 and sorted(set(grid["lr"])) == ["1e-04", "3e-04"]
    space = Paramspace(grid, param_sep="=")
    assert space.wildcard_pattern == "model={model}/recipe={recipe}/optimizer={optimizer}/lr={lr}/seed={seed}"
    assert "model=b/recipe=spo_muon/optimizer=muon/lr=3e-04/seed=0" in set(space.instance_patterns)
    cc.check_study(study)


@pytest.mark.parametrize("lr", [1e-4, 3e-4, 2.5e-4, 1e-2, 0.1, 1.0, 1.234567e-5, 7e-7])
def test_the_lr_folder_name_reads_back_exactly(lr):
    assert float(lr_label(lr)) == lr


def test_per_optimizer_lrs_and_adam_high_lr():
    grid = [{"recipes": ["full"], "optimizer": name, "seeds": [0]} for name in cc.OPTIMIZERS]
    study = cc.Study.load(
        _tiny(lr={"adam": 3.0e-4, "muon": 1.0e-3}, cell={"optim": {"weight_decay": 0.1}}, grid=grid), REPO
    )
    swept = [{"recipes": ["full"], "optimizer": "adam", "lrs": [1e-2], "seeds": [0]}]
    stability = cc.Study.load(_tiny(study="stability", grid=swept), REPO)

    def cell(optimizer, lr=None):
        loaded = study if lr is None else stability
        return loaded.cell_config(cc.CellKey("a", "full", optimizer, 0, lr=lr), model_path="p")["optim"]

    assert cell("adam") == {"weight_decay": 0.1, "name": "adam", "lr": 3.0e-4}
    assert cell("muon") == {"weight_decay": 0.1, "name": "muon", "lr": 1.0e-3}  # Muon's hidden matrices too
    assert cell("adam_high_lr") == {"weight_decay": 0.1, "name": "adam_high_lr", "lr": 1.0e-3}  # AdamW at Muon's
    assert cell("adam", lr=lr_label(1e-2))["lr"] == 1e-2  # a grid lr, read back from its folder label
    for optimizer, lr in (("adam", 3e-4), ("muon", 1e-3), ("adam_high_lr", 1e-3)):
        cfg = config_from_dict(study.cell_config(cc.CellKey("a", "full", optimizer, 0), model_path=str(REPO)))
        assert (cfg.optim.lr, cfg.optim.matrix_lr) == (lr, lr)  # a left-out matrix_lr is the lr, set once when built
    with pytest.raises(cc.StudyError, match=r"grid\[0\].optimizer: adam_high_lr runs AdamW at the Muon cells'"):
        cc.check_study(_tiny(grid=[{"recipes": ["full"], "optimizer": "adam_high_lr", "seeds": [0]}]))
    # no table, no grid lr: the shared block's rates, untouched
    plain = cc.Study.load(_tiny(cell={"optim": {"lr": 5e-4, "matrix_lr": 2e-3}}), REPO)
    assert plain.cell_config(cc.CellKey("a", "full", "muon", 0), model_path="p")["optim"] == {
        "lr": 5e-4,
        "matrix_lr": 2e-3,
        "name": "muon",
    }


@pytest.mark.parametrize(
    "edit, named",
    [
        pytest.param(
            lambda s: s["grid"][0].update(lrs=[1e-3, 0]),
            r"grid\[0\].lrs: must be > 0, got 0.0",
            id="lrs-positive",
        ),
        pytest.param(
            lambda s: s.update(lr={"adam_high_lr": 1e-3}), r"unknown config key 'lr.adam_high_lr'", id="lr-key"
        ),
        pytest.param(lambda s: s.update(lr={"adam": -1}), r"lr.adam: must be > 0, got -1", id="lr-positive"),
        pytest.param(
            lambda s: s.update(study="main"),
            r"grid\[0\].lrs: only a `study: stability` has an lr axis",
            id="lrs-outside-stability",
        ),
        pytest.param(
            lambda s: s["grid"][0].pop("lrs"),
            "grid: a stability study sweeps learning rates",
            id="stability-without-lrs",
        ),
        pytest.param(
            lambda s: s["grid"].append({"recipes": ["full"], "seeds": [0]}),
            r"grid\[1\].lrs: missing",
            id="block-without-lrs",
        ),
        pytest.param(
            lambda s: s["grid"][0].update(optimizer="adam_high_lr"),
            r"grid\[0\].lrs: adam_high_lr runs",
            id="lrs-on-adam-high-lr",
        ),
        pytest.param(
            lambda s: s.update(cell={"optim": {"matrix_lr": 2e-3}}),
            "cell.optim.matrix_lr: the study sets",
            id="shared-muon-lr",
        ),
    ],
)
def test_check_study_names_the_broken_lr_key(edit, named):
    study = _tiny(study="stability")
    study["grid"][0]["lrs"] = [1e-4, 1e-3]
    cc.check_study(study)
    edit(study)
    with pytest.raises(cc.StudyError, match=named):
        cc.check_study(study)
    # a shared matrix_lr is fine where no Muon cell gets its lr from the study
    cc.check_study(_tiny(cell={"optim": {"matrix_lr": 2e-3}}, lr={"adam": 1e-4}))


def test_env_options_of_a_model_merge_into_its_cells_and_warm_start():
    study = {
        "models": {
            "h1": {"preset": "qwen-tiny", "horizon": 1},
            "h4": {"preset": "qwen-tiny", "horizon": 4, "env_options": {"min_bugs": 4, "max_bugs": 4, "max_turns": 18}},
        },
        "grid": [{"recipes": ["full"], "seeds": [0]}],
        "cell": {
            "env": {"name": "minirepo", "options": {"max_depth": 0, "max_turns": 8, "min_files": 4}, "eval_tasks": 4}
        },
    }
    loaded = cc.Study.load(study, REPO)
    h4 = loaded.cell_config(cc.CellKey("h4", "full", "muon", 0))["env"]
    assert h4 == {
        "name": "minirepo",
        "options": {"max_depth": 0, "max_turns": 18, "min_files": 4, "min_bugs": 4, "max_bugs": 4},
        "eval_tasks": 4,
    }
    assert loaded.cell_config(cc.CellKey("h1", "full", "muon", 0))["env"] == study["cell"]["env"]
    assert loaded.warm_start_config("h4")["env"] == h4
    assert study["cell"]["env"]["options"]["max_turns"] == 8  # the study is not modified
    cc.check_study(study, REPO)
    study["models"]["h4"]["env_options"]["min_files"] = 1  # 4 bugs no longer fit the smallest repository
    with pytest.raises(cc.StudyError, match=r"cell.env.options with models.h4.env_options: MiniRepoConfig: max_bugs"):
        cc.check_study(study, REPO)


def test_models_can_share_a_warm_started_policy():
    """`policy: base`: the cells of h2 start from base's warm-started policy on h2's own tasks; only base is
    warm-started, and h2's cells get no offline statistics (base's offline pass played other tasks)."""
    study = {
        "models": {
            "base": {"preset": "qwen-tiny", "env_options": {"min_bugs": 1, "max_bugs": 2}},
            "h2": {"policy": "base", "env_options": {"min_bugs": 2, "max_bugs": 2}},
        },
        "grid": [{"models": ["h2"], "recipes": ["full"], "seeds": [0, 1]}],
        "cell": {"env": {"name": "minirepo", "options": {"max_depth": 0}}},
        "warm_start": {"offline_samples": 2},
    }
    loaded = cc.Study.load(study, root=REPO)
    assert loaded.warm_started == ["base"] and loaded.config.policy_model("h2") == "base"
    cell = loaded.cell_config(cc.CellKey("h2", "full", "muon", 0))
    assert cell["model"]["path"] == "results/policies/base"
    assert cell["env"]["options"] == {"max_depth": 0, "min_bugs": 2, "max_bugs": 2}
    assert "offline_stats" not in cell.get("rl", {}).get("spo", {})
    assert loaded.warm_start_config("base")["env"]["options"]["max_bugs"] == 2
    # what the workflow reads: h2's cells load base's warm-started policy, so base's warm start is their input
    assert loaded.loads_warm_start("h2") and loaded.loads_warm_start("base")
    assert loaded.model_path("h2") == "results/policies/base"
    assert loaded.config.paper_names() == {"base": "base", "h2": "h2"} and loaded.config.horizons() == {}


def test_a_horizon_study_labels_every_model_of_its_grid():
    study = {
        "study": "horizon",
        "models": {
            "h1": {"preset": "qwen-tiny", "horizon": 1, "paper_name": "Q"},
            "h2": {"preset": "qwen-tiny", "horizon": 2, "paper_name": "Q"},
            "unused": {"preset": "qwen-tiny"},
        },
        "grid": [{"models": ["h1", "h2"], "recipes": ["spo_adam"], "seeds": [0]}],
    }
    checked = cc.check_study(study)  # a model the grid leaves out needs no label
    assert checked.horizons() == {"h1": 1, "h2": 2} and checked.paper_names()["unused"] == "unused"
    study["grid"][0]["models"].append("unused")
    with pytest.raises(cc.StudyError, match="models.unused.horizon: a horizon study labels every model"):
        cc.check_study(study)
    study["models"]["unused"].update(horizon=2, paper_name="Q")
    with pytest.raises(cc.StudyError, match="models.unused.horizon: h2 has the same paper_name and horizon 2"):
        cc.check_study(study)


def test_offline_stats_path_in_the_cells_of_warm_started_models(tmp_path):
    (tmp_path / "ckpt").mkdir()
    study = _tiny(warm_start={"offline_samples": 2}, cell={"rl": {"group_size": 2}})
    study["models"]["c"] = {"path": str(tmp_path / "ckpt")}
    study["grid"].append({"recipes": ["grpo"], "seeds": [0]})
    # before any policy exists, the cells pass the trainer's checks (its file check would fail on "."): `load`
    loaded = cc.Study.load(study, REPO)
    cell = loaded.cell_config(cc.CellKey("a", "spo_muon", "muon", 0))
    assert cell["rl"]["spo"] == {"offline_stats": "results/policies/a/offline_stats.json"}  # relative as model.path
    assert "spo" not in loaded.cell_config(cc.CellKey("a", "grpo", "adam", 0))["rl"]  # no SPO tracker
    assert "spo" not in loaded.cell_config(cc.CellKey("c", "spo_muon", "muon", 0))["rl"]  # a checkpoint
    plain = cc.Study.load(_tiny(), REPO)
    assert "rl" not in plain.cell_config(cc.CellKey("a", "spo_muon", "muon", 0))


def test_deep_merge_merges_mappings_and_replaces_lists_and_scalars():
    base = {
        "models": {"a": {"preset": "x"}},
        "grid": [{"recipes": ["full"]}],
        "cell": {"env": {"name": "m", "options": {"seed": 0, "max_turns": 8}}, "run": {"updates": 100}},
        "workdir": ".",
    }
    over = {
        "models": {"b": {"preset": "y"}},
        "grid": [{"recipes": ["spo_adam"]}],
        "cell": {"env": {"options": {"max_turns": 6}}},
        "workdir": "studies/x",
    }
    assert cc.deep_merge(base, over) == {
        "models": {"a": {"preset": "x"}, "b": {"preset": "y"}},
        "grid": [{"recipes": ["spo_adam"]}],
        "cell": {"env": {"name": "m", "options": {"seed": 0, "max_turns": 6}}, "run": {"updates": 100}},
        "workdir": "studies/x",
    }
    assert base["cell"]["env"]["options"]["max_turns"] == 8  # a copy


def test_a_study_file_may_name_a_base_study(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "root.yaml").write_text("models: {a: {preset: qwen-tiny}}\ncell: {run: {updates: 10, eval_every: 5}}\n")
    (tmp_path / "configs" / "mid.yaml").write_text("base: root.yaml\ncell: {run: {updates: 3}}\nworkdir: mid\n")
    study = {"base": "configs/mid.yaml", "workdir": "top", "grid": [{"recipes": ["full"], "seeds": [0]}]}
    assert cc.resolve_base(study, tmp_path, tmp_path / "top.yaml") == {
        "models": {"a": {"preset": "qwen-tiny"}},
        "cell": {"run": {"updates": 3, "eval_every": 5}},
        "workdir": "top",
        "grid": [{"recipes": ["full"], "seeds": [0]}],
    }
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


@pytest.mark.parametrize(
    "study_file",
    ["configs/stability.yaml", "configs/stability-smoke.yaml", "configs/horizon.yaml", "configs/horizon-smoke.yaml"],
)
def test_the_new_studies_hold_only_their_differences_and_pass_every_check(study_file):
    raw = yaml.safe_load((REPO / study_file).read_text())
    assert raw["base"] in ("config.yaml", "configs/smoke.yaml") and "resources" not in raw
    # an analysis key only where it differs: the horizon study's collapse rule, calibrated for its batch size
    assert set(raw.get("analysis", {})) <= {"collapse"} and set(raw.get("analysis", {}).get("collapse", {})) <= {
        "drop_fraction"
    }
    study = read_study(study_file)
    cc.Study.load(study, REPO)
    assert study["workdir"] == "studies/" + Path(study_file).stem


@pytest.mark.parametrize("study_file", ["config.yaml", "configs/stability.yaml", "configs/edge.yaml"])
def test_a_study_loads_once_and_names_its_cells_as_the_workflow_does(study_file):
    """`Study.load` is what common.smk runs: the cells' keys name the folders Snakemake's Paramspace names (with an
    lr axis and with arms too), each cell's config names its key, and the warm starts are the grid's models'."""
    from snakemake.utils import Paramspace

    study = cc.Study.load(yaml.safe_load((REPO / study_file).read_text()), root=REPO, source=REPO / study_file)
    folders = list(Paramspace(study.grid, param_sep="=").instance_patterns)
    assert [key.folder for key in study.keys] == folders and len(set(folders)) == len(study.keys) > 0
    for key in study.keys:
        config = study.cell_config(key)
        assert (config["recipe"], config["optim"]["name"], config["run"]["seed"]) == (
            key.recipe,
            key.optimizer,
            key.seed,
        )
        assert config["model"]["path"] == study.model_path(key.model) == f"results/policies/{key.model}"
        assert key.lr is None or config["optim"]["lr"] == float(key.lr)
    assert study.warm_started == list(dict.fromkeys(key.model for key in study.keys))


def test_a_study_that_fails_a_check_names_the_cell():
    study = {
        "models": {"m": {"preset": "qwen-tiny"}},
        "grid": [{"recipes": ["gigpo"], "seeds": [3]}],
        "cell": {"rl": {"group_size": 2}, "rollout": {"batch_size": 3}},
    }
    with pytest.raises(cc.StudyError, match=r"cell \(as m / gigpo / adam / seed 3 trains it\): rollout.batch_size 3"):
        cc.Study.load(study, root=REPO)
    key = cc.CellKey("m", "full", "muon", 0, arm="a1", lr="3e-04")
    assert key.folder == "model=m/recipe=full/optimizer=muon/arm=a1/lr=3e-04/seed=0"
    assert key.describe() == "m / full / muon / arm a1 / lr 3e-04 / seed 0"
