"""Tests of the ALFWorld-style text game: grammar and feedback, admissible lists, goals, limits, splits, expert."""

from __future__ import annotations

import copy
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments.protocol import Environment, TaskSource
from trainer.environments.textgame import (
    NOTHING,
    OBJECT_TYPES,
    TASK_TYPES,
    WORD_PATTERN,
    TextGameConfig,
    TextGameEnv,
    TextGameTask,
    TextGameTasks,
    expert_action,
    goal_reached,
    planned_action,
    play_expert,
    sample_texts,
    vocabulary,
)

ROOM = ("cabinet 1", "desk 1", "fridge 1", "microwave 1", "shelf 1", "shelf 2", "sinkbasin 1")
GOALS = {
    "pick_and_place": "put a mug in shelf.",
    "pick_clean_then_place": "put a clean mug in shelf.",
    "pick_heat_then_place": "put a hot mug in shelf.",
    "pick_cool_then_place": "put a cool mug in shelf.",
    "pick_two_obj": "put two mug in shelf.",
    "look_at_obj_in_light": "look at mug under the desklamp.",
}


def hand_task(task_type: str = "pick_clean_then_place") -> TextGameTask:
    """A room written by hand: mug 1 in the closed cabinet, mug 2 on the desk with the lamp, an apple in the fridge."""
    return TextGameTask(
        task_id=f"hand-{task_type}",
        task_type=task_type,
        goal=GOALS[task_type],
        object_type="mug",
        receptacle_type="" if task_type == "look_at_obj_in_light" else "shelf",
        receptacles=ROOM,
        placement=(("apple 1", "fridge 1"), ("mug 1", "cabinet 1"), ("mug 2", "desk 1")),
        lamp="desk 1",
    )


def run(env: TextGameEnv, *commands: str):
    """Step through `commands`; returns the last StepResult."""
    result = None
    for command in commands:
        result = env.step(command)
    return result


def feedback(result) -> str:
    return result.observation.split("\nAdmissible actions: ")[0]


def listed(result) -> list[str]:
    return result.observation.split("\nAdmissible actions: ")[1].split(" | ")


# ----------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_receptacles", 0),
        ("n_objects", 0),
        ("n_distractors", -1),
        ("max_steps", 0),
        ("n_train_tasks", -1),
        ("n_heldout_tasks", -2),
        ("n_receptacles", 2.5),
        ("max_steps", True),
        ("seed", "0"),
        ("task_types", ()),
        ("task_types", ("pick_and_place", "fly")),
        ("task_types", ("pick_and_place", "pick_and_place")),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TextGameConfig(**{field: value})


def test_config_needs_two_objects_for_pick_two():
    with pytest.raises(ValueError, match="n_objects"):
        TextGameConfig(n_objects=1)
    TextGameConfig(n_objects=1, task_types=("pick_and_place",))  # fine without pick_two_obj


def test_config_accepts_yaml_lists():
    assert TextGameConfig(task_types=["pick_and_place", "pick_two_obj"]).task_types == (
        "pick_and_place",
        "pick_two_obj",
    )


# ----------------------------------------------------------------------------------------- protocol and commands


def test_follows_the_protocol():
    env, source = TextGameEnv(), TextGameTasks(TextGameConfig(n_train_tasks=3, n_heldout_tasks=2))
    assert isinstance(env, Environment) and isinstance(source, TaskSource)
    assert env.max_turns == 50
    assert all(isinstance(t.task_id, str) for t in source.tasks("train"))


def test_first_observation_is_room_goal_and_actions():
    env = TextGameEnv()
    assert env.reset(hand_task()) == (
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a desk 1, a fridge 1, "
        "a microwave 1, a shelf 1, a shelf 2, and a sinkbasin 1.\n"
        "Your task is to: put a clean mug in shelf.\n"
        "Admissible actions: go to cabinet 1 | go to desk 1 | go to fridge 1 | go to microwave 1 | go to shelf 1 | "
        "go to shelf 2 | go to sinkbasin 1 | inventory | look"
    )


