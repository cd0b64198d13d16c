"""The one interface every environment speaks: text in, text out, a sparse reward at the end.

Environments know nothing of models or tokens. The rollout driver calls `reset(task)` for the first
observation, then `step(action_text)` once per assistant turn until `done`. The flags in `StepInfo` feed the
paper's tool-error penalty and the logs; `reward` is 0 until the episode ends, then 1 for success, else 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class StepInfo:
    """What happened when an action was executed."""

    tool: str = ""
    """Name of the tool the action invoked ("" when it could not be parsed)."""
    invalid_action: bool = False
    """Unparseable, unknown tool, missing argument, or not admissible here."""
    exec_error: bool = False
    """Parsed and admissible, but the execution failed (an error, a non-zero exit where that counts)."""
    timed_out: bool = False
    """The execution hit its wall-clock limit (also counts as an execution error)."""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool
    reward: float
    """0.0 before the end; at the end 1.0 for success, else 0.0."""
    info: StepInfo


class EpisodeStartError(RuntimeError):
    """An episode could not start for a reason that is not the policy's (its container, image or task): the rollout
    leaves that one episode out with the reason (`rollout.episode.start_episode`) instead of failing the batch."""


@runtime_checkable
class Environment(Protocol):
    """One episode at a time; create one instance per concurrent episode."""

    max_turns: int

    def reset(self, task) -> str:
        """Start an episode on `task`; returns the first observation (the instruction). EpisodeStartError when it
        cannot start for a reason outside the policy."""

    def step(self, action: str) -> StepResult:
        """Execute one assistant action. Calling after `done` is an error."""

    def close(self) -> None:
        """Release what the episode holds (containers, temporary directories)."""

    # Optional: `truncated_reward() -> float`, the reward of an episode the rollout engine cut at its token budget
    # (the environment never said done). An environment without it gives such an episode 0.0.
    # Optional: `last_grading: dict | None`, what grading saw at the episode's end (swe: readings, tamper flags);
    # with a "failed" key the episode's grading itself failed, and the rollout leaves it out like a failed start.


@runtime_checkable
class TaskSource(Protocol):
    """Deterministic task lists: the same seed gives the same tasks, and the splits never overlap."""

    def tasks(self, split: str, n: int | None = None) -> Sequence:
        """Tasks of `split` ("train" or "heldout"), the first `n` of them (all when None); each has a `task_id`."""
