"""The recall game (trainer/environments/recall.py): reward only for the right key, flags, splits, suite wiring."""

import pytest

from trainer.config import EnvConfig
from trainer.environments.protocol import Environment, TaskSource
from trainer.environments.recall import (
    DOOR,
    LOCKED,
    OPEN,
    RecallConfig,
    RecallEnv,
    RecallTask,
    RecallTasks,
    expert_action,
    sample_texts,
)
from trainer.environments.suite import family_config, make_suite


def play(env: RecallEnv, task: RecallTask, *actions: str):
    """Reset on `task`, then step through `actions`; returns the step results."""
    env.reset(task)
    return [env.step(action) for action in actions]


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_keys", 0),
        ("n_keys", 11),
        ("max_turns", 1),
        ("n_train_tasks", -1),
        ("n_heldout_tasks", -1),
        ("seed", "0"),
        ("n_keys", True),
        ("max_turns", 2.0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"RecallConfig.{field}"):
        RecallConfig(**{field: value})


def test_reward_is_one_only_for_exactly_the_key():
    env, task = RecallEnv(), RecallTask("t", "b")
    assert isinstance(env, Environment)
    assert env.reset(task) == "key b"
    first = env.step("anything")
    assert (first.observation, first.done, first.reward, first.info.invalid_action) == (DOOR, False, 0.0, False)
    win = env.step(" b\n")  # surrounding whitespace is not part of the answer (a token may carry a space)
    assert (win.observation, win.done, win.reward, win.info.invalid_action) == (OPEN, True, 1.0, False)
    assert win.info.extra["won"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("b")
    for wrong in ("a", "B", "bb", "key"):
        *_, last = play(env, task, "ok", wrong)
        assert (last.observation, last.done, last.reward, last.info.invalid_action) == (LOCKED, True, 0.0, False)


@pytest.mark.parametrize(
    "turn1, turn2, invalid",
    [
        ("", "b", (True, False)),
        ("a\nb", "b", (True, False)),
        ("ok", "", (False, True)),
        ("ok", "b b", (False, True)),
        ("ok", "b\nb", (False, True)),
    ],
)
def test_empty_or_malformed_actions_set_invalid_action(turn1, turn2, invalid):
    first, second = play(RecallEnv(), RecallTask("t", "b"), turn1, turn2)
    assert (first.info.invalid_action, second.info.invalid_action) == invalid
    assert not first.done and first.observation == DOOR  # turn 1 is never fatal
    assert second.done and second.reward == (0.0 if invalid[1] else 1.0)
    assert first.info.tool == ("" if invalid[0] else "say") and second.info.tool == ("" if invalid[1] else "answer")


def test_more_turns_allow_another_try_at_the_door():
    env, task = RecallEnv(RecallConfig(max_turns=3)), RecallTask("t", "a")
    _, wrong, right = play(env, task, "ok", "c", "a")
    assert not wrong.done and wrong.observation == f"{LOCKED}\n{DOOR}" and right.reward == 1.0
    *_, last = play(env, task, "ok", "c", "d")
    assert last.done and last.reward == 0.0 and last.info.extra["truncated"] and env.max_turns == 3


def test_splits_are_deterministic_disjoint_and_balanced():
    config = RecallConfig(n_keys=3, n_train_tasks=12, n_heldout_tasks=7, seed=5)
    tasks = RecallTasks(config)
    assert isinstance(tasks, TaskSource)
    train, heldout = tasks.tasks("train"), tasks.tasks("heldout")
    assert train == RecallTasks(config).tasks("train") and heldout == RecallTasks(config).tasks("heldout")
    assert len(train) == 12 and len(heldout) == 7 and tasks.tasks("train", 4) == train[:4]
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert len({t.task_id for t in train}) == 12
    assert sorted(t.key for t in train) == sorted("abc" * 4)  # every key equally often
    assert [t.key for t in RecallTasks(RecallConfig(n_keys=3, n_train_tasks=12, seed=6)).tasks("train")] != [
        t.key for t in train
    ]
    with pytest.raises(ValueError, match="split"):
        tasks.tasks("test")
    with pytest.raises(ValueError, match="n must be"):
        tasks.tasks("heldout", 8)


def test_expert_always_wins_and_texts_are_deterministic():
    import random

    config = RecallConfig(n_keys=4)
    env, rng = RecallEnv(config), random.Random(0)
    for task in RecallTasks(config).tasks("train"):
        env.reset(task)
        while not env.done:
            result = env.step(expert_action(env, rng))
        assert result.reward == 1.0
    texts = sample_texts(config, n=20)
    assert texts == sample_texts(config, n=20) and len(texts) == 20
    assert any(text.endswith(LOCKED) for text in texts) and any(text.endswith(OPEN) for text in texts)


def test_suite_wires_the_family_and_its_tokenizer_has_one_token_per_key():
    from trainer.policy.chat_format import TinyFormat, build_tokenizer

    suite = make_suite(EnvConfig(name="recall", options={"n_keys": 4, "max_turns": 3}))
    assert suite.make_env().max_turns == 3 and len(suite.tasks.tasks("train")) == RecallConfig().n_train_tasks
    demo = suite.demonstrate(suite.tasks.tasks("train")[0], 0.0, __import__("random").Random(0))
    assert demo.reward == 1.0 and len(demo.steps) == 2
    fmt = TinyFormat(build_tokenizer(suite.sample_texts(), vocab_size=384))
    for key in "abcd":
        assert len(fmt.encode_text(f" {key}")) == 1 and fmt.decode_action(fmt.encode_text(f" {key}")).strip() == key
    with pytest.raises(ValueError, match=r"unknown config key 'env.options.n_key' .*\(recall\)"):
        family_config("recall", {"n_key": 2})
