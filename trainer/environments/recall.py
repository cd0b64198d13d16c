"""Recall: a two-turn memory game that a working RL trainer learns from scratch in a few dozen updates.

Why it exists: a learning sanity check, CleanRL's practice. Bit-identical reruns prove determinism, not that the
trainer learns: a flipped advantage sign, a loss mask on the wrong tokens or a broken aggregation reruns bit for
bit too. `tests/integration/test_learning_sanity.py` trains a freshly initialised tiny model here with every advantage
estimator and both optimizers and requires success to climb from under 30% to over 90%, which such a bug stops.

The game. The first observation shows a key (`key b`); any one-line action passes turn 1 (there is nothing to do
yet). The second observation is the door (`door`), and the action there is the answer: the episode ends with reward
1.0 (`open`) iff the action, stripped of surrounding whitespace, is exactly the key, else 0.0 (`locked`). With
`max_turns` > 2 a wrong answer gets `locked` and the door again until the turn limit. Flags, as in the other
families: an empty or multi-line action at turn 1, or anything but one word at the door, is `invalid_action` (the
episode goes on at turn 1; at the door it counts as a wrong answer); a wrong one-word answer is a plain failure.

Vocabulary: `vocabulary(config)`, the words `key door open locked ok` and the keys (single letters `a`, `b`, ...).
How a fresh model starts depends on its tokenizer, and that decides how the check is set up (measured with
`rollout.max_turn_tokens: 1`, so an answer is one sampled token):
- the trainer's own tiny tokenizer (byte-level BPE on `sample_texts`) always holds the 256-byte alphabet, so a
  fresh, near-uniform model says a given key (`a` or ` a`) with p ~ 0.7%. With n_keys=2 and 64 episodes per
  update it found its first successes after ~10 updates, then collapsed onto the key it found first: GRPO, GiGPO
  and GraphGPO sat at exactly 50% for 80 updates (all-equal groups give no signal), SPO wobbled at 60-80%;
- a word-level tokenizer over `vocabulary()` (13 tokens at n_keys=2, `[UNK]` and the 5 special ones included)
  gives each key p ~ 1/13, a start of 6-18% success, and every key is explored from the first batch. That is
  what tests/integration/test_learning_sanity.py builds.

Tasks: a task is (index, key); the keys of each split are a seeded shuffle of the key set repeated, so every key is
equally frequent. The key space is tiny by design, so the splits are disjoint by task id, not by content: the
held-out split measures the same skill on tasks the sampler never drew.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

from trainer.environments.protocol import StepInfo, StepResult

KEY_OBSERVATION, DOOR, OPEN, LOCKED = "key {key}", "door", "open", "locked"
FIRST_ACTION = "ok"
"""What the scripted expert says at turn 1 (any one-line action is accepted there)."""
KEYS = tuple("abcdefghij")
"""Single letters: a letter never merges with a digit or another word in the tokenizer, and a one-token action
(`a` or ` a`) can be a key."""
MAX_KEYS = len(KEYS)


@dataclass(frozen=True)
class RecallConfig:
    """Size of the key set, the turn limit and the task splits; validated on construction."""

    n_keys: int = 2
    """Distinct keys, the letters `a`, `b`, ... (1..10). One key is a bandit (no recall needed); two or more need
    recall."""
    max_turns: int = 2
    """Steps per episode (>= 2): turn 1 sees the key, turns 2.. are at the door; reaching it without the key
    ends the episode with reward 0."""
    seed: int = 0
    """Seed of the task lists: the same seed gives the same tasks in the same order."""
    n_train_tasks: int = 16
    """Size of the train split (task ids `recall-train-*`)."""
    n_heldout_tasks: int = 16
    """Size of the held-out split (task ids `recall-heldout-*`)."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"RecallConfig.{f.name} must be an integer, got {value!r}")
        for name, low, high in (
            ("n_keys", 1, MAX_KEYS),
            ("max_turns", 2, None),
            ("n_train_tasks", 0, None),
            ("n_heldout_tasks", 0, None),
        ):
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"RecallConfig.{name} must be an integer {bound}, got {value!r}")

    @property
    def keys(self) -> tuple[str, ...]:
        return KEYS[: self.n_keys]


@dataclass(frozen=True)
class RecallTask:
    task_id: str
    """"recall-<split>-<index>"."""
    key: str
    """The answer the door wants."""


