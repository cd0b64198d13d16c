"""The world rules: command grammar, world state, admissible commands, each command's effect and feedback
sentence, and the goal check.

Pure functions of a task and a world state, shared by the environment (which applies them) and the expert
(which plans with them), so both read one set of rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainer.environments.textgame.tasks import _L, _PROPERTY, _T, TextGameTask, _kind, natural_key

OPENABLE: frozenset[str] = frozenset({"cabinet", "drawer", "fridge", "microwave"})
"""Receptacle types that start closed and hide their contents until opened."""

LAMP = "desklamp 1"

_APPLIANCE_FOR = {"clean": ("clean", "sinkbasin 1"), "hot": ("heat", "microwave 1"), "cool": ("cool", "fridge 1")}
"""Property -> (the command's verb, the appliance that gives it)."""
NOTHING = "Nothing happens."
"""The feedback to any inadmissible command."""


def _listing(items) -> str:
    """ALFWorld's list style: "nothing", "a x 1", "a x 1, and a y 2", "a x 1, a y 2, and a z 3"."""
    items = [f"a {item}" for item in items]
    if not items:
        return "nothing"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def format_observation(feedback: str, admissible) -> str:
    """The observation text: feedback, newline, the admissible commands separated by " | "."""
    return f"{feedback}\nAdmissible actions: {' | '.join(admissible)}"


def normalize_action(action: str) -> str:
    """Lower-case, collapse whitespace, drop one trailing period: what is compared to the admissible list."""
    text = " ".join(action.lower().split())
    return text[:-1].rstrip() if text.endswith(".") else text


_GRAMMAR: tuple[tuple[str, re.Pattern], ...] = tuple(
    (verb, re.compile(pattern))
    for verb, pattern in (
        ("go", r"go to (?P<r>[a-z]+ \d+)"),
        ("open", r"open (?P<r>[a-z]+ \d+)"),
        ("close", r"close (?P<r>[a-z]+ \d+)"),
        ("take", r"take (?P<o>[a-z]+ \d+) from (?P<r>[a-z]+ \d+)"),
        ("put", r"put (?P<o>[a-z]+ \d+) in/on (?P<r>[a-z]+ \d+)"),
        ("clean", r"clean (?P<o>[a-z]+ \d+) with (?P<r>[a-z]+ \d+)"),
        ("heat", r"heat (?P<o>[a-z]+ \d+) with (?P<r>[a-z]+ \d+)"),
        ("cool", r"cool (?P<o>[a-z]+ \d+) with (?P<r>[a-z]+ \d+)"),
        ("use", r"use (?P<o>[a-z]+ \d+)"),
        ("examine", r"examine (?P<x>[a-z]+ \d+)"),
        ("inventory", r"inventory"),
        ("look", r"look"),
    )
)
"""Command shapes; the verb is StepInfo.tool. A command that fits none of them has tool ""."""


def parse_command(action: str) -> tuple[str, dict[str, str]]:
    """(verb, arguments) of a normalized command, or ("", {}) when it fits no command shape."""
    for verb, pattern in _GRAMMAR:
        match = pattern.fullmatch(action)
        if match:
            return verb, match.groupdict()
    return "", {}


# --------------------------------------------------------------------------------------------- world


@dataclass
class WorldState:
    """The mutable state of one episode. Read it (the expert does); only TextGameEnv.step changes it."""

    location: str | None
    """Receptacle the agent stands at; None in the middle of the room (before the first "go to")."""
    holding: str | None
    """The object in hand, if any."""
    contents: dict[str, list[str]]
    """Receptacle -> objects in it, in natural order (the desk lamp included where it stands)."""
    opened: set[str] = field(default_factory=set)
    """Openable receptacles that are open now."""
    properties: dict[str, set[str]] = field(default_factory=dict)
    """Object -> subset of {"clean", "hot", "cool"}."""
    lamp_on: bool = False


def _initial_world(task: TextGameTask) -> WorldState:
    contents: dict[str, list[str]] = {r: [] for r in task.receptacles}
    for obj, receptacle in task.placement:
        contents[receptacle].append(obj)
    contents[task.lamp].append(LAMP)
    for receptacle in contents:
        contents[receptacle].sort(key=natural_key)
    return WorldState(
        location=None, holding=None, contents=contents, properties={obj: set() for obj, _ in task.placement}
    )


def _visible(world: WorldState, receptacle: str) -> bool:
    return _kind(receptacle) not in OPENABLE or receptacle in world.opened


def _describe_receptacle(world: WorldState, receptacle: str) -> str:
    if _kind(receptacle) in OPENABLE:
        if receptacle not in world.opened:
            return f"The {receptacle} is closed."
        return f"The {receptacle} is open. In it, you see {_listing(world.contents[receptacle])}."
    return f"On the {receptacle}, you see {_listing(world.contents[receptacle])}."


def _describe_object(world: WorldState, obj: str) -> str:
    props = world.properties.get(obj, set())
    adjectives = [word for word in ("hot", "cool") if word in props]
    if "clean" in props:
        adjectives = [" and ".join(adjectives + ["clean"])]
    if not adjectives:
        return f"There's nothing special about {obj}."
    return f"This is a {adjectives[0]} {obj}."


def admissible_commands(task: TextGameTask, world: WorldState) -> tuple[str, ...]:
    """Every command that does something in this state, in natural order."""
    commands = ["look", "inventory"]
    commands += [f"go to {r}" for r in task.receptacles if r != world.location]
    here = world.location
    if here is not None:
        commands.append(f"examine {here}")
        if _kind(here) in OPENABLE:
            commands.append(f"{'close' if here in world.opened else 'open'} {here}")
        if _visible(world, here):
            if world.holding is None:
                commands += [f"take {obj} from {here}" for obj in world.contents[here] if obj != LAMP]
            else:
                commands.append(f"put {world.holding} in/on {here}")
            if LAMP in world.contents[here]:
                commands.append(f"use {LAMP}")
        if world.holding is not None:
            for verb, appliance in _APPLIANCE_FOR.values():
                if here == appliance:
                    commands.append(f"{verb} {world.holding} with {appliance}")
    if world.holding is not None:
        commands.append(f"examine {world.holding}")
    return tuple(sorted(commands, key=natural_key))


def _execute(world: WorldState, verb: str, args: dict[str, str]) -> str:
    """Apply an admissible command to the world; returns ALFWorld's feedback sentence."""
    if verb == "go":
        world.location = args["r"]
        return f"You arrive at {args['r']}. {_describe_receptacle(world, args['r'])}"
    if verb == "open":
        world.opened.add(args["r"])
        return f"You open the {args['r']}. {_describe_receptacle(world, args['r'])}"
    if verb == "close":
        world.opened.discard(args["r"])
        return f"You close the {args['r']}."
    if verb == "take":
        world.contents[args["r"]].remove(args["o"])
        world.holding = args["o"]
        return f"You pick up the {args['o']} from the {args['r']}."
    if verb == "put":
        world.contents[args["r"]].append(args["o"])
        world.contents[args["r"]].sort(key=natural_key)
        world.holding = None
        return f"You put the {args['o']} in/on the {args['r']}."
    if verb in ("clean", "heat", "cool"):
        props = world.properties[args["o"]]
        if verb == "clean":
            props.add("clean")
        else:
            new, old = ("hot", "cool") if verb == "heat" else ("cool", "hot")
            props.discard(old)
            props.add(new)
        return f"You {verb} the {args['o']} using the {args['r']}."
    if verb == "use":
        world.lamp_on = not world.lamp_on
        return f"You turn {'on' if world.lamp_on else 'off'} the {args['o']}."
    if verb == "examine":
        target = args["x"]
        if target in world.contents:
            return _describe_receptacle(world, target)
        return _describe_object(world, target)
    if verb == "inventory":
        if world.holding is None:
            return "You are not carrying anything."
        return f"You are carrying: a {world.holding}."
    if verb == "look":
        if world.location is None:
            return (
                "You are in the middle of a room. Looking quickly around you, you see "
                f"{_listing(sorted(world.contents, key=natural_key))}."
            )
        return f"You are facing the {world.location}. Next to it, you see nothing."
    raise AssertionError(f"unhandled verb {verb!r}")  # admissible commands only reach here


def goal_reached(task: TextGameTask, world: WorldState) -> bool:
    """Whether the task's goal holds in `world` (see the module docstring for each type's condition)."""
    is_goal_object = lambda obj: obj is not None and _kind(obj) == task.object_type  # noqa: E731
    if task.task_type == _L:
        return world.lamp_on and is_goal_object(world.holding) and world.location == task.lamp
    prop = _PROPERTY.get(task.task_type)
    need = 2 if task.task_type == _T else 1
    for receptacle, objects in world.contents.items():
        if _kind(receptacle) != task.receptacle_type:
            continue
        done = [o for o in objects if is_goal_object(o) and (prop is None or prop in world.properties[o])]
        if len(done) >= need:
            return True
    return False
