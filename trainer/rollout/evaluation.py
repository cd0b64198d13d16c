"""Playing a fixed list of tasks with a policy: the one evaluation the trainer, the warm start and `eval` share.

The trainer's held-out success (`eval_success`), the warm start's band check and `python -m trainer eval` all call
`evaluate`, so the same policy, tasks, sampling and generator give the same number wherever it is measured. What the
result depends on, and so what a caller must match to reproduce one:

* **The tasks, in order, in one engine batch** (`play_tasks` with `chunk=None`). The engine draws one token per live
  episode per step from one generator, so how the tasks are split into batches decides which draw each episode gets.
* **The generator.** The trainer's evaluation after `update` updates of a run seeded `seed` draws from
  `eval_generator(seed, update)`: a stream of its own for every evaluation, independent of the training rollouts'
  generators and of the evaluations before it, so a resumed run evaluates exactly as the uninterrupted one. The
  warm start seeds its evaluations with its own `seed` (its reports are compared across runs as they are).
* **The sampling** (`SamplingParams.for_evaluation`: `rollout.eval_temperature`, greedy by default) and the
  model's weights, dtype and device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trainer.rollout.env_pool import EnvPool, close_envs
from trainer.rollout.episode import Episode
from trainer.rollout.sampling import SamplingParams

EVAL_SEED_STRIDE = 1_000_003
"""A prime above any update count, so (seed, update) pairs of different runs never share an evaluation stream."""


def eval_generator(seed: int, update: int) -> torch.Generator:
    """The generator of a run's evaluation after `update` updates (run seed `seed`)."""
    return torch.Generator().manual_seed(seed * EVAL_SEED_STRIDE + update)


def play_tasks(
    model,
    fmt,
    make_env: Callable,
    tasks: Sequence,
    sampling: SamplingParams,
    generator: torch.Generator,
    *,
    policy_version: int = 0,
    chunk: int | None = None,
    device: str | torch.device = "cpu",
    env_workers: int = 1,
) -> list[Episode]:
    """One episode per task with `model`, `chunk` tasks per engine batch (None: all in one), in task order.

    Environments are made by `make_env()`, called `env_workers` side by side (`EnvPool`; the same episodes for
    every width) and closed here. The model is played in eval mode and left in the mode it had (its weights are not
    touched). `policy_version` is only recorded on the episodes."""
    from trainer.rollout.hf_engine import HFEngine

    tasks = list(tasks)
    step = chunk if chunk is not None else max(len(tasks), 1)
    was_training = model.training
    engine = HFEngine(model, fmt, device=device)
    episodes: list[Episode] = []
    try:
        with EnvPool(env_workers) as pool:
            for start in range(0, len(tasks), step):
                part = tasks[start : start + step]
                envs = [make_env() for _ in part]
                try:
                    with torch.no_grad():
                        episodes += engine.play(
                            envs,
                            part,
                            sampling=sampling,
                            policy_version=policy_version,
                            generator=generator,
                            task_ids=[t.task_id for t in part],
                            pool=pool,
                        )
                finally:
                    close_envs(envs, pool)
    finally:
        model.train(was_training)
    return episodes


def success_rate(episodes: Sequence[Episode]) -> float:
    """Share of episodes with reward > 0.5 (the environments' rewards are 0 or 1); NaN for none."""
    return sum(e.reward > 0.5 for e in episodes) / len(episodes) if episodes else float("nan")


def evaluate(
    model,
    fmt,
    make_env: Callable,
    tasks: Sequence,
    sampling: SamplingParams,
    generator: torch.Generator,
    *,
    policy_version: int = 0,
    device: str | torch.device = "cpu",
    env_workers: int = 1,
) -> tuple[float, list[Episode]]:
    """Success rate of `model` on `tasks` (all played in one batch) and the episodes (`env_workers`: as in
    `play_tasks`)."""
    episodes = play_tasks(
        model,
        fmt,
        make_env,
        tasks,
        sampling,
        generator,
        policy_version=policy_version,
        device=device,
        env_workers=env_workers,
    )
    return success_rate(episodes), episodes


def transcript(episode: Episode) -> str:
    """The episode as text: a header line, then each observation and the action taken in it."""
    lines = [f"# {episode.task_id} reward={episode.reward} truncated={episode.truncated}"]
    for k, action in enumerate(episode.actions):
        lines += [f"<obs> {episode.observations[k]}", f"<act> {action}"]
    if len(episode.observations) > len(episode.actions):
        lines.append(f"<obs> {episode.observations[-1]}")
    return "\n".join(lines)