def test_every_command_type_gives_alfworld_feedback():
    env = TextGameEnv()
    env.reset(hand_task())
    expected = [
        (
            "look",
            "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a desk 1, "
            "a fridge 1, a microwave 1, a shelf 1, a shelf 2, and a sinkbasin 1.",
            "look",
        ),
        ("inventory", "You are not carrying anything.", "inventory"),
        ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed.", "go"),
        ("examine cabinet 1", "The cabinet 1 is closed.", "examine"),
        ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see a mug 1.", "open"),
        ("take mug 1 from cabinet 1", "You pick up the mug 1 from the cabinet 1.", "take"),
        ("examine cabinet 1", "The cabinet 1 is open. In it, you see nothing.", "examine"),
        ("close cabinet 1", "You close the cabinet 1.", "close"),
        ("inventory", "You are carrying: a mug 1.", "inventory"),
        ("examine mug 1", "There's nothing special about mug 1.", "examine"),
        ("look", "You are facing the cabinet 1. Next to it, you see nothing.", "look"),
        ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.", "go"),
        ("clean mug 1 with sinkbasin 1", "You clean the mug 1 using the sinkbasin 1.", "clean"),
        ("examine mug 1", "This is a clean mug 1.", "examine"),
        ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed.", "go"),
        ("heat mug 1 with microwave 1", "You heat the mug 1 using the microwave 1.", "heat"),
        ("examine mug 1", "This is a hot and clean mug 1.", "examine"),
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.", "go"),
        ("cool mug 1 with fridge 1", "You cool the mug 1 using the fridge 1.", "cool"),
        ("examine mug 1", "This is a cool and clean mug 1.", "examine"),  # cooling undid the heat
        ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a desklamp 1, and a mug 2.", "go"),
        ("use desklamp 1", "You turn on the desklamp 1.", "use"),
        ("use desklamp 1", "You turn off the desklamp 1.", "use"),
        ("put mug 1 in/on desk 1", "You put the mug 1 in/on the desk 1.", "put"),
        ("examine desk 1", "On the desk 1, you see a desklamp 1, a mug 1, and a mug 2.", "examine"),
    ]
    for command, text, tool in expected:
        result = env.step(command)
        assert (feedback(result), result.info.tool, result.info.invalid_action) == (text, tool, False), command
        assert not result.done and result.reward == 0.0


def test_admissible_list_at_hand_checked_states():
    env = TextGameEnv()
    env.reset(hand_task())
    gos = [
        "go to cabinet 1",
        "go to desk 1",
        "go to fridge 1",
        "go to microwave 1",
        "go to shelf 1",
        "go to shelf 2",
        "go to sinkbasin 1",
    ]
    r = env.step("go to fridge 1")  # closed: no take; can open
    assert listed(r) == ["examine fridge 1"] + [g for g in gos if g != "go to fridge 1"] + [
        "inventory",
        "look",
        "open fridge 1",
    ]
    r = env.step("open fridge 1")  # open, hands empty: take what is inside, close
    assert listed(r) == ["close fridge 1", "examine fridge 1"] + [g for g in gos if g != "go to fridge 1"] + [
        "inventory",
        "look",
        "take apple 1 from fridge 1",
    ]
    r = env.step("take apple 1 from fridge 1")  # holding: cool, put back, examine it; no more take
    assert listed(r) == ["close fridge 1", "cool apple 1 with fridge 1", "examine apple 1", "examine fridge 1"] + [
        g for g in gos if g != "go to fridge 1"
    ] + ["inventory", "look", "put apple 1 in/on fridge 1"]
    r = env.step("go to desk 1")  # holding at the lamp: put, use the lamp; the lamp cannot be taken
    assert listed(r) == ["examine apple 1", "examine desk 1"] + [g for g in gos if g != "go to desk 1"] + [
        "inventory",
        "look",
        "put apple 1 in/on desk 1",
        "use desklamp 1",
    ]


def test_admissible_list_uses_natural_order():
    task = TextGameTask(
        task_id="t",
        task_type="pick_and_place",
        goal="put a mug in shelf.",
        object_type="mug",
        receptacle_type="shelf",
        receptacles=tuple(f"shelf {i}" for i in range(1, 12)) + ("desk 1",),
        placement=(("mug 1", "desk 1"),),
        lamp="desk 1",
    )
    env = TextGameEnv()
    env.reset(task)
    gos = [c for c in env.admissible_actions() if c.startswith("go to shelf")]
    assert gos == [f"go to shelf {i}" for i in range(1, 12)]  # "shelf 2" before "shelf 10"


