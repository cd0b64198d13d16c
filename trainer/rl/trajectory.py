"""What an advantage estimator sees of a finished episode.

The rollout driver flattens a multi-turn episode into one token sequence (prompt, then for each turn the
policy's action tokens followed by the environment's observation tokens). Estimators work per *turn*:
the paper's penalties, SPO++'s standardisation, GiGPO's anchor states and GraphGPO's edges are all
per-turn quantities. `turn_values_to_tokens` then broadcasts one value per turn onto that turn's action
tokens, which is the only place the loss mask is 1.

Kept free of torch modules and models on purpose: these are plain records that tests can write by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Turn:
    """One assistant turn: the action tokens the policy generated, and what the environment said of them."""

    start: int
    """Index of the turn's first generated token in the flattened sequence."""
    end: int
    """One past the turn's last generated token (so `end - start` is the turn's generated length)."""
    state: str = ""
    """The observation the action was taken in (GiGPO's anchor state, GraphGPO's source node)."""
    invalid_action: bool = False
    """The action could not be parsed, named an unknown tool, or was not admissible."""
    exec_error: bool = False
    """The action parsed but its execution failed (tool error, timeout)."""

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def tool_error(self) -> bool:
        return self.invalid_action or self.exec_error


@dataclass
class Trajectory:
    """A finished episode with its sparse outcome reward."""

    task_id: str
    reward: float
    """Outcome reward in {0, 1}: 1 only if the final patch passes every F2P and P2P test (or the goal is met)."""
    turns: list[Turn]
    length: int
    """Number of tokens in the flattened sequence (row length before padding)."""
    final_state: str = ""
    """The observation after the last action (GraphGPO's target of the last edge)."""
    group_id: str | None = None
    """Episodes of the same task and initial state, for group estimators; None in single-stream training."""
    policy_version: int = 0
    """Version of the policy that generated the episode (the oldest one, if weights changed mid-episode)."""
    baseline: float | None = None
    """SPO++: the tracker's baseline snapshotted when the rollout was dispatched."""
    extra: dict = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return self.reward > 0.5


def turn_values_to_tokens(
    trajectories: list[Trajectory],
    per_turn: list[torch.Tensor],
    width: int | None = None,
) -> torch.Tensor:
    """Broadcast one value per turn onto that turn's action tokens; [batch, width] fp32, zero elsewhere."""
    if len(per_turn) != len(trajectories):
        raise ValueError(f"per_turn has {len(per_turn)} rows for {len(trajectories)} trajectories")
    width = max((t.length for t in trajectories), default=0) if width is None else width
    out = torch.zeros(len(trajectories), width, dtype=torch.float32)
    for row, (traj, values) in enumerate(zip(trajectories, per_turn)):
        if values.numel() != len(traj.turns):
            raise ValueError(
                f"trajectory {row} (task {traj.task_id!r}) has {len(traj.turns)} turns but {values.numel()} values"
            )
        for turn, value in zip(traj.turns, values.tolist()):
            if not 0 <= turn.start <= turn.end <= width:
                raise ValueError(f"trajectory {row}: turn span [{turn.start}, {turn.end}) outside width {width}")
            out[row, turn.start : turn.end] = value
    return out
