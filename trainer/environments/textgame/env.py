"""TextGameEnv: one episode of the household game behind the harness's Environment protocol.

It holds the episode's world state and step count and applies the rules of `world`; every observation is the
feedback sentence and the admissible list, the first one with the room and the goal.
"""

from __future__ import annotations

from trainer.environments.protocol import StepInfo, StepResult
from trainer.environments.textgame.tasks import TextGameConfig, TextGameTask
from trainer.environments.textgame.world import (
    NOTHING,
    WorldState,
    _execute,
    _initial_world,
    admissible_commands,
    format_observation,
    goal_reached,
    normalize_action,
    parse_command,
)


class TextGameEnv:
    """One episode of the household game at a time (the `Environment` protocol)."""

    def __init__(self, config: TextGameConfig | None = None):
        self.config = config or TextGameConfig()
        self.max_turns = self.config.max_steps
        self.task: TextGameTask | None = None
        self.state: WorldState | None = None
        self.steps = 0
        self.done = False

    def reset(self, task: TextGameTask) -> str:
        """Start `task`; returns the room, the goal and the admissible commands."""
        if not isinstance(task, TextGameTask):
            raise TypeError(f"TextGameEnv.reset needs a TextGameTask, got {type(task).__name__}")
        self.task, self.state = task, _initial_world(task)
        self.steps, self.done = 0, False
        room = _execute(self.state, "look", {})
        return format_observation(f"{room}\nYour task is to: {task.goal}", self.admissible_actions())

    def admissible_actions(self) -> tuple[str, ...]:
        """The commands that do something now (the list shown in the last observation)."""
        if self.state is None:
            raise RuntimeError("TextGameEnv: call reset(task) first")
        return admissible_commands(self.task, self.state)

    def step(self, action: str) -> StepResult:
        """Execute one command; "Nothing happens." (invalid_action) for anything inadmissible."""
        if self.state is None:
            raise RuntimeError("TextGameEnv.step called before reset(task)")
        if self.done:
            raise RuntimeError(f"TextGameEnv.step called after the episode ended (task {self.task.task_id})")
        if not isinstance(action, str):
            raise TypeError(f"TextGameEnv.step needs the action as str, got {type(action).__name__}")
        command = normalize_action(action)
        verb, args = parse_command(command)
        invalid = command not in self.admissible_actions()
        feedback = NOTHING if invalid else _execute(self.state, verb, args)
        self.steps += 1
        won = goal_reached(self.task, self.state)
        truncated = not won and self.steps >= self.max_turns
        self.done = won or truncated
        info = StepInfo(
            tool=verb, invalid_action=invalid, extra={"won": won, "truncated": truncated, "steps": self.steps}
        )
        return StepResult(
            observation=format_observation(feedback, self.admissible_actions()),
            done=self.done,
            reward=1.0 if won else 0.0,
            info=info,
        )

    def close(self) -> None:
        """Nothing to release; kept for the protocol."""
        self.task, self.state = None, None
