"""The scripted expert (for the supervised warm start and for tests), transcripts, and the vocabulary.

The expert is a planner with full knowledge of the world (like ALFWorld's PDDL planner expert) that replans from
the current state every step, so with noise it recovers from the random actions it took. It has the shape of
every family's expert, `expert_action(env, rng, noise)`, so the suite plays all of them alike.
"""

from __future__ import annotations

import random
import re

from trainer.environments.protocol import StepResult
from trainer.environments.textgame.env import TextGameEnv
from trainer.environments.textgame.tasks import (
    _GOAL_TEMPLATE,
    _L,
    _PROPERTY,
    APPLIANCES,
    OBJECT_TYPES,
    STORAGE_TYPES,
    TextGameConfig,
    TextGameTask,
    TextGameTasks,
    _kind,
)
from trainer.environments.textgame.world import _APPLIANCE_FOR, LAMP, NOTHING, WorldState, _visible, format_observation


def planned_action(task: TextGameTask, world: WorldState) -> str:
    """The planner's next command from `world` toward the goal (always admissible while the goal is unmet)."""
    is_goal_object = lambda obj: _kind(obj) == task.object_type  # noqa: E731

    def at(receptacle: str, command: str, need_open: bool = True) -> str:
        """`command` once standing at `receptacle` (opened first when it must be)."""
        if world.location != receptacle:
            return f"go to {receptacle}"
        if need_open and not _visible(world, receptacle):
            return f"open {receptacle}"
        return command

    held = world.holding
    if held is not None and not is_goal_object(held):  # a random action picked up the wrong thing: put it back
        if world.location is None:
            return f"go to {task.receptacles[0]}"
        return at(world.location, f"put {held} in/on {world.location}")

    if task.task_type == _L:
        if held is not None:
            return at(task.lamp, f"use {LAMP}")  # the lamp is off, else the goal would hold
        target, prop = None, None
    else:
        prop = _PROPERTY.get(task.task_type)
        satisfied = lambda obj: prop is None or prop in world.properties[obj]  # noqa: E731
        targets = [r for r in task.receptacles if _kind(r) == task.receptacle_type]
        # pick_two: finish in the target that already holds the most goal objects (first one on ties).
        target = max(targets, key=lambda r: sum(is_goal_object(o) and satisfied(o) for o in world.contents[r]))
        if held is not None:
            if prop is not None and prop not in world.properties[held]:
                verb, appliance = _APPLIANCE_FOR[prop]
                return at(appliance, f"{verb} {held} with {appliance}", need_open=False)
            return at(target, f"put {held} in/on {target}")

    candidates = [
        (obj, r)
        for r in task.receptacles
        for obj in world.contents[r]
        if is_goal_object(obj) and not (r == target and (prop is None or prop in world.properties[obj]))
    ]
    obj, receptacle = next(((o, r) for o, r in candidates if r == world.location), candidates[0])
    return at(receptacle, f"take {obj} from {receptacle}")


def expert_action(env: TextGameEnv, rng: random.Random, noise: float = 0.0) -> str:
    """The expert's next command for the episode running in `env`: the planner's, or with probability `noise` a
    uniformly random admissible one, drawn from `rng`."""
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not 0.0 <= noise <= 1.0:
        raise ValueError(f"expert noise must be a probability in [0, 1], got {noise!r}")
    if env.state is None or env.done:
        raise RuntimeError("expert_action needs an env with a running episode")
    if noise > 0.0 and rng.random() < noise:
        return rng.choice(env.admissible_actions())
    return planned_action(env.task, env.state)


def play_expert(
    task: TextGameTask, config: TextGameConfig | None = None, noise: float = 0.0, rng: random.Random | None = None
) -> tuple[list[str], list[str], list[StepResult]]:
    """Play one episode of `task` with the expert: (observations with the first one, commands, step results)."""
    env, rng = TextGameEnv(config), rng or random.Random(0)
    observations, commands, results = [env.reset(task)], [], []
    while not env.done:
        commands.append(expert_action(env, rng, noise))
        results.append(env.step(commands[-1]))
        observations.append(results[-1].observation)
    return observations, commands, results


def sample_texts(
    config: TextGameConfig | None = None, n: int = 32, noise: float = 0.3, seed: int = 0, split: str = "train"
) -> list[str]:
    """Text of `n` expert episodes (at most one per task of `split`) with some random actions: observations
    with "> command" lines between them.

    Meant for building a tokenizer. Random actions come from the admissible list, so "Nothing happens." does
    not appear; `vocabulary()` gives the complete word list.
    """
    config = config or TextGameConfig()
    rng = random.Random(seed)
    transcripts = []
    for task in TextGameTasks(config).tasks(split)[:n]:
        observations, commands, _ = play_expert(task, config, noise, rng)
        lines = [observations[0]]
        for command, observation in zip(commands, observations[1:]):
            lines += [f"> {command}", observation]
        transcripts.append("\n".join(lines))
    return transcripts


WORD_PATTERN = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")
"""Words as `vocabulary()` counts them: runs of letters, runs of digits, single punctuation marks."""


def vocabulary(config: TextGameConfig | None = None) -> tuple[str, ...]:
    """Every word (WORD_PATTERN) that can appear in an observation or admissible command under `config`."""
    config = config or TextGameConfig()
    fixed = " ".join(
        [
            format_observation(
                "",
                [
                    "go to x",
                    "take x from x",
                    "put x in/on x",
                    "use x",
                    "examine x",
                    "open x",
                    "close x",
                    "clean x with x",
                    "heat x with x",
                    "cool x with x",
                    "inventory",
                    "look",
                ],
            ),
            "You are in the middle of a room. Looking quickly around you, you see nothing, a x, and a x.",
            "Your task is to:",
            *(t.format(o="x", r="x") for t in _GOAL_TEMPLATE.values()),
            NOTHING,
            "You arrive at. You open the. You close the. You pick up the from the. You put the in/on the.",
            "You clean the using the. You heat the using the. You cool the using the. You turn on off the.",
            "The is closed. The is open. In it, you see. On the, you see.",
            "There's nothing special about. This is a hot and clean. This is a cool and clean.",
            "You are not carrying anything. You are carrying: a. You are facing the. Next to it, you see nothing.",
            " ".join(STORAGE_TYPES),
            " ".join(APPLIANCES),
            " ".join(OBJECT_TYPES),
            LAMP,
        ]
    )
    words = set(WORD_PATTERN.findall(fixed)) - {"x"}
    top = max(config.n_receptacles, config.n_objects, config.n_distractors, 1)
    words |= {str(i) for i in range(1, top + 1)}
    return tuple(sorted(words))
