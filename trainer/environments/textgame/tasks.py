"""The game's catalogue (task types, receptacle and object types, goal sentences), its config, the task
records and the seeded generator of the train and held-out splits.

Everything random about a game is drawn here, when a task is generated; the other modules are deterministic.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "look_at_obj_in_light",
    "pick_two_obj",
)
"""ALFWorld's six task types (names shortened as in verl-agent's logs)."""

STORAGE_TYPES: tuple[str, ...] = (
    "cabinet",
    "coffeemachine",
    "countertop",
    "desk",
    "diningtable",
    "drawer",
    "dresser",
    "garbagecan",
    "shelf",
    "sidetable",
)
"""Receptacles that hold objects and can be a goal's target."""

LAMP_HOLDERS: tuple[str, ...] = ("desk", "dresser", "sidetable")
"""Storage types the desk lamp can stand on (every room has one of them)."""

APPLIANCES: tuple[str, ...] = ("fridge 1", "microwave 1", "sinkbasin 1")
"""Always present; objects can lie in them but they are never a goal's target."""

# Which task types each object type can be the goal object of (plausible ALFWorld pairings).
_P, _C, _H, _O, _L, _T = TASK_TYPES[0], TASK_TYPES[1], TASK_TYPES[2], TASK_TYPES[3], TASK_TYPES[4], TASK_TYPES[5]
OBJECT_TYPES: dict[str, frozenset[str]] = {
    "apple": frozenset({_P, _C, _H, _O}),
    "bread": frozenset({_P, _H, _O}),
    "egg": frozenset({_P, _H, _O}),
    "lettuce": frozenset({_P, _C, _O}),
    "potato": frozenset({_P, _C, _H, _O}),
    "tomato": frozenset({_P, _C, _H, _O}),
    "mug": frozenset({_P, _C, _H, _O, _T}),
    "cup": frozenset({_P, _C, _H, _O, _T}),
    "bowl": frozenset({_P, _C, _O, _T}),
    "plate": frozenset({_P, _C, _H, _O, _T}),
    "pan": frozenset({_P, _C, _O}),
    "spoon": frozenset({_P, _C, _T}),
    "book": frozenset({_P, _L, _T}),
    "cellphone": frozenset({_P, _L, _T}),
    "creditcard": frozenset({_P, _L, _T}),
    "keychain": frozenset({_P, _L, _T}),
    "pen": frozenset({_P, _L, _T}),
    "vase": frozenset({_P, _L, _T}),
}

_PROPERTY = {_C: "clean", _H: "hot", _O: "cool"}
"""The state a goal object must be in, per task type."""
_GOAL_TEMPLATE = {
    _P: "put a {o} in {r}.",
    _C: "put a clean {o} in {r}.",
    _H: "put a hot {o} in {r}.",
    _O: "put a cool {o} in {r}.",
    _T: "put two {o} in {r}.",
    _L: "look at {o} under the desklamp.",
}
_HELDOUT_BUCKETS = 5
"""A layout is held out when its digest is 0 modulo this (about one in five)."""


def _kind(name: str) -> str:
    """Type of an instance name: "cabinet 10" -> "cabinet"."""
    return name.rsplit(" ", 1)[0]


