"""Cell configs: recipes expand, explicit keys win, and every mistake is named before work starts."""

import pytest
import yaml

from trainer.config import ConfigError, config_from_dict, load_config
from trainer.recipes import RECIPES


def test_defaults_are_the_full_recipe_on_muon():
    cfg = config_from_dict({})
    assert (cfg.optim.name, cfg.rl.estimator, cfg.loss.tis_cap, cfg.loss.agg) == ("muon", "spo++", 2.0, "token-mean")


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_recipe_expands_and_runs_with_any_optimizer(recipe):
    groups = {"rl": {"group_size": 2}} if RECIPES[recipe]["rl"]["estimator"] in ("grpo", "gigpo", "graphgpo") else {}
    for opt in ("adam", "muon", "adam_high_lr"):
        optim = {"name": opt}
        cfg = config_from_dict({"recipe": recipe, "optim": optim, **groups})
        assert cfg.optim.name == opt and cfg.recipe == recipe
        for section, keys in RECIPES[recipe].items():
            for k, v in keys.items() if section != "optim" else ():  # the optimizer is the cell's
                assert getattr(getattr(cfg, section), k) == v


def test_recipe_table_matches_design():
    # the paper's Figure 2: no_length_seqmean_no_tis = Muon, SPO++, length off, tool on, seq-mean-token-mean, TIS off
    cfg = config_from_dict({"recipe": "no_length_seqmean_no_tis"})
    assert (
        cfg.optim.name,
        cfg.rl.estimator,
        cfg.shaping.length_penalty,
        cfg.shaping.tool_penalty,
        cfg.loss.agg,
        cfg.loss.tis_cap,
    ) == ("muon", "spo++", False, True, "seq-mean-token-mean", None)
    assert config_from_dict({"recipe": "spo_adam"}).optim.name == "adam"