@pytest.mark.parametrize(
    "action, tool",
    [
        ("take mug 1 from cabinet 1", "take"),  # cabinet is closed and we are not there
        ("go to sofa 1", "go"),  # no such receptacle
        ("put mug 1 in/on shelf 1", "put"),  # not holding anything
        ("use desklamp 1", "use"),  # not at the desk
        ("dance", ""),
        ("", ""),
        ("go to", ""),  # not a command at all
        ("move mug 1 to shelf 1", ""),  # ALFWorld 0.4's spelling is not this game's grammar
    ],
)
def test_inadmissible_action_says_nothing_happens_and_changes_nothing(action, tool):
    env = TextGameEnv()
    first = env.reset(hand_task())
    before = copy.deepcopy(env.state)
    result = env.step(action)
    assert feedback(result) == NOTHING
    assert result.info.invalid_action and result.info.tool == tool
    assert not result.done and result.reward == 0.0
    assert env.state == before
    assert listed(result) == first.split("\nAdmissible actions: ")[1].split(" | ")


def test_commands_are_case_space_and_period_insensitive():
    env = TextGameEnv()
    env.reset(hand_task())
    result = env.step("  Go  to Cabinet 1. ")
    assert feedback(result) == "You arrive at cabinet 1. The cabinet 1 is closed." and not result.info.invalid_action


def test_bad_calls_raise_clear_errors():
    env = TextGameEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("look")
    with pytest.raises(TypeError, match="TextGameTask"):
        env.reset("pick_and_place")
    env.reset(hand_task())
    with pytest.raises(TypeError, match="str"):
        env.step(None)
    with pytest.raises(ValueError, match="noise"):
        expert_action(env, random.Random(0), noise=1.5)


# ----------------------------------------------------------------------------------------- goals and limits