def natural_key(text: str) -> list:
    """Sort key that orders "cabinet 2" before "cabinet 10" (digits compared as numbers)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


# --------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TextGameConfig:
    """Size of the generated rooms, the task mix, the episode limit and the task splits."""

    n_receptacles: int = 5
    """Storage receptacles per room (cabinets, shelves, ...); fridge 1, microwave 1 and sinkbasin 1 come on top."""
    n_objects: int = 2
    """Instances of the goal's object type per room (at least 2 when pick_two_obj is among the task types)."""
    n_distractors: int = 3
    """Objects of other types per room, placed at random: present but irrelevant to the goal."""
    task_types: tuple[str, ...] = TASK_TYPES
    """Task types drawn uniformly per task; any non-empty subset of TASK_TYPES."""
    max_steps: int = 50
    """Steps per episode (ALFWorld's env.max_steps); reaching it ends the episode with reward 0."""
    seed: int = 0
    """Seed of the task stream; the same seed gives the same tasks in the same order."""
    n_train_tasks: int = 1000
    """Size of the train split."""
    n_heldout_tasks: int = 200
    """Size of the held-out split (layouts never seen in train)."""

    def __post_init__(self):
        if isinstance(self.task_types, (list, str)):  # YAML gives lists; a bare string is one type
            object.__setattr__(
                self, "task_types", (self.task_types,) if isinstance(self.task_types, str) else tuple(self.task_types)
            )
        for name, low in (
            ("n_receptacles", 1),
            ("n_objects", 1),
            ("n_distractors", 0),
            ("max_steps", 1),
            ("n_train_tasks", 0),
            ("n_heldout_tasks", 0),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"TextGameConfig.{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"TextGameConfig.seed must be an integer, got {self.seed!r}")
        if not isinstance(self.task_types, tuple) or not self.task_types:
            raise ValueError(
                f"TextGameConfig.task_types must be a non-empty tuple of {TASK_TYPES}, got {self.task_types!r}"
            )
        for task_type in self.task_types:
            if task_type not in TASK_TYPES:
                raise ValueError(
                    f"TextGameConfig.task_types: unknown task type {task_type!r}; known: {', '.join(TASK_TYPES)}"
                )
        if len(set(self.task_types)) != len(self.task_types):
            raise ValueError(f"TextGameConfig.task_types has duplicates: {self.task_types!r}")
        if _T in self.task_types and self.n_objects < 2:
            raise ValueError(
                f"TextGameConfig.n_objects must be >= 2 when pick_two_obj is a task type, got {self.n_objects}"
            )


# --------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class TextGameTask:
    """One generated game: the room's initial state and the goal. Self-contained and hashable."""

    task_id: str
    """"textgame-<split>-<index>-<digest>"; the digest is of the content, the index the position in its split."""
    task_type: str
    """One of TASK_TYPES."""
    goal: str
    """The goal sentence shown after "Your task is to: "."""
    object_type: str
    """Type of the goal object ("mug")."""
    receptacle_type: str
    """Type of the target receptacle ("countertop"); "" for look_at_obj_in_light."""
    receptacles: tuple[str, ...]
    """Every receptacle in the room, in natural order."""
    placement: tuple[tuple[str, str], ...]
    """(object, receptacle) for every movable object, in natural order of the object."""
    lamp: str
    """The receptacle the desk lamp stands on."""


def _sample_layout(rng: random.Random, config: TextGameConfig) -> dict:
    """Draw one room and goal (everything but the task id)."""
    task_type = rng.choice(config.task_types)
    object_type = rng.choice(sorted(t for t, kinds in OBJECT_TYPES.items() if task_type in kinds))
    kinds = [rng.choice(LAMP_HOLDERS)] + [rng.choice(STORAGE_TYPES) for _ in range(config.n_receptacles - 1)]
    counts: dict[str, int] = {}
    storage = []
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
        storage.append(f"{kind} {counts[kind]}")
    lamp = storage[0]
    receptacles = tuple(sorted(storage + list(APPLIANCES), key=natural_key))
    receptacle_type = "" if task_type == _L else rng.choice(sorted(set(kinds)))
    # Goal objects never start in a receptacle of the target type, so no goal holds at the start.
    allowed = [r for r in receptacles if _kind(r) != receptacle_type]
    placement = [(f"{object_type} {i + 1}", rng.choice(allowed)) for i in range(config.n_objects)]
    others = sorted(t for t in OBJECT_TYPES if t != object_type)
    counts = {}
    for _ in range(config.n_distractors):
        kind = rng.choice(others)
        counts[kind] = counts.get(kind, 0) + 1
        placement.append((f"{kind} {counts[kind]}", rng.choice(receptacles)))
    return dict(
        task_type=task_type,
        goal=_GOAL_TEMPLATE[task_type].format(o=object_type, r=receptacle_type),
        object_type=object_type,
        receptacle_type=receptacle_type,
        receptacles=receptacles,
        placement=tuple(sorted(placement, key=lambda pair: natural_key(pair[0]))),
        lamp=lamp,
    )


def _digest(layout: dict) -> str:
    """Content digest of a layout (stable across Python runs; no hash randomisation)."""
    text = repr(sorted(layout.items()))
    return hashlib.sha256(text.encode()).hexdigest()


class TextGameTasks:
    """Deterministic train and held-out task lists for one config (see the module docstring on splits)."""

    SPLITS = ("train", "heldout")

    def __init__(self, config: TextGameConfig | None = None):
        self.config = config or TextGameConfig()
        self._lists: dict[str, list[TextGameTask]] | None = None

    def _generate(self) -> dict[str, list[TextGameTask]]:
        config = self.config
        rng = random.Random(config.seed)
        wanted = {"train": config.n_train_tasks, "heldout": config.n_heldout_tasks}
        lists: dict[str, list[TextGameTask]] = {"train": [], "heldout": []}
        seen: set[str] = set()
        misses = 0
        while any(len(lists[s]) < wanted[s] for s in self.SPLITS):
            layout = _sample_layout(rng, config)
            digest = _digest(layout)
            split = "heldout" if int(digest[:12], 16) % _HELDOUT_BUCKETS == 0 else "train"
            if digest in seen or len(lists[split]) >= wanted[split]:
                misses += 1
                if misses > 20_000:
                    raise ValueError(
                        f"TextGameConfig admits too few distinct tasks: after {misses} draws without a new one, "
                        f"train has {len(lists['train'])}/{wanted['train']} and heldout "
                        f"{len(lists['heldout'])}/{wanted['heldout']}; raise n_receptacles, n_objects, "
                        f"n_distractors or the task types, or ask for fewer tasks"
                    )
                continue
            misses = 0
            seen.add(digest)
            index = len(lists[split])
            lists[split].append(TextGameTask(task_id=f"textgame-{split}-{index:05d}-{digest[:8]}", **layout))
        return lists

    def tasks(self, split: str, n: int | None = None) -> list[TextGameTask]:
        """The first `n` tasks of `split` ("train" or "heldout"); all of them when `n` is None."""
        if split not in self.SPLITS:
            raise ValueError(f"split must be one of {self.SPLITS}, got {split!r}")
        if self._lists is None:
            self._lists = self._generate()
        tasks = self._lists[split]
        if n is None:
            return list(tasks)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(tasks):
            raise ValueError(
                f"n must be an integer in [0, {len(tasks)}] for split {split!r} "
                f"(n_{split}_tasks={len(tasks)}), got {n!r}"
            )
        return tasks[:n]
