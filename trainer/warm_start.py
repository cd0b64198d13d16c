"""Supervised warm start: the embedded study's base policy, cloned from a noisy scripted expert.

The papers start RL from instruction-tuned models that already solve about a fifth to a third of their tasks
(SPO+Adam ends near 18-27% on the main paper's models). A randomly initialised tiny model solves nothing, so RL
from it would measure exploration, not the optimizer. We therefore train it by behaviour cloning on the
expert's episodes *with noise* (wrong files, wrong edits, untested submits), evaluate success on held-out tasks
every few steps, sampling at the RL rollouts' temperature (so the band is the cells' starting training success),
and keep the first model whose success lies in the configured band (default 20-35%).

Demonstrations are tokenised exactly as the rollout engine lays out episodes (same chat format, loss on the
action tokens and their end-of-turn token only), so the warm-started model and the RL rollouts agree on the
format. If no evaluation lands in the band within `max_steps`, the model closest to the band is saved and the
report says so; the workflow then fails loudly rather than train RL from a wrong starting point.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch

from trainer.config import OFFLINE_STATS_FILE, WarmStartConfig, config_to_dict
from trainer.environments.suite import make_suite
from trainer.optim.build import build_optimizer
from trainer.policy.load import DTYPES, new_tiny_policy, save_policy
from trainer.rl.spo import write_offline_stats
from trainer.rollout.episode import Episode
from trainer.rollout.evaluation import evaluate, play_tasks
from trainer.rollout.sampling import SamplingParams
from trainer.update import pad_episodes, token_logprobs


def demonstration_episode(demo, fmt, task_id: str) -> Episode:
    """Lay out an expert episode as the engine would: prompt, then per turn action(+stop) and observation."""
    e = Episode(task_id=task_id)
    e.append(fmt.prompt_ids(demo.first_observation), policy=False)
    for k, (action, result) in enumerate(demo.steps):
        ids = fmt.action_ids(action)
        e.append(ids, policy=True, logps=[0.0] * len(ids), version=0, turn=k)
        if not result.done:
            e.append(fmt.observation_ids(result.observation), policy=False)
    e.reward = demo.reward
    return e


def cloning_loss_backward(model, demos: list[Episode], pad_id: int, observation_loss_weight: float) -> torch.Tensor:
    """Back-propagate the behaviour-cloning loss of a batch of demonstrations (next-token loss weighted 1 on
    actions, `observation_loss_weight` on the rest, divided by the batch's total weight); returns the loss.
    One demonstration per forward/backward: without padding this is several times faster on CPU, and since the
    loss is a weighted sum over the batch divided once, the summed gradient is the padded batch's."""
    rows = [pad_episodes([d], pad_id) for d in demos]
    weights = [r.loss_mask + observation_loss_weight * (r.attention_mask[:, 1:].float() - r.loss_mask) for r in rows]
    total = torch.stack([w.sum() for w in weights]).sum().clamp(min=1)
    loss = torch.zeros(())
    for row, w in zip(rows, weights):
        part = -(token_logprobs(model, row) * w).sum() / total
        part.backward()
        loss = loss + part.detach()
    return loss


def offline_stats(model, fmt, suite, tasks, sampling, samples: int, seed: int) -> dict[str, tuple[int, int]]:
    """SPO's offline pass: {task_id: (samples, successes)} from playing each task `samples` times, 64 episodes per
    engine batch (deterministic in `seed`)."""
    tasks = [t for t in tasks for _ in range(samples)]
    episodes = play_tasks(model, fmt, suite.make_env, tasks, sampling, torch.Generator().manual_seed(seed), chunk=64)
    stats: dict[str, tuple[int, int]] = {}
    for e in episodes:
        n, s = stats.get(e.task_id, (0, 0))
        stats[e.task_id] = (n + 1, s + int(e.reward > 0.5))
    return stats


def warm_start(cfg: WarmStartConfig, out_dir: str | Path, progress: bool | None = None) -> dict:
    """Train, evaluate, save the base policy into `out_dir`; returns (and writes) the report."""
    from tqdm import tqdm

    out = Path(out_dir)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    suite = make_suite(cfg.env)
    if suite.demonstrate is None:
        raise ValueError(f"environment {cfg.env.name!r} has no scripted expert to warm-start from")
    model, fmt = new_tiny_policy(
        cfg.model.preset,
        suite.sample_texts(),
        vocab_size=cfg.vocab_size,
        seed=cfg.model.init_seed,
        max_positions=cfg.rollout.max_episode_tokens + 64,
    )
    model.to(DTYPES[cfg.model.dtype])

    rng = random.Random(cfg.seed)
    train_tasks = suite.tasks.tasks("train")
    pool = train_tasks[: cfg.env.train_tasks]  # the cells' RL pool (all of the split when train_tasks is None)
    demo_tasks = train_tasks[cfg.env.train_tasks :] if cfg.env.train_tasks is not None else train_tasks
    if not demo_tasks:
        raise ValueError(
            f"env.train_tasks={cfg.env.train_tasks} leaves no training task for demonstrations; "
            f"raise the family's training split size above it"
        )
    demos = []
    for i in range(cfg.n_demos):
        task = demo_tasks[i % len(demo_tasks)]
        e = demonstration_episode(suite.demonstrate(task, cfg.noise, rng), fmt, task.task_id)
        if e.length <= cfg.rollout.max_episode_tokens:
            demos.append(e)
    if not demos:
        raise ValueError(
            f"none of the {cfg.n_demos} demonstrations fits rollout.max_episode_tokens="
            f"{cfg.rollout.max_episode_tokens}: raise it, or make the environment's episodes shorter"
        )
    eval_tasks = suite.tasks.tasks("heldout", cfg.eval_tasks)
    if not eval_tasks:
        raise ValueError(f"eval_tasks={cfg.eval_tasks} gives no held-out task: the band is judged on held-out success")
    sampling = SamplingParams.for_rollouts(cfg.rollout)

    def heldout_success(tasks) -> float:
        """Held-out success, seeded with the warm start's seed at every evaluation, so that successive evaluations
        differ by the weights alone."""
        return evaluate(model, fmt, suite.make_env, tasks, sampling, torch.Generator().manual_seed(cfg.seed))[0]

    optimizer = build_optimizer(model, cfg.optim)
    gen = torch.Generator().manual_seed(cfg.seed)
    low, high = cfg.band
    history, best = [], None
    bar = tqdm(total=cfg.max_steps, disable=None if progress is None else not progress, desc="warm start")
    for step in range(1, cfg.max_steps + 1):
        idx = torch.randint(len(demos), (cfg.batch_size,), generator=gen).tolist()
        optimizer.zero_grad(set_to_none=True)
        loss = cloning_loss_backward(model, [demos[i] for i in idx], fmt.pad_id, cfg.observation_loss_weight)
        if cfg.optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        bar.update(1)
        if step % cfg.eval_every and step != cfg.max_steps:
            continue
        # a quarter of the tasks first: far below the band (early on, every episode runs to the turn limit) the
        # full evaluation would cost more than the training steps; the band is judged on all of them
        screen = heldout_success(eval_tasks[: max(len(eval_tasks) // 4, 1)])
        if screen < low / 2 and step != cfg.max_steps:
            history.append({"step": step, "loss": float(loss.detach()), "screen_success": screen})
            print(json.dumps(history[-1]), file=sys.stderr, flush=True)
            continue
        success = heldout_success(eval_tasks)
        history.append({"step": step, "loss": float(loss.detach()), "heldout_success": success})
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", success=f"{success:.2f}")
        print(json.dumps(history[-1]), file=sys.stderr, flush=True)
        distance = 0.0 if low <= success <= high else min(abs(success - low), abs(success - high))
        if best is None or distance < best[0]:
            best = (distance, step, success, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if distance == 0.0:
            break
    bar.close()
    _, best_step, best_success, state = best
    model.load_state_dict(state)
    report = {
        "in_band": low <= best_success <= high,
        "heldout_success": best_success,
        "step": best_step,
        "band": [low, high],
        "n_demos": len(demos),
        "demo_tasks": len({d.task_id for d in demos}),
        "pool_tasks": len(pool),
        "eval_tasks": len(eval_tasks),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "history": history,
        "config": config_to_dict(cfg),
    }
    if cfg.offline_samples:
        stats = offline_stats(model, fmt, suite, pool, sampling, cfg.offline_samples, seed=cfg.seed + 1)
        report["offline_success"] = sum(s for _, s in stats.values()) / max(sum(n for n, _ in stats.values()), 1)
    report["seconds"] = time.perf_counter() - t0
    save_policy(model, fmt, out, extra={"warm_start": {k: v for k, v in report.items() if k != "config"}})
    if cfg.offline_samples:
        write_offline_stats(out / OFFLINE_STATS_FILE, stats)
    (out / "warm_start.json").write_text(json.dumps(report, indent=2, default=str))
    return report
