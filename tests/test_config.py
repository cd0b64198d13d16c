"""Cell configs: recipes expand, explicit keys win, and every mistake is named before work starts."""

import pytest
import yaml

from trainer.config import RECIPES, ConfigError, config_from_dict, load_config


def test_defaults_are_the_full_recipe_on_muon():
    cfg = config_from_dict({})
    assert (cfg.optim.name, cfg.rl.estimator, cfg.rl.tis_cap, cfg.rl.agg) == ("muon", "spo++", 2.0, "token-mean")


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_recipe_expands_and_runs_with_any_optimizer(recipe):
    groups = {"rl": {"group_size": 2}} if RECIPES[recipe]["rl"]["estimator"] in ("grpo", "gigpo", "graphgpo") else {}
    for opt in ("adam", "muon", "adam_high_lr"):
        optim = {"name": opt, **({"muon_lr": 1e-3} if opt == "adam_high_lr" else {})}
        cfg = config_from_dict({"recipe": recipe, "optim": optim, **groups})
        assert cfg.optim.name == opt and cfg.recipe == recipe
        for k, v in RECIPES[recipe]["rl"].items():
            assert getattr(cfg.rl, k) == v


def test_recipe_table_matches_design():
    # the paper's Figure 2: no_length_seqmean_no_tis = Muon, SPO++, length off, tool on, seq-mean-token-mean, TIS off
    cfg = config_from_dict({"recipe": "no_length_seqmean_no_tis"})
    assert (
        cfg.optim.name,
        cfg.rl.estimator,
        cfg.rl.length_penalty,
        cfg.rl.tool_penalty,
        cfg.rl.agg,
        cfg.rl.tis_cap,
    ) == ("muon", "spo++", False, True, "seq-mean-token-mean", None)
    assert config_from_dict({"recipe": "spo_adam"}).optim.name == "adam"


@pytest.mark.parametrize(
    "data, named",
    [
        ({"rl": {"clip_hihg": 0.3}}, "rl.clip_hihg"),
        ({"recipe": "fulll"}, "fulll"),
        ({"run": {"seed": -1}}, "run.seed"),
        ({"run": {"epochs": 0}}, "run.epochs"),
        ({"run": {"minibatches": 17}, "rollout": {"batch_size": 16}}, "run.minibatches"),
        ({"optim": {"name": "adam_high_lr"}}, "optim.muon_lr"),
        ({"env": {"train_tasks": 0}}, "env.train_tasks"),
        ({"rl": {"offline_stats": "no/such/file.json"}}, "rl.offline_stats"),
        ({"optim": {"lr": "fast"}}, "optim.lr"),
        ({"rollout": {"mode": "eventually"}}, "rollout.mode"),
        ({"model": {"path": "/no/such/checkpoint"}}, "model.path"),
        ({"run": {"updates": True}}, "run.updates"),
        ({"rl": {"estimator": "grpo"}}, "group_size"),
        ({"optim": {"betas": [0.9]}}, "optim.betas"),
        ({"typo_section": {}}, "typo_section"),
        ({"run": {"updates": 10**12}}, "run.updates: 1,000,000,000,000 is above 1,000,000"),
        ({"rollout": {"batch_size": 10**9}}, "rollout.batch_size: 1,000,000,000 is above 65,536"),
        ({"rollout": {"max_turn_tokens": 2**21}}, "rollout.max_turn_tokens: 2,097,152 is above 1,048,576"),
        ({"env": {"eval_tasks": 10**7}}, "env.eval_tasks"),
        ({"run": {"epochs": 1000}}, "run.epochs"),
        ({"rl": {"gigpo_penalty": "verl-agent"}}, "rl.gigpo_penalty"),
        ({"rl": {"gigpo_mode": "std"}}, "rl.gigpo_mode"),
        ({"rl": {"rho_timing": "during"}}, "rl.rho_timing"),
    ],
)
def test_bad_values_are_named(data, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        config_from_dict(data)


def test_load_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "cell.yaml"
    path.write_text(yaml.safe_dump({"recipe": "no_tool", "run": {"updates": 7}}))
    cfg = load_config(path, overrides={"run": {"seed": 3}})
    assert (cfg.run.updates, cfg.run.seed, cfg.rl.tool_penalty) == (7, 3, False)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", r"empty\.yaml' is empty"),
        (b"# only a comment\n", r"empty\.yaml' is empty"),
        (b"run:\n  updates: caf\xe9\n", r"empty\.yaml' is not UTF-8 text"),
        (b"run:\n  updates: [1\n", r"(?s)empty\.yaml' is not valid YAML.*line 2, column 12"),
    ],
)
def test_unreadable_config_files_are_named(tmp_path, content, message):
    from trainer.config import load_sft_config

    path = tmp_path / "empty.yaml"
    path.write_bytes(content)
    for load in (load_config, load_sft_config):
        with pytest.raises(ConfigError, match=message):
            load(path)


def test_the_estimator_lists_are_the_config_type():
    import typing

    from trainer.config import ESTIMATORS, GROUP_ESTIMATORS, SPO_ESTIMATORS, RLConfig

    assert typing.get_args(typing.get_type_hints(RLConfig)["estimator"]) == ESTIMATORS
    assert not set(SPO_ESTIMATORS) & set(GROUP_ESTIMATORS)


def test_the_references_readings_are_cell_keys_with_the_references_defaults(tmp_path):
    """Each reading of a reference is one `rl` key a cell YAML may set; the defaults are the references' own:
    verl-agent's GiGPO (own-turn penalty, mean_norm) and SPO's verl recipe (rho measured after the update)."""
    import typing

    from trainer.config import RhoTiming, RLConfig
    from trainer.rl.estimators import advantage_config, make_estimator
    from trainer.rl.group_advantages import MODES, STEP_PENALTIES

    hints = typing.get_type_hints(RLConfig)
    assert typing.get_args(hints["gigpo_penalty"]) == STEP_PENALTIES
    assert typing.get_args(hints["gigpo_mode"]) == MODES
    assert hints["rho_timing"] is RhoTiming
    default = config_from_dict({"recipe": "gigpo", "rl": {"group_size": 2}})
    gigpo = advantage_config(default.rl).gigpo
    assert (gigpo.penalty, gigpo.mode) == ("own_turn", "mean_norm") and default.rl.rho_timing == "after_update"

    path = tmp_path / "cell.yaml"
    path.write_text(
        yaml.safe_dump(
            {"recipe": "gigpo", "rl": {"group_size": 2, "gigpo_penalty": "discounted", "gigpo_mode": "mean_std_norm"}}
        )
    )
    gigpo = advantage_config(load_config(path).rl).gigpo
    assert (gigpo.penalty, gigpo.mode) == ("discounted", "mean_std_norm")
    path.write_text(yaml.safe_dump({"recipe": "full", "rl": {"rho_timing": "before_update"}}))
    spo = make_estimator(load_config(path).rl)
    assert spo.rho_timing == "before_update" and spo.needs_old_logp
    assert not make_estimator(config_from_dict({"recipe": "full"}).rl).needs_old_logp