def test_clean_goal_needs_the_clean_object_in_the_target():
    env = TextGameEnv()
    env.reset(hand_task("pick_clean_then_place"))
    r = run(env, "go to desk 1", "take mug 2 from desk 1", "go to shelf 1", "put mug 2 in/on shelf 1")
    assert not r.done and r.reward == 0.0  # dirty mug in the shelf: not yet
    r = run(env, "take mug 2 from shelf 1", "go to sinkbasin 1", "clean mug 2 with sinkbasin 1", "go to shelf 2")
    assert not r.done
    r = env.step("put mug 2 in/on shelf 2")  # any shelf counts: the goal names a type
    assert r.done and r.reward == 1.0 and r.info.extra["won"] and not r.info.extra["truncated"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")


@pytest.mark.parametrize(
    "task_type, verb, appliance",
    [("pick_heat_then_place", "heat", "microwave 1"), ("pick_cool_then_place", "cool", "fridge 1")],
)
def test_heat_and_cool_goals(task_type, verb, appliance):
    env = TextGameEnv()
    env.reset(hand_task(task_type))
    r = run(
        env,
        "go to desk 1",
        "take mug 2 from desk 1",
        f"go to {appliance}",
        f"{verb} mug 2 with {appliance}",
        "go to shelf 1",
    )
    assert not r.done
    r = env.step("put mug 2 in/on shelf 1")
    assert r.done and r.reward == 1.0


def test_heating_a_cooled_object_spoils_the_cool_goal():
    env = TextGameEnv()
    env.reset(hand_task("pick_cool_then_place"))
    r = run(
        env,
        "go to desk 1",
        "take mug 2 from desk 1",
        "go to fridge 1",
        "cool mug 2 with fridge 1",
        "go to microwave 1",
        "heat mug 2 with microwave 1",
        "go to shelf 1",
        "put mug 2 in/on shelf 1",
    )
    assert not r.done and r.reward == 0.0


def test_pick_and_place_goal():
    env = TextGameEnv()
    env.reset(hand_task("pick_and_place"))
    r = run(env, "go to desk 1", "take mug 2 from desk 1", "go to shelf 2")
    assert not r.done
    r = env.step("put mug 2 in/on shelf 2")
    assert r.done and r.reward == 1.0 and r.info.tool == "put"


def test_pick_two_needs_both_in_the_same_receptacle():
    env = TextGameEnv()
    env.reset(hand_task("pick_two_obj"))
    r = run(
        env,
        "go to desk 1",
        "take mug 2 from desk 1",
        "go to shelf 1",
        "put mug 2 in/on shelf 1",
        "go to cabinet 1",
        "open cabinet 1",
        "take mug 1 from cabinet 1",
        "go to shelf 2",
        "put mug 1 in/on shelf 2",
    )
    assert not r.done  # one mug in each shelf
    r = run(env, "take mug 1 from shelf 2", "go to shelf 1")
    assert not r.done
    r = env.step("put mug 1 in/on shelf 1")
    assert r.done and r.reward == 1.0


def test_look_in_light_needs_the_object_in_hand_at_the_lit_lamp():
    env = TextGameEnv()
    env.reset(hand_task("look_at_obj_in_light"))
    r = run(env, "go to desk 1", "use desklamp 1")
    assert not r.done  # lamp on, hands empty
    r = run(env, "use desklamp 1", "take mug 2 from desk 1")
    assert not r.done  # mug in hand, lamp off
    assert env.step("use desklamp 1").done
    # Lamp already on, the mug fetched from elsewhere: done on arrival at the lamp.
    env.reset(hand_task("look_at_obj_in_light"))
    r = run(
        env,
        "go to desk 1",
        "use desklamp 1",
        "go to fridge 1",
        "open fridge 1",
        "take apple 1 from fridge 1",
        "go to desk 1",
    )
    assert not r.done  # an apple is not a mug
    r = run(env, "put apple 1 in/on desk 1", "go to cabinet 1", "open cabinet 1", "take mug 1 from cabinet 1")
    assert not r.done  # mug in hand, away from the lamp
    r = env.step("go to desk 1")
    assert r.done and r.reward == 1.0


def test_episode_ends_unrewarded_at_the_step_limit():
    env = TextGameEnv()
    env.reset(hand_task())
    for step in range(1, 50):
        result = env.step("look" if step % 2 else "fly away")
        assert not result.done
    result = env.step("look")
    assert result.done and result.reward == 0.0 and result.info.extra == {"won": False, "truncated": True, "steps": 50}
    with pytest.raises(RuntimeError):
        env.step("look")
    short = TextGameEnv(TextGameConfig(max_steps=3))
    short.reset(hand_task())
    assert [short.step("look").done for _ in range(3)] == [False, False, True]


def test_winning_on_the_last_step_counts_as_success():
    env = TextGameEnv(TextGameConfig(max_steps=4))
    env.reset(hand_task("pick_and_place"))
    r = run(env, "go to desk 1", "take mug 2 from desk 1", "go to shelf 1", "put mug 2 in/on shelf 1")
    assert r.done and r.reward == 1.0 and not r.info.extra["truncated"]


# ----------------------------------------------------------------------------------------- random walks vs the rules

OPENABLE_KINDS = {"cabinet", "drawer", "fridge", "microwave"}


def rules_admissible(task: TextGameTask, world) -> set[str]:
    """The admissible set restated from ALFWorld's rules, independently of the environment's code."""
    here, held = world.location, world.holding
    out = {"look", "inventory"} | {f"go to {r}" for r in task.receptacles if r != here}
    if held:
        out.add(f"examine {held}")
    if here:
        out.add(f"examine {here}")
        openable = here.rsplit(" ", 1)[0] in OPENABLE_KINDS
        reachable = not openable or here in world.opened
        if openable:
            out.add(f"close {here}" if here in world.opened else f"open {here}")
        if reachable and not held:
            out |= {f"take {o} from {here}" for o in world.contents[here] if o != "desklamp 1"}
        if reachable and held:
            out.add(f"put {held} in/on {here}")
        if "desklamp 1" in world.contents[here]:
            out.add("use desklamp 1")
        if held and here in ("sinkbasin 1", "microwave 1", "fridge 1"):
            verb = {"sinkbasin 1": "clean", "microwave 1": "heat", "fridge 1": "cool"}[here]
            out.add(f"{verb} {held} with {here}")
    return out


SMALL = TextGameConfig(n_train_tasks=30, n_heldout_tasks=10)
SMALL_TASKS = TextGameTasks(SMALL).tasks("train")


@settings(max_examples=60, deadline=None)
@given(task_index=st.integers(0, len(SMALL_TASKS) - 1), picks=st.lists(st.integers(0, 10_000), max_size=60))
def test_random_walks_follow_the_rules(task_index, picks):
    task = SMALL_TASKS[task_index]
    env = TextGameEnv(SMALL)
    env.reset(task)
    objects = sorted(o for o, _ in task.placement)
    for pick in picks:
        if env.done:
            break
        world = env.state
        allowed = env.admissible_actions()
        assert set(allowed) == rules_admissible(task, world)
        assert len(set(allowed)) == len(allowed)
        if pick % 7 == 0:  # a plausible but probably inadmissible command
            action = f"take {objects[pick % len(objects)]} from {task.receptacles[pick % len(task.receptacles)]}"
        else:
            action = allowed[pick % len(allowed)]
        result = env.step(action)
        assert result.info.invalid_action == (action not in allowed)
        assert (feedback(result) == NOTHING) == result.info.invalid_action
        # Conservation: every object is in exactly one receptacle or in hand; the lamp never moves.
        where = [o for objs in env.state.contents.values() for o in objs] + [env.state.holding]
        assert sorted(o for o in where if o not in (None, "desklamp 1")) == objects
        assert env.state.contents[task.lamp].count("desklamp 1") == 1
        assert result.done == (result.info.extra["won"] or env.steps >= 50)
        assert result.reward == (1.0 if result.info.extra["won"] else 0.0)
        assert listed(result) == list(env.admissible_actions())


@settings(max_examples=30, deadline=None)
@given(picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=40), task_index=st.integers(0, 29))
def test_same_task_same_actions_same_observations_in_two_instances(picks, task_index):
    task = SMALL_TASKS[task_index]
    a, b = TextGameEnv(SMALL), TextGameEnv(SMALL)
    assert a.reset(task) == b.reset(task)
    for pick in picks:
        if a.done:
            break
        allowed = a.admissible_actions()
        action = allowed[pick % len(allowed)] if pick % 5 else "open the pod bay doors"
        ra, rb = a.step(action), b.step(action)
        assert ra == rb


