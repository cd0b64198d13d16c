"""A played episode as the trainer needs it: one flat token sequence with per-token bookkeeping.

A multi-turn episode is laid out as one sequence: the first observation (prompt), then for each turn the policy's
action tokens and the environment's observation tokens. Per token we keep what the update needs and what the
paper's diagnostics need: the loss mask (1 only on tokens the policy sampled), the rollout engine's log-prob of
that token, the policy version that sampled it (for staleness and lagged modes), and the turn it belongs to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainer.environments.protocol import Environment, EpisodeStartError
from trainer.rl.trajectory import Trajectory, Turn
from trainer.rollout.env_pool import SEQUENTIAL, EnvPool

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
        return Trajectory(
            task_id=self.task_id,
            reward=self.reward,
            turns=list(self.turns),
            length=self.length,
            final_state=self.observations[-1] if self.observations else "",
            group_id=self.group_id,
            policy_version=self.oldest_version,
            baseline=self.baseline,
        )


def skip_if_prompt_too_long(episode: Episode, prompt: list[int], max_episode_tokens: int) -> bool:
    """Mark `episode` skipped (`extra["skipped"]`, truncated, no tokens, reward 0) when its prompt leaves no room
    for one action token within the episode budget; True then. The driver leaves such episodes out of the batch
    and says so; an evaluation counts them as failures. A per-task skip rather than a cut history: the first
    observation is the task (R2E-Gym's issue), and a cut one is another task."""
    if len(prompt) + 1 <= max_episode_tokens:
        return False
    episode.truncated = True
    episode.extra["skipped"] = (
        f"its {len(prompt)}-token prompt leaves no room for an action within max_episode_tokens={max_episode_tokens}"
    )
    return True


def start_episode(env, task) -> str | EpisodeStartError:
    """`env.reset(task)`, or the EpisodeStartError that says why the episode could not start (the engines mark
    such an episode with `mark_failed` and go on with the others)."""
    try:
        return env.reset(task)
    except EpisodeStartError as exc:
        return exc


def mark_failed(episode: Episode, why: str) -> None:
    """Leave `episode` out of the batch for a reason outside the policy (`extra["failed"]`, and `skipped` as a
    prompt that does not fit is): the driver counts these, and stops the cell past `rollout.max_failed_share`."""
    episode.truncated = True
    episode.extra["failed"] = episode.extra["skipped"] = why


def record_grading(episode: Episode, env) -> None:
    """Copy what grading saw (`env.last_grading`) onto the ended episode; a grading that failed fails the
    episode."""
    grading = getattr(env, "last_grading", None)
    if grading is None:
        return
    episode.extra["grading"] = grading
    if grading.get("failed"):
        mark_failed(episode, grading["failed"])


def _truncated_reward(env, task_id: str) -> float:
    """The reward of an episode cut at the token budget: the environment's `truncated_reward()`, else 0."""
    grade = getattr(env, "truncated_reward", None)
    if grade is None:
        return 0.0
    reward = float(grade())
    if not math.isfinite(reward):
        raise ValueError(f"environment returned a non-finite reward {reward!r} (task {task_id!r})")
    return reward


@dataclass
class ActionEnd:
    """One episode's finished action, as `end_actions` takes it (the arguments of `end_action`)."""

    episode: Episode
    env: Environment
    action: list[int]
    logps: list[float]
    state: str
    """The observation the action was taken in."""
    version: int
    turn: int
    execute: bool
    """False: the episode budget ran out mid-action; the action is recorded, not run."""
    stopped: bool
    """The action ended with a stop token."""


def end_actions(
    ends: list[ActionEnd], *, fmt, max_episode_tokens: int, pool: EnvPool = SEQUENTIAL
) -> list[list[int] | None]:
    """Record finished actions and run them: the end-of-turn rules every rollout engine shares, for the actions
    that ended in one decode step (HF) or one generate call (vLLM).

    The action tokens go in with loss mask 1. Not executed (the episode budget ran out mid-action): the turn is
    recorded and the episode ends truncated. Executed: the turn gets the environment's flags; if the environment
    says done the reward is recorded; otherwise the observation's tokens are appended, unless they would leave no
    room for one more token (then the text is kept, and the episode ends truncated). A truncated episode's reward
    is the environment's `truncated_reward()` where it has one (swe grades the repository as it stands, as
    R2E-Gym grades every trajectory), else 0. Returns, per action, the appended observation ids when its episode
    goes on, None when it ended.

    The environment calls (steps, then gradings) go through `pool`, side by side; everything else happens here,
    in the order of `ends`, so the episodes do not depend on the pool's width.
    """
    starts, texts = [], []
    for e in ends:  # record the actions
        starts.append(e.episode.length)
        e.episode.append(e.action, policy=True, logps=e.logps, version=e.version, turn=e.turn)
        texts.append(fmt.decode_action(e.action))
        e.episode.actions.append(texts[-1])
    # the environments: run the executed actions, grade the episodes cut mid-action
    answers = pool.map(
        lambda k: (
            ends[k].env.step(texts[k]) if ends[k].execute else _truncated_reward(ends[k].env, ends[k].episode.task_id)
        ),
        range(len(ends)),
    )
    out: list[list[int] | None] = [None] * len(ends)
    cut = []
    for k, (e, start, answer) in enumerate(zip(ends, starts, answers)):  # record the results
        episode = e.episode
        if not e.execute:
            episode.turns.append(Turn(start=start, end=episode.length, state=e.state))
            episode.truncated, episode.reward = True, answer
            record_grading(episode, e.env)
            continue
        info = answer.info
        episode.turns.append(
            Turn(
                start=start,
                end=episode.length,
                state=e.state,
                invalid_action=bool(info.invalid_action),
                exec_error=bool(info.exec_error or info.timed_out),
            )
        )
        episode.observations.append(answer.observation)
        if answer.done:
            reward = float(answer.reward)
            if not math.isfinite(reward):
                raise ValueError(
                    f"environment returned a non-finite reward {answer.reward!r} (task {episode.task_id!r})"
                )
            episode.done, episode.reward = True, reward
            record_grading(episode, e.env)
            continue
        obs = [int(t) for t in fmt.observation_ids(answer.observation, last_token=e.action[-1] if e.stopped else None)]
        if episode.length + len(obs) + 1 > max_episode_tokens:
            cut.append(k)
            continue
        episode.append(obs, policy=False)
        out[k] = obs
    # the environments again: grade the episodes whose observation did not fit
    rewards = pool.map(lambda k: _truncated_reward(ends[k].env, ends[k].episode.task_id), cut)
    for k, reward in zip(cut, rewards):
        ends[k].episode.truncated, ends[k].episode.reward = True, reward
        record_grading(ends[k].episode, ends[k].env)
    return out


def end_action(
    episode: Episode,
    action: list[int],
    logps: list[float],
    *,
    fmt,
    env,
    state: str,
    version: int,
    turn: int,
    execute: bool,
    stopped: bool,
    max_episode_tokens: int,
) -> list[int] | None:
    """`end_actions` for one episode."""
    return end_actions(
        [ActionEnd(episode, env, action, logps, state, version, turn, execute, stopped)],
        fmt=fmt,
        max_episode_tokens=max_episode_tokens,
    )[0]
