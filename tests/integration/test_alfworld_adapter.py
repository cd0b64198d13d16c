"""Tests of the ALFWorld adapter.

Three tiers, by what they need:
- Nothing: config validation, where the data is looked for, the error that names what is missing, verl-agent's
  action projection, and the adapter's bookkeeping (observation layout, invalid flags, reward, step limit)
  against a scripted game that answers like textworld's gym env.
- The `alfworld` package (`pip install -e '.[alfworld]'`), not its downloaded games: the package's own engine
  plays the hand-written games of tests/data/alfworld/ (a PDDL problem and a traj_data.json each; domain and
  grammar are the ones the package ships, as in the downloaded games). The references are the package itself:
  its grammar, its listing filters, its data folder, and its own batched env (built as verl-agent builds it)
  played by its handcoded expert, which the adapter must read the same. They skip, with the adapter's message,
  when the package is missing.
- The downloaded games (`alfworld-download`): skip, with the adapter's message, when they are not on disk.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments import alfworld_adapter as aw
from trainer.environments.alfworld_adapter import (
    AlfworldConfig,
    AlfworldEnv,
    AlfworldTask,
    AlfworldTasks,
    AlfworldUnavailable,
    alfworld_data_dir,
    clean_observation,
    project_action,
    require_alfworld,
)
from trainer.environments.protocol import Environment

# ----------------------------------------------------------------------------------------- config and data checks


@pytest.mark.parametrize(
    "field, value",
    [
        ("heldout_split", "valid"),
        ("task_types", ()),
        ("task_types", (1, 7)),
        ("max_steps", 0),
        ("max_steps", 2.0),
        ("action_format", "json"),
        ("data_dir", 3),
        ("isolate", 1),
        ("require_think", "yes"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        AlfworldConfig(**{field: value})


def test_config_defaults_follow_verl_agent():
    config = AlfworldConfig(task_types=[1, 3])
    assert config.task_types == (1, 3) and AlfworldConfig().max_steps == 50
    assert AlfworldConfig().heldout_split == "valid_seen" and AlfworldConfig().action_format == "plain"


def test_data_dir_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert alfworld_data_dir() == tmp_path / "home" / ".cache" / "alfworld"
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "env"))
    assert alfworld_data_dir() == tmp_path / "env"
    assert alfworld_data_dir(tmp_path / "explicit") == tmp_path / "explicit"


def test_missing_data_error_names_folder_and_remedy(tmp_path):
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)  # an empty folder is not data
    with pytest.raises(AlfworldUnavailable) as caught:
        require_alfworld(tmp_path, splits=("train", "valid_seen"))
    message = str(caught.value)
    assert "split 'train'" in message and "split 'valid_seen'" in message
    assert str(tmp_path / "json_2.1.1" / "valid_seen") in message
    assert "alfworld-download" in message and "pip install alfworld" in message and "ALFWORLD_DATA" in message
    package_missing = importlib.util.find_spec("alfworld") is None
    assert ("the Python package `alfworld`" in message) == package_missing


def test_present_data_and_package_pass_the_check(tmp_path, monkeypatch):
    game = tmp_path / "json_2.1.1" / "train" / "pick_and_place_simple-Mug-None-Desk-1" / "trial_1"
    game.mkdir(parents=True)
    (game / "game.tw-pddl").write_text("{}")
    monkeypatch.setattr(aw.importlib.util, "find_spec", lambda name: object())  # pretend both packages import
    assert require_alfworld(tmp_path, splits=("train",)) == tmp_path
    monkeypatch.setattr(aw.importlib.util, "find_spec", lambda name: None if name == "textworld" else object())
    with pytest.raises(AlfworldUnavailable, match="package `textworld`") as caught:
        require_alfworld(tmp_path, splits=("train",))
    assert "games" not in str(caught.value).split("To fix")[0]  # only the package is reported missing


def test_task_source_fails_fast_without_data(tmp_path):
    with pytest.raises(AlfworldUnavailable, match="alfworld-download"):
        AlfworldTasks(AlfworldConfig(data_dir=str(tmp_path)))


# ----------------------------------------------------------------------------------------- projection


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<think>the mug is on the desk</think><action>Go To Desk 1</action>", ("go to desk 1", True)),
        ("<think>a</think>\n<action>  take mug 1 from desk 1 \n</action> trailing", ("take mug 1 from desk 1", True)),
        ("<think>x</think><action>look</action><action>inventory</action>", ("look", True)),  # the first block
        ("<action>look</action>", ("look", False)),  # no think block
        # 48 characters, lower-cased; the last 30 drop "<think>x</think>i " (18).
        ("<think>x</think>I will open the fridge 1 now, ok", ("will open the fridge 1 now, ok", False)),
        # Tags out of order; 37 characters, the last 30 drop "<think>" (7).
        ("<think>x</think></action>look<action>", ("x</think></action>look<action>", False)),
        ("<think>冰箱</think><action>open fridge 1</action>", ("open fridge 1", False)),  # CJK
    ],
)
def test_project_action_examples(reply, expected):
    assert project_action(reply) == expected


def test_project_action_without_think_requirement():
    assert project_action("<action>look</action>", require_think=False) == ("look", True)
    # Last 30 characters: "please go to the countertop 1" has 29, so one more character of the prefix shows.
    assert project_action("now please go to the countertop 1", require_think=False) == (
        " please go to the countertop 1",
        False,
    )
    with pytest.raises(TypeError, match="str"):
        project_action(None)


SAFE_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="<>"), max_size=40)


@settings(max_examples=200, deadline=None)
@given(thought=SAFE_TEXT, command=SAFE_TEXT, tail=SAFE_TEXT)
def test_project_action_extracts_any_tagged_command(thought, command, tail):
    reply = f"<think>{thought}</think><action>{command}</action>{tail}"
    assert project_action(reply) == (command.lower().strip(), True)
    bare, valid = project_action(f"{thought}{command}{tail}")  # no tags at all
    assert not valid and bare == f"{thought}{command}{tail}".lower()[-30:]


def test_clean_observation_drops_banner_and_blank_lines():
    raw = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
        "you see a desk 1.\n\nYour task is to: put some mug on desk."
    )
    assert clean_observation(raw) == (
        "You are in the middle of a room. Looking quickly around you, you see a desk 1."
        "\nYour task is to: put some mug on desk."
    )


# ----------------------------------------------------------------------------------------- adapter bookkeeping


class ScriptedGame:
    """Answers like textworld.gym's unbatched env for a two-step ALFWorld game (take the mug, move it)."""

    def __init__(self, max_steps: int):
        self.max_steps, self.sent, self.closed = max_steps, [], False

    def _infos(self, won=False):
        holding = "take mug 1 from desk 1" in self.sent
        commands = ["help", "look", "inventory", "go to shelf 1", "go to desk 1"]
        commands += ["move mug 1 to shelf 1"] if holding else ["take mug 1 from desk 1"]
        return {"admissible_commands": commands, "won": won, "extra.gamefile": "g"}

    def reset(self):
        self.sent = []
        return (
            "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around "
            "you, you see a desk 1, and a shelf 1.\n\nYour task is to: put some mug on shelf."
        ), self._infos()

    def step(self, command):
        admissible = self._infos()["admissible_commands"]
        self.sent.append(command)
        won = command == "move mug 1 to shelf 1" and command in admissible
        text = (
            "You move the mug 1 to the shelf 1."
            if won
            else (f"You did: {command}." if command in admissible else "Nothing happens.")
        )
        return text, float(won), won or len(self.sent) >= self.max_steps, self._infos(won)

    def close(self):
        self.closed = True