@pytest.mark.parametrize(
    "data, named",
    [
        ({"loss": {"clip_hihg": 0.3}}, "loss.clip_hihg"),
        ({"rl": {"clip_high": 0.3}}, "rl.clip_high"),
        ({"loss": {"clip_low": 1.0}}, "loss.clip_low: must be < 1"),
        ({"loss": {"dual_clip": 1.0}}, "loss.dual_clip: must be > 1"),
        ({"loss": {"tis_cap": float("inf")}}, "loss.tis_cap: expected a finite number"),
        ({"shaping": {"length_threshold": -1}}, "shaping.length_threshold: must be >= 0"),
        ({"recipe": "fulll"}, "fulll"),
        ({"run": {"seed": -1}}, "run.seed"),
        ({"run": {"epochs": 0}}, "run.epochs"),
        ({"run": {"minibatches": 17}, "rollout": {"batch_size": 16}}, "run.minibatches"),
        ({"optim": {"muon_lr": 1e-3}}, "optim.muon_lr"),
        ({"env": {"train_tasks": 0}}, "env.train_tasks"),
        ({"rl": {"spo": {"offline_stats": "no/such/file.json"}}}, "rl.spo.offline_stats"),
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
        ({"rl": {"gigpo": {"penalty": "verl-agent"}}}, "rl.gigpo.penalty"),
        ({"rl": {"gigpo": {"mode": "std"}}}, "rl.gigpo.mode"),
        ({"rl": {"spo": {"rho_timing": "during"}}}, "rl.spo.rho_timing"),
        ({"rl": {"spo": {"rho_min": 0.97}}}, "rl.spo.rho_min: 0.97 is above rho_max 0.96"),
        ({"rl": {"spo": {"rho_max": 1.5}}}, "rl.spo.rho_max: must be <= 1"),
        ({"rl": {"graphgpo": {"decay": 0.0}}, "recipe": "graphgpo"}, "rl.graphgpo.decay: must be > 0"),
    ],
)
def test_bad_values_are_named(data, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        config_from_dict(data)


def test_load_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "cell.yaml"
    path.write_text(yaml.safe_dump({"recipe": "no_tool", "run": {"updates": 7}}))
    cfg = load_config(path, overrides={"run": {"seed": 3}})
    assert (cfg.run.updates, cfg.run.seed, cfg.shaping.tool_penalty) == (7, 3, False)
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
    from trainer.config import load_warm_start_config

    path = tmp_path / "empty.yaml"
    path.write_bytes(content)
    for load in (load_config, load_warm_start_config):
        with pytest.raises(ConfigError, match=message):
            load(path)


def test_the_estimator_lists_are_the_config_type():
    import typing

    from trainer.rl.config import ESTIMATOR_SECTIONS, ESTIMATORS, GROUP_ESTIMATORS, SPO_ESTIMATORS, RLConfig

    assert typing.get_args(typing.get_type_hints(RLConfig)["estimator"]) == ESTIMATORS == tuple(ESTIMATOR_SECTIONS)
    assert set(SPO_ESTIMATORS) | set(GROUP_ESTIMATORS) == set(ESTIMATORS)
    assert not set(SPO_ESTIMATORS) & set(GROUP_ESTIMATORS)


@pytest.mark.parametrize(
    "recipe, foreign",
    [("gigpo", "spo"), ("grpo", "gigpo"), ("spo_muon", "spo_plus_plus"), ("full", "graphgpo"), ("graphgpo", "grpo")],
)
def test_a_cell_carries_only_its_estimators_sections(recipe, foreign):
    """The estimator is a discriminated choice: a section of another estimator is refused, naming it and what
    the cell's estimator reads; the cell's own sections, left out, take their defaults, the others stay None."""
    group = {"group_size": 2} if recipe in ("gigpo", "grpo", "graphgpo") else {}
    with pytest.raises(ConfigError, match=rf"rl\.{foreign}: settings of another estimator"):
        config_from_dict({"recipe": recipe, "rl": {**group, foreign: {}}})
    rl = config_from_dict({"recipe": recipe, "rl": group}).rl
    own = {"gigpo": {"gigpo"}, "grpo": {"grpo"}, "graphgpo": {"graphgpo"}, "spo_muon": {"spo"}}.get(
        recipe, {"spo", "spo_plus_plus"}
    )
    for section in ("spo", "spo_plus_plus", "grpo", "gigpo", "graphgpo"):
        assert (getattr(rl, section) is not None) == (section in own), section


def test_the_references_readings_are_cell_keys_with_the_references_defaults(tmp_path):
    """Each reading of a reference is one key of its estimator's section a cell YAML may set; the defaults are the
    references' own: verl-agent's GiGPO (own-turn penalty, mean_norm) and SPO's verl recipe (rho measured after the
    update)."""
    from trainer.rl.estimators import make_estimator

    default = config_from_dict({"recipe": "gigpo", "rl": {"group_size": 2}})
    assert (default.rl.gigpo.penalty, default.rl.gigpo.mode) == ("own_turn", "mean_norm")
    assert config_from_dict({}).rl.spo.rho_timing == "after_update"

    path = tmp_path / "cell.yaml"
    path.write_text(
        yaml.safe_dump(
            {"recipe": "gigpo", "rl": {"group_size": 2, "gigpo": {"penalty": "discounted", "mode": "mean_std_norm"}}}
        )
    )
    cfg = load_config(path)
    assert (make_estimator(cfg.rl, cfg.shaping).cfg.gigpo.penalty, cfg.rl.gigpo.mode) == ("discounted", "mean_std_norm")
    path.write_text(yaml.safe_dump({"recipe": "full", "rl": {"spo": {"rho_timing": "before_update"}}}))
    cfg = load_config(path)
    spo = make_estimator(cfg.rl, cfg.shaping)
    assert spo.rho_timing == "before_update" and spo.needs_old_logp
    full = config_from_dict({"recipe": "full"})
    assert not make_estimator(full.rl, full.shaping).needs_old_logp


def test_a_number_yaml_reads_as_a_string_is_refused_with_its_fix():
    """PyYAML (YAML 1.1) reads `3e-4` as the string '3e-4': the message names the trap and the spelling that works."""
    import yaml

    from trainer.config import ConfigError, config_from_dict

    data = yaml.safe_load("optim: {lr: 3e-4}\nrollout: {temperature: 1E0}")
    assert data["optim"]["lr"] == "3e-4"
    with pytest.raises(ConfigError, match=r"optim\.lr: .*the string '3e-4': YAML 1\.1 .*; write 3\.0e-4$"):
        config_from_dict(data)
    assert yaml.safe_load("lr: 3.0e-4")["lr"] == 3.0e-4  # the fix it names is read as a number
    with pytest.raises(ConfigError, match=r"rollout\.temperature: .*write 1\.0e0$"):
        config_from_dict({"rollout": {"temperature": "1E0"}})
    with pytest.raises(ConfigError, match=r"optim\.lr: expected a finite number, got 'fast'$"):
        config_from_dict({"optim": {"lr": "fast"}})


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_resolved_config_written_as_yaml_reads_back_as_itself(recipe):
    """What a cell writes as config.resolved.yaml (config_to_dict, as YAML) is a valid config and the same one,
    for every recipe (the estimator sections of the others, with their defaults, are accepted)."""
    from trainer.config import config_to_dict

    sparse = {"recipe": recipe, **({"rl": {"group_size": 4}} if recipe in ("grpo", "gigpo", "graphgpo") else {})}
    cfg = config_from_dict(sparse)
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
    assert config_to_dict(config_from_dict(yaml.safe_load(text))) == config_to_dict(cfg)