# ----------------------------------------------------------------------------------------- tasks and splits


def test_splits_are_disjoint_deterministic_and_sized():
    config = TextGameConfig()
    train, heldout = TextGameTasks(config).tasks("train"), TextGameTasks(config).tasks("heldout")
    assert (len(train), len(heldout)) == (1000, 200)
    content = lambda t: (t.task_type, t.object_type, t.receptacle_type, t.receptacles, t.placement, t.lamp)  # noqa
    assert not {content(t) for t in train} & {content(t) for t in heldout}
    assert len({content(t) for t in train}) == 1000 and len({t.task_id for t in train + heldout}) == 1200
    assert TextGameTasks(config).tasks("train") == train  # same seed, same tasks
    assert TextGameTasks(config).tasks("heldout", 7) == heldout[:7]
    other = TextGameTasks(TextGameConfig(seed=1)).tasks("train", 50)
    assert [t.task_id for t in other] != [t.task_id for t in train[:50]]
    # Resizing one split leaves the other unchanged.
    assert TextGameTasks(TextGameConfig(n_train_tasks=10)).tasks("heldout") == heldout
    assert TextGameTasks(TextGameConfig(n_heldout_tasks=5)).tasks("train") == train


def test_task_source_rejects_bad_requests():
    source = TextGameTasks(SMALL)
    with pytest.raises(ValueError, match="split"):
        source.tasks("test")
    with pytest.raises(ValueError, match="n must be"):
        source.tasks("heldout", 11)
    with pytest.raises(ValueError, match="too few distinct tasks"):
        TextGameTasks(
            TextGameConfig(
                n_receptacles=1, n_objects=1, n_distractors=0, n_heldout_tasks=0, task_types=("look_at_obj_in_light",)
            )
        ).tasks("train")