class ScriptedAlfworldEnv(AlfworldEnv):
    """The real adapter with textworld's game swapped for ScriptedGame (the only method replaced)."""

    def _start(self, gamefile):
        self.game = ScriptedGame(self.config.max_steps)
        return self.game


TASK = AlfworldTask(
    task_id="alfworld-train/pick_and_place_simple-Mug-None-Shelf-1/trial_1",
    gamefile="g",
    task_type="pick_and_place_simple",
    split="train",
)


def test_reset_shows_goal_and_sorted_commands_without_help():
    env = ScriptedAlfworldEnv()
    assert isinstance(env, Environment) and env.max_turns == 50
    assert env.reset(TASK) == (
        "You are in the middle of a room. Looking quickly around you, you see a desk 1, and a shelf 1.\n"
        "Your task is to: put some mug on shelf.\n"
        "Admissible actions: go to desk 1 | go to shelf 1 | inventory | look | take mug 1 from desk 1"
    )


def test_plain_replies_valid_invalid_and_success():
    env = ScriptedAlfworldEnv()
    env.reset(TASK)
    r = env.step("Take Mug 1 from desk 1.")  # normalised like textgame's commands
    assert env.game.sent == ["take mug 1 from desk 1"]
    assert (r.info.invalid_action, r.info.tool, r.done, r.reward) == (False, "take", False, 0.0)
    assert r.observation.endswith("inventory | look | move mug 1 to shelf 1")
    r = env.step("fly to the moon")
    assert r.info.invalid_action and r.observation.startswith("Nothing happens.\n") and not r.done
    r = env.step("move mug 1 to shelf 1")
    assert (
        r.done
        and r.reward == 1.0
        and r.info.extra == {"won": True, "truncated": False, "steps": 3, "command": "move mug 1 to shelf 1"}
    )
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")


