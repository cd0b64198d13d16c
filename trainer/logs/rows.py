"""What one row of each log holds: `episode_row` (episodes.parquet, training and evaluation alike) and `update_row`
(metrics.parquet). The columns and their types are `parquet_log.EPISODE_COLUMNS` and `METRIC_COLUMNS`; these are
the only places that fill them, so a column means the same thing wherever a row comes from.

Imported only by the trainer (it needs torch through the shaping module); `trainer.logs` itself stays torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainer.rl.config import ShapingConfig
from trainer.rl.shaping import overlong_flags

UPDATE_STATISTICS = (
    "entropy",
    "approx_kl",
    "clip_frac_low",
    "clip_frac_high",
    "tis_weight_mean",
    "tis_truncated_frac",
    "grad_norm",
    "update_rms",
    "update_spectral_norm",
    "loss",
    "embed_head_update_rms",
    "embed_head_update_spectral_norm",
)
"""Columns copied from the policy update's output; null when every optimizer step of the update was skipped."""


def episode_row(
    episode, *, update: int, split: str, staleness: int, shaping: ShapingConfig, baseline_informed: bool | None = None
) -> dict:
    """One episode's row. `update`: the update whose batch consumed it (training) or after which it was played
    (evaluation); `staleness`: update - policy version for training, 0 for evaluation; `baseline_informed`: null
    for evaluation episodes."""
    t = episode.trajectory()
    grading = episode.extra.get("grading") or {}
    return {
        "update": update,
        "task_id": episode.task_id,
        "reward": episode.reward,
        "success": t.success,
        "n_turns": len(t.turns),
        "gen_tokens": episode.n_generated,
        "length": episode.length,
        "truncated": episode.truncated,
        "staleness": staleness,
        "policy_version": episode.oldest_version,
        "tool_errors": sum(turn.tool_error for turn in t.turns),
        "overlong_turns": int(overlong_flags(t.turns, shaping).sum()),
        "split": split,
        "baseline_informed": baseline_informed,
        "graded_reward": grading.get("graded_reward"),
        "tamper_flags": "; ".join(grading["tamper_flags"]) if "tamper_flags" in grading else None,
    }


def tamper_rate(episodes: Sequence) -> float | None:
    """The share of graded episodes with tamper flags; None where no episode reports its grading."""
    graded = [e.extra["grading"] for e in episodes if "tamper_flags" in (e.extra.get("grading") or {})]
    return float(np.mean([bool(g["tamper_flags"]) for g in graded])) if graded else None


def update_row(
    *,
    update: int,
    policy_version: int,
    episodes: Sequence,
    trajectories: Sequence,
    staleness: Sequence[int],
    advantage_stats: dict,
    update_output: dict,
    lr: float,
    baseline_informed: Sequence[bool] | None,
    rollout_s: float,
    train_s: float,
    wall_s: float,
) -> dict:
    """One update's row (without the evaluation columns, which only some updates fill). `baseline_informed` is
    None for an estimator without per-task baselines (the column is then null)."""
    gen = [e.n_generated for e in episodes]
    row = {
        "update": update,
        "policy_version": policy_version,
        "n_trajectories": len(episodes),
        "gen_tokens": sum(gen),
        "success_rate": float(np.mean([t.success for t in trajectories])),
        "reward_mean": float(np.mean([t.reward for t in trajectories])),
        "response_len_mean": float(np.mean(gen)),
        "turns_mean": float(np.mean([len(t.turns) for t in trajectories])),
        "tool_error_rate": advantage_stats["tool_error_rate"],
        "overlong_rate": advantage_stats["overlong_rate"],
        "advantage_std": advantage_stats["advantage_std"],
        "staleness_mean": float(np.mean(staleness)),
        "staleness_max": float(max(staleness)),
        "lr": lr,
        "optimizer_steps": update_output["steps"],
        "skipped_steps": update_output["skipped_steps"],
        "no_signal_steps": update_output["no_signal_steps"],
        "baseline_informed_frac": float(np.mean(baseline_informed)) if baseline_informed is not None else None,
        "rollout_s": rollout_s,
        "train_s": train_s,
        "wall_s": wall_s,
        "tamper_rate": tamper_rate(episodes),
    }
    for k in UPDATE_STATISTICS:
        row[k] = update_output.get(k)
    if "grad_snr" in update_output:
        row["grad_snr"] = update_output["grad_snr"]
    return row