def test_generated_tasks_are_well_formed():
    config = TextGameConfig(n_receptacles=4, n_objects=3, n_distractors=5)
    env = TextGameEnv(config)
    for task in TextGameTasks(config).tasks("train", 300):
        assert task.task_type in TASK_TYPES and task.task_type in OBJECT_TYPES[task.object_type]
        assert len(task.receptacles) == 4 + 3 and {"fridge 1", "microwave 1", "sinkbasin 1"} <= set(task.receptacles)
        assert task.lamp in task.receptacles and task.lamp.split()[0] in ("desk", "dresser", "sidetable")
        goal_objects = [o for o, _ in task.placement if o.split()[0] == task.object_type]
        assert len(goal_objects) == 3 and len(task.placement) == 8
        if task.receptacle_type:
            assert any(r.split()[0] == task.receptacle_type for r in task.receptacles)
        assert task.goal in env.reset(task)
        assert not goal_reached(task, env.state)
    seen_types = {t.task_type for t in TextGameTasks(config).tasks("train", 300)}
    assert seen_types == set(TASK_TYPES)


def test_task_types_subset_is_respected():
    config = TextGameConfig(task_types=("pick_heat_then_place", "pick_two_obj"), n_train_tasks=100)
    assert {t.task_type for t in TextGameTasks(config).tasks("train")} == {"pick_heat_then_place", "pick_two_obj"}


# ----------------------------------------------------------------------------------------- expert


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_expert_solves_every_task_without_noise(split):
    config = TextGameConfig(n_train_tasks=200, n_heldout_tasks=200)
    lengths = []
    for task in TextGameTasks(config).tasks(split, 200):
        observations, commands, results = play_expert(task, config)
        assert results[-1].reward == 1.0 and not any(r.info.invalid_action for r in results), task.task_id
        lengths.append(len(commands))
    assert max(lengths) <= 12  # go, open, take, go, treat, go, open, put; twice for pick_two


def test_noisy_expert_takes_random_admissible_actions_and_recovers():
    config = TextGameConfig(n_train_tasks=100)
    env, rng = TextGameEnv(config), random.Random(3)
    planned_differs, wins = 0, 0
    for task in TextGameTasks(config).tasks("train"):
        env.reset(task)
        while not env.done:
            plan = planned_action(env.task, env.state)
            assert plan in env.admissible_actions()  # the planner only ever proposes admissible commands
            action = expert_action(env, rng, noise=0.4)
            planned_differs += action != plan
            result = env.step(action)
            assert not result.info.invalid_action
        wins += result.reward
    assert planned_differs > 50  # noise did act
    assert wins >= 90  # replanning recovers within 50 steps almost always


def test_expert_with_full_noise_is_seeded():
    config = TextGameConfig(n_train_tasks=5)
    task = TextGameTasks(config).tasks("train", 1)[0]
    first = play_expert(task, config, 1.0, random.Random(7))[1]
    again = play_expert(task, config, 1.0, random.Random(7))[1]
    other = play_expert(task, config, 1.0, random.Random(8))[1]
    assert first == again and first != other


# ----------------------------------------------------------------------------------------- transcripts and words


def test_transcripts_and_vocabulary_cover_each_other():
    config = TextGameConfig(n_receptacles=8, n_objects=3, n_distractors=6, n_train_tasks=60)
    transcripts = sample_texts(config, n=60, noise=0.5, seed=1)
    assert len(transcripts) == 60 and all("\n> " in t for t in transcripts)
    assert len(sample_texts(config, n=500)) == 60  # no more episodes than the split has tasks
    words = set(vocabulary(config))
    # "> " marks the commands in a transcript; it is not part of any observation or command.
    seen = {w for text in transcripts for w in WORD_PATTERN.findall(text.replace("\n> ", "\n"))}
    seen |= set(WORD_PATTERN.findall(NOTHING))
    assert seen <= words, seen - words
    assert len(words) <= 110  # small enough for a word-level tokenizer
    assert {"8"} <= words and "9" not in words
    # The transcript is the episode as played: its first block is the first observation of a reset.
    task = TextGameTasks(config).tasks("train", 1)[0]
    assert transcripts[0].startswith(TextGameEnv(config).reset(task))
    assert re.search(r"^> go to ", transcripts[0], re.M)