def test_tagged_replies_go_through_the_projection():
    env = ScriptedAlfworldEnv(AlfworldConfig(action_format="tagged"))
    env.reset(TASK)
    r = env.step("<think>the mug is on the desk</think><action>take mug 1 from desk 1</action>")
    assert env.game.sent[-1] == "take mug 1 from desk 1" and not r.info.invalid_action
    r = env.step("<action>look</action>")  # the game accepts "look", but the reply broke the format
    assert env.game.sent[-1] == "look" and r.info.invalid_action and r.info.tool == ""
    r = env.step("no tags at all, so the last thirty characters go")  # 48 characters; the last 30 are sent
    assert env.game.sent[-1] == " the last thirty characters go" and r.info.invalid_action


def test_step_limit_ends_unrewarded():
    env = ScriptedAlfworldEnv(AlfworldConfig(max_steps=4))
    env.reset(TASK)
    results = [env.step("look") for _ in range(4)]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].reward == 0.0 and results[-1].info.extra["truncated"]


def test_lifecycle_errors_and_close():
    env = ScriptedAlfworldEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("look")
    with pytest.raises(TypeError, match="AlfworldTask"):
        env.reset("g")
    env.reset(TASK)
    first = env.game
    with pytest.raises(TypeError, match="str"):
        env.step(3)
    env.reset(TASK)  # a new episode closes the old game
    assert first.closed and not env.game.closed
    env.close()
    assert env.game.closed


def test_real_start_reports_what_is_missing(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        aw.importlib.util, "find_spec", lambda name: None if name == "alfworld" else real_find_spec(name)
    )
    env = AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path)))  # as if alfworld were not installed, installed or not
    with pytest.raises(AlfworldUnavailable, match="pip install alfworld") as caught:
        env.reset(TASK)
    assert "package `alfworld`" in str(caught.value) and env._game is None


# ----------------------------------------------------------------------------------------- the package's engine


def _package_reason() -> str | None:
    try:
        require_alfworld(splits=())
    except AlfworldUnavailable as missing:
        return str(missing)
    return None


needs_package = pytest.mark.skipif(
    _package_reason() is not None and os.environ.get("CI", "").lower() != "true", reason=_package_reason() or ""
)
"""The package is in the `test` extra, so under CI=true these tests always run (and a missing package fails them)."""

FIXTURES = Path(__file__).parents[1] / "data" / "alfworld"
MUG = "pick_and_place_simple-Mug-None-Shelf-1"
COOL = "pick_cool_then_place_in_recep-Apple-None-CounterTop-1"
LAMP = "look_at_obj_in_light-Book-None-DeskLamp-1"
FIRST_OBSERVATIONS = {
    MUG: "You are in the middle of a room. Looking quickly around you, you see a desk 1, and a shelf 1.\n"
    "Your task is to: put a mug in shelf.\n"
    "Admissible actions: go to desk 1 | go to shelf 1 | inventory | look",
    COOL: "You are in the middle of a room. Looking quickly around you, you see a countertop 1, and a fridge 1.\n"
    "Your task is to: put a cool apple in countertop.\n"
    "Admissible actions: go to countertop 1 | go to fridge 1 | inventory | look",
    LAMP: "You are in the middle of a room. Looking quickly around you, you see a bed 1, and a desk 1.\n"
    "Your task is to: look at book under the desklamp.\n"
    "Admissible actions: go to bed 1 | go to desk 1 | inventory | look",
}
"""What the adapter shows at reset of each fixture game: the grammar's room sentence for its receptacles, its
goal sentence, and the commands the domain allows at the start (go to each receptacle, inventory, look)."""


