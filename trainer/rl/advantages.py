"""From finished trajectories to per-token advantages: the one computation every estimator of estimators.py uses.

The estimators' formulas live in their own modules (`spo.py` for single-stream SPO / SPO++, `group_advantages.py` for
GRPO / GiGPO / GraphGPO) and return one value per turn. This module adds the paper's per-turn penalties
(`shaping.py`) where the recipe asks for them and broadcasts the result onto each turn's action tokens.

Where the penalties enter: SPO++ puts them inside its standardisation (that is the recipe: a_k = a + c_k, then
standardise over all turns). The other estimators add them after their own normalisation, so their statistics
stay exactly the published ones; with penalties off (their recipes' default) nothing is added.
"""

from __future__ import annotations

import torch

from trainer.rl.config import SPO_ESTIMATORS, RLConfig, ShapingConfig
from trainer.rl.group_advantages import gigpo_advantages, graphgpo_advantages, grpo_advantages
from trainer.rl.shaping import overlong_flags, turn_penalties
from trainer.rl.spo import BetaTracker, spo_advantages, spo_plus_plus_advantages
from trainer.rl.trajectory import Trajectory, turn_values_to_tokens


def compute_advantages(
    trajectories: list[Trajectory],
    cfg: RLConfig,
    shaping: ShapingConfig,
    tracker: BetaTracker | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages [batch, width] (zero off the action tokens) and a few batch statistics: `cfg` chooses
    the estimator and holds its settings, `shaping` the per-turn penalties."""
    bonus = turn_penalties(trajectories, shaping) if (shaping.length_penalty or shaping.tool_penalty) else None
    if cfg.estimator in SPO_ESTIMATORS and tracker is None:
        raise ValueError(f"estimator {cfg.estimator!r} needs the SPO tracker")
    if cfg.estimator == "spo":
        per_turn = spo_advantages(trajectories, tracker, turn_bonus=bonus)
    elif cfg.estimator == "spo++":
        per_turn = spo_plus_plus_advantages(trajectories, tracker, bonus, cfg.spo_plus_plus)
    else:
        estimator = {
            "grpo": (grpo_advantages, cfg.grpo),
            "gigpo": (gigpo_advantages, cfg.gigpo),
            "graphgpo": (graphgpo_advantages, cfg.graphgpo),
        }[cfg.estimator]
        per_turn = estimator[0](trajectories, estimator[1])
        if bonus is not None:
            per_turn = [a + c for a, c in zip(per_turn, bonus)]
    tokens = turn_values_to_tokens(trajectories, per_turn, width)
    all_turns = torch.cat(per_turn) if per_turn else torch.zeros(0)
    n_turns = max(all_turns.numel(), 1)
    stats = {
        "advantage_std": float(all_turns.std()) if all_turns.numel() > 1 else 0.0,
        "advantage_mean": float(all_turns.mean()) if all_turns.numel() else 0.0,
        "penalty_mean": float(torch.cat(bonus).sum() / n_turns) if bonus else 0.0,
        "overlong_rate": sum(int(overlong_flags(t.turns, shaping).sum()) for t in trajectories) / n_turns,
        "tool_error_rate": sum(sum(turn.tool_error for turn in t.turns) for t in trajectories) / n_turns,
    }
    return tokens, stats