class RecallTasks:
    """Deterministic train and held-out task lists (the `TaskSource` protocol)."""

    SPLITS = ("train", "heldout")

    def __init__(self, config: RecallConfig | None = None):
        self.config = config or RecallConfig()
        self._lists = {split: self._generate(split) for split in self.SPLITS}

    def _generate(self, split: str) -> list[RecallTask]:
        config = self.config
        n = config.n_train_tasks if split == "train" else config.n_heldout_tasks
        rng = random.Random(f"recall-{config.seed}-{split}")  # str seeds hash stably (not PYTHONHASHSEED)
        keys: list[str] = []
        while len(keys) < n:
            block = list(config.keys)
            rng.shuffle(block)
            keys += block
        return [RecallTask(task_id=f"recall-{split}-{i:05d}", key=key) for i, key in enumerate(keys[:n])]

    def tasks(self, split: str, n: int | None = None) -> list[RecallTask]:
        """The first `n` tasks of `split` ("train" or "heldout"); all of them when `n` is None."""
        if split not in self.SPLITS:
            raise ValueError(f"split must be one of {self.SPLITS}, got {split!r}")
        tasks = self._lists[split]
        if n is None:
            return list(tasks)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(tasks):
            raise ValueError(f"n must be an integer in [0, {len(tasks)}] for split {split!r}, got {n!r}")
        return tasks[:n]


class RecallEnv:
    """One episode of the recall game at a time (the `Environment` protocol)."""

    def __init__(self, config: RecallConfig | None = None):
        self.config = config or RecallConfig()
        self.max_turns = self.config.max_turns
        self.task: RecallTask | None = None
        self.steps = 0
        self.done = False

    def reset(self, task: RecallTask) -> str:
        if not isinstance(task, RecallTask):
            raise TypeError(f"RecallEnv.reset needs a RecallTask, got {type(task).__name__}")
        self.task, self.steps, self.done = task, 0, False
        return KEY_OBSERVATION.format(key=task.key)

    def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("RecallEnv.step called before reset(task)")
        if self.done:
            raise RuntimeError(f"RecallEnv.step called after the episode ended (task {self.task.task_id})")
        if not isinstance(action, str):
            raise TypeError(f"RecallEnv.step needs the action as str, got {type(action).__name__}")
        text = action.strip()
        self.steps += 1
        if self.steps == 1:  # anything one-line will do; the key is what matters
            invalid = not text or "\n" in text
            return StepResult(
                DOOR, False, 0.0, StepInfo(tool="" if invalid else "say", invalid_action=invalid, extra={"steps": 1})
            )
        invalid = len(text.split()) != 1
        won = not invalid and text == self.task.key
        truncated = not won and self.steps >= self.max_turns
        self.done = won or truncated
        observation = OPEN if won else LOCKED if self.done else f"{LOCKED}\n{DOOR}"
        return StepResult(
            observation,
            self.done,
            1.0 if won else 0.0,
            StepInfo(
                tool="" if invalid else "answer",
                invalid_action=invalid,
                extra={"won": won, "truncated": truncated, "steps": self.steps},
            ),
        )

    def close(self) -> None:
        self.task = None


def expert_action(env: RecallEnv, rng: random.Random, noise: float = 0.0) -> str:
    """The right action for the running episode; with probability `noise` a uniformly random key instead."""
    if env.task is None or env.done:
        raise RuntimeError("expert_action needs an env with a running episode")
    if env.steps == 0:
        return FIRST_ACTION
    return rng.choice(env.config.keys) if noise > 0 and rng.random() < noise else env.task.key


def vocabulary(config: RecallConfig | None = None) -> tuple[str, ...]:
    """Every word of the game under `config`: the observations' words, the expert's first action and the keys."""
    config = config or RecallConfig()
    return ("key", DOOR, OPEN, LOCKED, FIRST_ACTION, *config.keys)


def sample_texts(config: RecallConfig | None = None, n: int = 200, noise: float = 0.3, seed: int = 0) -> list[str]:
    """Transcripts of `n` expert episodes on train tasks (cycled), observations and `> action` lines: the corpus
    a tiny model's tokenizer is built from. Deterministic."""
    config = config or RecallConfig()
    tasks = RecallTasks(config).tasks("train") or RecallTasks(
        RecallConfig(n_keys=config.n_keys, n_train_tasks=config.n_keys)
    ).tasks("train")
    rng, env, texts = random.Random(seed), RecallEnv(config), []
    for i in range(n):
        lines = [env.reset(tasks[i % len(tasks)])]
        while not env.done:
            action = expert_action(env, rng, noise)
            lines += [f"> {action}", env.step(action).observation]
        texts.append("\n".join(lines))
    return texts