def write_game(
    root: Path,
    split: str,
    name: str,
    trial: str = "trial_1",
    fixture: str | None = None,
    solvable: bool | None = True,
    with_game: bool = True,
) -> Path:
    """Lay out one game as the download does, json_2.1.1/<split>/<name>/<trial>/ with traj_data.json and
    game.tw-pddl (the shipped domain and grammar, the fixture's problem, and the `solvable` flag alfworld's
    listing reads; None leaves it out); returns the trial folder. `fixture` (default `name`) names the folder in
    tests/data/alfworld/. The goal sentence is the fixture's one annotation, filled in by alfworld's own helper
    (its templated sentences are drawn with the global `random`, which would make the text vary from run to run)."""
    import alfworld.info
    from alfworld.agents.utils.misc import add_task_to_grammar

    source = FIXTURES / (fixture or name)
    traj = json.loads((source / "traj_data.json").read_text())
    folder = root / "json_2.1.1" / split / name / trial
    folder.mkdir(parents=True)
    (folder / "traj_data.json").write_text(json.dumps(traj))
    if with_game:
        grammar = add_task_to_grammar(
            Path(alfworld.info.ALFRED_TWL2_PATH).read_text(), traj, goal_desc_human_anns_prob=1.0, rng=random.Random(0)
        )
        game = {
            "pddl_domain": Path(alfworld.info.ALFRED_PDDL_PATH).read_text(),
            "pddl_problem": (source / "problem.pddl").read_text(),
            "grammar": grammar,
        }
        if solvable is not None:
            game["solvable"] = solvable
        (folder / "game.tw-pddl").write_text(json.dumps(game))
    return folder


def one_game_folder(root: Path, name: str) -> AlfworldConfig:
    """A data folder whose train and valid_seen splits hold just the fixture `name`; its config."""
    write_game(root, "train", name)
    write_game(root, "valid_seen", name)
    return AlfworldConfig(data_dir=str(root))


