"""How actions are sampled: the parameters every rollout engine, the trainer, the warm start and `eval` share.

Its own module because the engines (hf_engine.py, vllm_engine.py), the trainer and the policy code all take one,
and none of them should have to import an engine to get it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass


@dataclass
class SamplingParams:
    """How actions are sampled and how long episodes may grow."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax), with log-probs recorded under temperature 1."""
    top_p: float = 1.0
    """Nucleus sampling: draw only from the smallest set of tokens whose probability reaches top_p (1 = all)."""
    max_turn_tokens: int = 256
    """Most tokens one action may have (its stop token included); a longer action is cut and executed as is."""
    max_episode_tokens: int = 2048
    """Most tokens the whole sequence (prompt, actions, observations) may have; beyond it, truncated=True."""

    def __post_init__(self):
        if not (
            isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.max_turn_tokens, int) and self.max_turn_tokens >= 1):
            raise ValueError(f"SamplingParams.max_turn_tokens must be an int >= 1, got {self.max_turn_tokens!r}")
        if not (isinstance(self.max_episode_tokens, int) and self.max_episode_tokens >= 2):
            raise ValueError(f"SamplingParams.max_episode_tokens must be an int >= 2, got {self.max_episode_tokens!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def for_rollouts(cls, rollout) -> SamplingParams:
        """The training rollouts' sampling from a `RolloutConfig` (also the warm start's: its band is measured as
        the cells' rollouts sample)."""
        return cls(
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            max_turn_tokens=rollout.max_turn_tokens,
            max_episode_tokens=rollout.max_episode_tokens,
        )

    @classmethod
    def for_evaluation(cls, rollout) -> SamplingParams:
        """Held-out evaluation's sampling from a `RolloutConfig`: `eval_temperature` (greedy by default), no top-p."""
        return cls(
            temperature=rollout.eval_temperature,
            top_p=1.0,
            max_turn_tokens=rollout.max_turn_tokens,
            max_episode_tokens=rollout.max_episode_tokens,
        )


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of turn `turn` of the episode dispatched with `episode_seed`: a hash of both, in
    [0, 2^31 - 1). Per episode and turn rather than per generate call, so an episode samples the same whichever
    episodes share its calls and in whatever order turns finish (the lock-step and episode-level loops agree)."""
    digest = hashlib.blake2b(f"{int(episode_seed)}:{int(turn)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)
