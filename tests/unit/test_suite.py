"""make_suite: every environment family the trainer can train on, and its option errors named with their path."""

import importlib.util

import pytest

from trainer.config import EnvConfig
from trainer.environments.suite import make_suite
from trainer.environments.swe.env import SWEEnv
from trainer.environments.swe.tasks import shipped_tasks_path


def test_swe_suite_builds_nested_sections_and_reads_the_task_file():
    suite = make_suite(
        EnvConfig(
            name="swe",
            options={
                "backend": "local",
                "max_turns": 3,
                "tasks_file": str(shipped_tasks_path()),
                "tools": {"command_timeout_s": 5.0},
                "docker": {"memory": "1g"},
            },
        )
    )
    env = suite.make_env()
    assert isinstance(env, SWEEnv) and env.max_turns == 3
    assert env.config.tools.command_timeout_s == 5.0 and env.config.docker.memory == "1g"
    assert len(suite.tasks.tasks("train")) + len(suite.tasks.tasks("heldout")) == 6  # the shipped tasks
    assert all(isinstance(text, str) and text for text in suite.sample_texts())


@pytest.mark.parametrize(
    "options, named",
    [
        ({"backend": "local", "max_trun": 3}, r"unknown config key 'env.options.max_trun' .*\(swe\)"),
        ({"tools": {"command_timeout": 5}}, r"unknown config key 'env.options.tools.command_timeout' .*\(swe\)"),
        (
            {"docker": {"memory": 2}},
            r"env.options.docker.memory: 2 is an int, not a string: YAML read it as one; quote the value as written \(swe\)",
        ),
        ({"tools": {"blocked_commands": "pip"}}, r"env.options.tools.blocked_commands: expected a list, got 'pip'"),
    ],
)
def test_swe_option_typos_are_named_with_their_path(options, named):
    with pytest.raises(ValueError, match=named):
        make_suite(EnvConfig(name="swe", options=options))


def test_alfworld_without_its_package_says_how_to_get_it(monkeypatch):
    from trainer.environments import alfworld_adapter
    from trainer.environments.alfworld_adapter import AlfworldUnavailable

    real_find_spec = importlib.util.find_spec  # hide the package, installed or not
    monkeypatch.setattr(
        alfworld_adapter.importlib.util, "find_spec", lambda name: None if name == "alfworld" else real_find_spec(name)
    )
    with pytest.raises(AlfworldUnavailable, match="pip install alfworld"):
        make_suite(EnvConfig(name="alfworld", options={"data_dir": "/nonexistent"}))


def test_unknown_family_is_named():
    from trainer.environments.suite import family_config

    with pytest.raises(ValueError, match="EnvConfig.name: 'webshop' is not one of"):
        EnvConfig(name="webshop")  # the cell's config refuses it when built
    with pytest.raises(ValueError, match="env.name 'webshop'"):
        family_config("webshop", {})  # and so does the suite, for a study's raw block