def play_reference(root: Path) -> list[tuple[str | None, str, list[str], bool]]:
    """The one train game under `root`, played by alfworld's own env built as verl-agent builds it
    (`AlfredTWEnv(config, "train").init_env(batch_size=1)`, alfworld's base_config values) and driven by the
    package's handcoded expert (`extra.expert_plan`). Per step: (command, raw text, admissible commands, won);
    the reset comes first, with command None."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    config = {
        "dataset": {"data_path": str(root / "json_2.1.1" / "train"), "num_train_games": -1},
        "env": {
            "goal_desc_human_anns_prob": 0.0,
            "task_types": [1, 2, 3, 4, 5, 6],
            "domain_randomization": False,
            "expert_type": "handcoded",
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": 50}},
    }
    env = AlfredTWEnv(config, train_eval="train").init_env(batch_size=1)
    try:
        obs, infos = env.reset()
        trace = [(None, obs[0], infos["admissible_commands"][0], infos["won"][0])]
        while not trace[-1][3] and len(trace) <= 20:
            command = infos["extra.expert_plan"][0][0]
            obs, _scores, _dones, infos = env.step([command])
            trace.append((command, obs[0], infos["admissible_commands"][0], infos["won"][0]))
    finally:
        env.close()
    return trace


def adapter_view(text: str, admissible: list[str]) -> str:
    """What the adapter promises to show for the engine's raw text and commands: the banner and blank lines
    dropped, the command list without "help", sorted (plain order: every fixture id is 1), on its own line."""
    lines = [line.strip() for line in text.split("\n") if line.strip() and "Welcome to TextWorld" not in line]
    return "\n".join(lines) + "\nAdmissible actions: " + " | ".join(sorted(c for c in admissible if c != "help"))


@needs_package
def test_verbs_and_task_types_are_the_packages():
    import alfworld.info
    from alfworld.agents.environment.alfred_tw_env import TASK_TYPES

    templates = re.findall(r'template :: "([^"]+)"', Path(alfworld.info.ALFRED_TWL2_PATH).read_text())
    assert len(templates) >= 15 and {t.split()[0] for t in templates} == aw.ALFWORLD_VERBS
    assert aw.ALFWORLD_TASK_TYPES == TASK_TYPES


@needs_package
def test_data_folder_is_the_one_the_package_uses(tmp_path, monkeypatch):
    """alfworld_data_dir() names the folder alfworld itself (and so `alfworld-download`) reads and writes."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in (None, str(tmp_path / "games")):
        if value is None:
            monkeypatch.delenv("ALFWORLD_DATA", raising=False)
        else:
            monkeypatch.setenv("ALFWORLD_DATA", value)
        printed = subprocess.run(
            [sys.executable, "-c", "import alfworld.info; print(alfworld.info.ALFWORLD_DATA)"],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        assert Path(printed.stdout.strip()) == alfworld_data_dir()


@needs_package
def test_listing_keeps_what_the_package_keeps_in_natural_order(tmp_path):
    kept = [
        write_game(tmp_path, "train", LAMP),
        write_game(tmp_path, "train", MUG, "trial_2"),
        write_game(tmp_path, "train", MUG, "trial_10"),
    ]
    # What alfworld's listing drops: sliced-object and movable-receptacle games, games known to be unsolvable or
    # never checked, and trials without a game file.
    write_game(tmp_path, "train", "pick_cool_then_place_in_recep-AppleSliced-None-CounterTop-1", fixture=COOL)
    write_game(tmp_path, "train", "pick_and_place_with_movable_recep-Mug-Bowl-Shelf-1", fixture=MUG)
    write_game(tmp_path, "train", "pick_and_place_simple-Mug-None-Desk-1", fixture=MUG, solvable=False)
    write_game(tmp_path, "train", "pick_and_place_simple-Mug-None-Desk-2", fixture=MUG, solvable=None)
    write_game(tmp_path, "train", "pick_and_place_simple-Mug-None-Desk-3", fixture=MUG, with_game=False)
    seen = write_game(tmp_path, "valid_seen", COOL)
    unseen = write_game(tmp_path, "valid_unseen", MUG, "trial_T20190907_000000_000000")

    source = AlfworldTasks(AlfworldConfig(data_dir=str(tmp_path)))
    train = source.tasks("train")
    assert train == [
        AlfworldTask(f"alfworld-train/{LAMP}/trial_1", str(kept[0] / "game.tw-pddl"), "look_at_obj_in_light", "train"),
        AlfworldTask(f"alfworld-train/{MUG}/trial_2", str(kept[1] / "game.tw-pddl"), "pick_and_place_simple", "train"),
        AlfworldTask(f"alfworld-train/{MUG}/trial_10", str(kept[2] / "game.tw-pddl"), "pick_and_place_simple", "train"),
    ]
    assert source.tasks("train", 2) == train[:2] and source.tasks("train", 0) == []
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        source.tasks("train", 4)
    assert source.tasks("heldout") == [
        AlfworldTask(
            f"alfworld-valid_seen/{COOL}/trial_1",
            str(seen / "game.tw-pddl"),
            "pick_cool_then_place_in_recep",
            "valid_seen",
        )
    ]
    # Task types 1 only, held out on valid_unseen.
    simple = AlfworldTasks(AlfworldConfig(data_dir=str(tmp_path), task_types=(1,), heldout_split="valid_unseen"))
    assert simple.tasks("train") == train[1:]
    assert simple.tasks("heldout") == [
        AlfworldTask(
            f"alfworld-valid_unseen/{MUG}/{unseen.name}",
            str(unseen / "game.tw-pddl"),
            "pick_and_place_simple",
            "valid_unseen",
        )
    ]


@pytest.mark.slow  # starts game processes of the real engine
@needs_package
@pytest.mark.parametrize("name, action_format", [(MUG, "tagged"), (COOL, "plain"), (LAMP, "plain")])
def test_expert_play_reads_the_same_through_the_adapter(tmp_path, name, action_format):
    config = one_game_folder(tmp_path, name)
    trace = play_reference(tmp_path)
    assert trace[-1][3] and not any(won for *_, won in trace[:-1])  # the package's expert wins, at the end only
    (task,) = AlfworldTasks(config).tasks("train")
    env = AlfworldEnv(AlfworldConfig(data_dir=str(tmp_path), action_format=action_format))
    try:
        first = env.reset(task)
        assert first == FIRST_OBSERVATIONS[name] == adapter_view(*trace[0][1:3])
        for step, (command, text, admissible, won) in enumerate(trace[1:], 1):
            reply = f"<think>step {step}</think><action>{command}</action>" if action_format == "tagged" else command
            result = env.step(reply)
            assert result.observation == adapter_view(text, admissible), command
            assert (result.reward, result.done, result.info.invalid_action, result.info.tool) == (
                float(won),
                won,
                False,
                command.split()[0],
            ), command
            assert result.info.extra == {"won": won, "truncated": False, "steps": step, "command": command}
    finally:
        env.close()


@pytest.mark.slow  # starts game processes of the real engine
@needs_package
def test_hand_written_game_on_the_real_engine(tmp_path):
    config = one_game_folder(tmp_path, MUG)
    source = AlfworldTasks(config)
    (task,) = source.tasks("train")
    a, b = AlfworldEnv(config), AlfworldEnv(config)
    first = a.reset(task)
    assert first == b.reset(task) == FIRST_OBSERVATIONS[MUG]
    script = [  # (reply, feedback, tool, invalid)
        ("xyzzy", "Nothing happens.", "", True),
        ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a mug 1.", "go", False),
        ("put mug 1 in/on desk 1", "Nothing happens.", "put", True),  # ALFWorld 0.4 spells it "move"
        ("Take Mug 1 from desk 1.", "You pick up the mug 1 from the desk 1.", "take", False),  # normalised
        ("go to shelf 1", "You arrive at shelf 1. On the shelf 1, you see nothing.", "go", False),
        ("", "Nothing happens.", "", True),
        ("help", "Available commands:", "help", False),  # admissible, though not listed
    ]
    for reply, text, tool, invalid in script:
        ra, rb = a.step(reply), b.step(reply)
        assert ra == rb  # same game, same replies, same results
        assert (ra.observation.split("\n")[0], ra.info.tool, ra.info.invalid_action, ra.done) == (
            text,
            tool,
            invalid,
            False,
        ), reply
    assert ra.observation.endswith("| look | move mug 1 to shelf 1")
    r = a.step("move mug 1 to shelf 1")
    assert r.done and r.reward == 1.0 and r.info.extra["won"] and not r.info.invalid_action
    assert r.observation.startswith("You move the mug 1 to the shelf 1.\n")
    a.close()
    b.close()
    # In this process (isolate=False): the step limit, counted by the adapter and by TextWorld alike.
    short = AlfworldEnv(AlfworldConfig(data_dir=config.data_dir, max_steps=3, action_format="tagged", isolate=False))
    short.reset(task)
    results = [short.step("<think>wait</think><action>look</action>") for _ in range(2)]
    results.append(short.step("<action>look</action>"))  # sent as is, but the reply broke the format
    assert [r.done for r in results] == [False, False, True] and results[-1].reward == 0.0
    assert results[-1].info.extra["truncated"] and results[-1].observation == results[0].observation
    assert [r.info.invalid_action for r in results] == [False, False, True]
    # fast-downward's state is per process: a second live in-process game is refused, not silently corrupted.
    other = AlfworldEnv(AlfworldConfig(data_dir=config.data_dir, isolate=False))
    with pytest.raises(RuntimeError, match="isolate=True"):
        other.reset(task)
    short.close()
    assert other.reset(task) == first  # free again once the first one closed
    other.close()


@needs_package
@pytest.mark.slow
def test_games_step_side_by_side_from_threads(tmp_path):
    """The rollout's env pool (rollout.env_workers) steps a batch's environments from threads at once: each game
    lives in its own process, so the episodes read as they do one after another."""
    from concurrent.futures import ThreadPoolExecutor

    config = one_game_folder(tmp_path, COOL)
    (task,) = AlfworldTasks(config).tasks("train")
    commands = [
        "go to fridge 1",
        "open fridge 1",
        "take apple 1 from fridge 1",
        "cool apple 1 with fridge 1",
        "go to countertop 1",
        "move apple 1 to countertop 1",
    ]
    plans = [commands, ["look", *commands[:2], "xyzzy", *commands[2:]]]

    def play(plan):
        env = AlfworldEnv(config)
        try:
            return [env.reset(task)] + [env.step(command) for command in plan]
        finally:
            env.close()

    alone = [play(plan) for plan in plans]
    with ThreadPoolExecutor(len(plans)) as pool:
        assert list(pool.map(play, plans)) == alone
    assert all(episode[-1].reward == 1.0 and episode[-1].done for episode in alone)


@pytest.mark.slow  # starts game processes of the real engine
@needs_package
@pytest.mark.parametrize("isolate", [True, False])
def test_a_game_that_fails_to_load_is_reported_and_dropped(tmp_path, isolate):
    config = one_game_folder(tmp_path, MUG)
    (task,) = AlfworldTasks(config).tasks("train")
    gamefile = Path(task.gamefile)
    good = gamefile.read_text()
    broken = json.loads(good)
    broken["pddl_problem"] = broken["pddl_problem"].replace("(:init", "(:init (", 1)
    gamefile.write_text(json.dumps(broken))
    env = AlfworldEnv(AlfworldConfig(data_dir=config.data_dir, isolate=isolate))
    with pytest.raises(Exception, match=r"Missing '\)'") as caught:  # the engine's own PDDL parse error
        env.reset(task)
    assert isinstance(caught.value, RuntimeError) == isolate  # from the child process: a RuntimeError naming it
    with pytest.raises(RuntimeError, match="before reset"):  # the half-loaded game is gone
        env.step("look")
    gamefile.write_text(good)
    assert env.reset(task) == FIRST_OBSERVATIONS[MUG]  # and nothing of it blocks the next episode
    env.close()


@pytest.mark.slow  # starts game processes of the real engine
@needs_package
def test_a_dead_game_process_is_reported(tmp_path):
    config = one_game_folder(tmp_path, MUG)
    (task,) = AlfworldTasks(config).tasks("train")
    env = AlfworldEnv(config)
    env.reset(task)
    env._game._process.kill()  # as the OOM killer or a crash in fast-downward would
    with pytest.raises(RuntimeError, match=r"game process died \(exit code -9\)"):
        env.step("look")
    env.close()  # returns at once for a dead process
    assert env.reset(task) == FIRST_OBSERVATIONS[MUG]  # the next episode gets a process of its own
    env.close()


# ----------------------------------------------------------------------------------------- downloaded ALFWorld games


def _unavailable_reason() -> str | None:
    try:
        require_alfworld(splits=("train", "valid_seen"))
    except AlfworldUnavailable as missing:
        return str(missing)
    return None


needs_alfworld = pytest.mark.skipif(
    _unavailable_reason() is not None,
    reason=f"{_unavailable_reason()} (cannot hold in CI: the games are a download from outside the package "
    "registries, which are all CI reaches)",
)


@needs_alfworld
def test_real_games_list_and_play():
    tasks = AlfworldTasks()
    train, heldout = tasks.tasks("train")[:3], tasks.tasks("heldout")[:3]
    assert train and heldout and not {t.gamefile for t in train} & {t.gamefile for t in heldout}
    assert AlfworldTasks().tasks("train")[:3] == train  # sorted, so the same order every time
    a, b = AlfworldEnv(), AlfworldEnv()
    first = a.reset(train[0])
    assert "Your task is to:" in first and "Welcome" not in first and "| help" not in first
    assert b.reset(train[0]) == first
    ra, rb = a.step("look"), b.step("look")
    assert ra.observation == rb.observation and not ra.info.invalid_action
    r = a.step("xyzzy plugh")
    assert r.info.invalid_action and r.observation.startswith("Nothing happens.")
    steps = 2
    while not r.done:
        r = a.step("inventory")
        steps += 1
    assert steps == 50 and r.reward == 0.0
    a.close()
    b.close()
