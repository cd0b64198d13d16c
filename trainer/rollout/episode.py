"""A played episode as the trainer needs it: one flat token sequence with per-token bookkeeping.

A multi-turn episode is laid out as one sequence: the first observation (prompt), then for each turn the policy's
action tokens and the environment's observation tokens. Per token we keep what the update needs and what the
paper's diagnostics need: the loss mask (1 only on tokens the policy sampled), the rollout engine's log-prob of
that token, the policy version that sampled it (for staleness and lagged modes), and the turn it belongs to.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainer.rl.trajectory import Trajectory, Turn

ENV_TOKEN = -1
"""`versions` / `turn_index` value for tokens the policy did not generate (prompt and observations)."""


@dataclass
class Episode:
    task_id: str
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logp: list[float] = field(default_factory=list)
    """Log-prob of each sampled token under the rollout policy (with the sampling temperature); 0 elsewhere."""
    versions: list[int] = field(default_factory=list)
    """Policy version that sampled each token; ENV_TOKEN for prompt and observation tokens."""
    turn_index: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    """observations[k] is the text the k-th action was taken in; observations[-1] follows the last action."""
    actions: list[str] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    """The environment ended the episode (submit / goal / its turn limit), as opposed to a token budget."""
    truncated: bool = False
    """Stopped by a token budget (context or per-episode limit) before the environment said done."""
    group_id: str | None = None
    baseline: float | None = None
    dispatch_version: int = 0
    """Policy version when the episode was handed out (its first token's version)."""
    extra: dict = field(default_factory=dict)

    def append(self, token_ids, *, policy: bool, logps=None, version: int = ENV_TOKEN, turn: int = ENV_TOKEN):
        n = len(token_ids)
        self.tokens.extend(int(t) for t in token_ids)
        self.loss_mask.extend([1 if policy else 0] * n)
        self.rollout_logp.extend([float(x) for x in logps] if logps is not None else [0.0] * n)
        self.versions.extend([version if policy else ENV_TOKEN] * n)
        self.turn_index.extend([turn] * n)

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int:
        policy_versions = [v for v in self.versions if v != ENV_TOKEN]
        return min(policy_versions) if policy_versions else self.dispatch_version

    def trajectory(self) -> Trajectory:
        """The record the advantage estimators read."""
        return Trajectory(task_id=self.task_id, reward=self.reward, turns=list(self.turns), length=self.length,
                          final_state=self.observations[-1] if self.observations else "",
                          group_id=self.group_id, policy_version=self.oldest_version, baseline=self.baseline)


def _truncated_reward(env, task_id: str) -> float:
    """The reward of an episode cut at the token budget: the environment's `truncated_reward()`, else 0."""
    grade = getattr(env, "truncated_reward", None)
    if grade is None:
        return 0.0
    reward = float(grade())
    if not math.isfinite(reward):
        raise ValueError(f"environment returned a non-finite reward {reward!r} (task {task_id!r})")
    return reward


def end_action(episode: Episode, action: list[int], logps: list[float], *, fmt, env, state: str, version: int,
               turn: int, execute: bool, stopped: bool, max_episode_tokens: int) -> list[int] | None:
    """Record a finished action and, if `execute`, run it: the end-of-turn rules every rollout engine shares.

    The action tokens go in with loss mask 1. Not executed (the episode budget ran out mid-action): the turn is
    recorded and the episode ends truncated. Executed: the turn gets the environment's flags; if the environment
    says done the reward is recorded; otherwise the observation's tokens are appended, unless they would leave no
    room for one more token (then the text is kept, and the episode ends truncated). A truncated episode's reward
    is the environment's `truncated_reward()` where it has one (swe grades the repository as it stands, as
    R2E-Gym grades every trajectory), else 0. Returns the
    appended observation ids when the episode goes on, None when it ended.
    """
    start = episode.length
    episode.append(action, policy=True, logps=logps, version=version, turn=turn)
    action_text = fmt.decode_action(action)
    episode.actions.append(action_text)
    if not execute:
        episode.turns.append(Turn(start=start, end=episode.length, state=state))
        episode.truncated, episode.reward = True, _truncated_reward(env, episode.task_id)
        return None
    result = env.step(action_text)
    info = result.info
    episode.turns.append(Turn(start=start, end=episode.length, state=state, invalid_action=bool(info.invalid_action),
                              exec_error=bool(info.exec_error or info.timed_out)))
    episode.observations.append(result.observation)
    if result.done:
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"environment returned a non-finite reward {result.reward!r} (task {episode.task_id!r})")
        episode.done, episode.reward = True, reward
        return None
    obs = [int(t) for t in fmt.observation_ids(result.observation, last_token=action[-1] if stopped else None)]
    if episode.length + len(obs) + 1 > max_episode_tokens:
        episode.truncated, episode.reward = True, _truncated_reward(env, episode.task_id)
        return None
    episode.append(obs, policy=False)
    return obs
