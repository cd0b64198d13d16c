"""Per-turn penalties of the paper's recipe: a graded length penalty and a tool-error penalty.

For turn k of a trajectory with K turns and L_k generated tokens:

    c_len,k  = -length_penalty_max * min(1, (L_k - threshold) / ramp)   if L_k > threshold (and k < K), else 0
    c_tool,k = -tool_error_penalty   if the turn's action was invalid (or, by default, failed to execute), else 0
    c_k      = clip(c_len,k + c_tool,k, -clip, +clip)

c_k is added to that turn's advantage by the estimator (see advantages.py), which then standardises.

Readings of the paper, and why they are the defaults:
- "Penalised up to -0.5" reads as a *graded* penalty: zero at the threshold, reaching its maximum `ramp` tokens
  past it, in the style of DAPO's overlong buffer. The ramp defaults to the threshold itself (2048 past 2048 at
  paper scale); `length_ramp=0` gives the flat reading (-0.5 as soon as L > threshold). A turn exactly at the
  threshold is not penalised.
- The last turn is exempt from the length penalty (the paper says so; the final answer or patch may be long).
  The tool penalty has no exemption: an invalid final action is still an invalid action.
- Execution errors count as tool errors by default ("an invalid action or execution error is -0.5"); the
  environments decide what an execution error is (e.g. whether a nonzero exit code counts). `count_exec_errors`
  =False keeps only invalid actions.
- `length_penalties` and `tool_penalties` return the penalty as applied, so zeros when their switch is off;
  `overlong_flags` is a plain fact about each turn (L > threshold, last turn included) for the overlong-rate
  metric, logged whether or not the length penalty is on.
- With the paper's magnitudes (0.5 each) and clip 0.25, any single trigger past the ramp's midpoint saturates at
  -0.25, and the +0.25 bound never binds since penalties are <= 0.
"""

from __future__ import annotations

import torch

from trainer.rl.config import ShapingConfig
from trainer.rl.trajectory import Trajectory, Turn


def _lengths(turns: list[Turn]) -> torch.Tensor:
    lengths = [turn.length for turn in turns]
    for k, (turn, length) in enumerate(zip(turns, lengths)):
        if length < 0:
            raise ValueError(f"turn {k} has a negative length: start={turn.start} > end={turn.end}")
    return torch.tensor(lengths, dtype=torch.float64)


def overlong_flags(turns: list[Turn], cfg: ShapingConfig) -> torch.Tensor:
    """Bool per turn: generated length > threshold (no last-turn exemption; for the overlong-rate metric)."""
    return _lengths(turns) > cfg.length_threshold


def length_penalties(turns: list[Turn], cfg: ShapingConfig) -> torch.Tensor:
    """c_len per turn (fp32, <= 0): -max * min(1, (L - threshold) / ramp) past the threshold; zeros when off."""
    lengths = _lengths(turns)
    if not cfg.length_penalty or len(turns) == 0:
        return torch.zeros(len(turns), dtype=torch.float32)
    over = (lengths - cfg.length_threshold).clamp(min=0)
    fraction = (over / cfg.ramp).clamp(max=1) if cfg.ramp > 0 else (over > 0).double()
    penalties = -cfg.length_penalty_max * fraction
    if cfg.exempt_last_turn:
        penalties[-1] = 0.0
    return penalties.float() + 0.0  # + 0.0 turns -0.0 into 0.0


def tool_penalties(turns: list[Turn], cfg: ShapingConfig) -> torch.Tensor:
    """c_tool per turn (fp32, <= 0): -tool_error_penalty on an invalid action (or exec error); zeros when off."""
    if not cfg.tool_penalty:
        return torch.zeros(len(turns), dtype=torch.float32)
    errors = [turn.invalid_action or (cfg.count_exec_errors and turn.exec_error) for turn in turns]
    return torch.tensor([-cfg.tool_error_penalty if error else 0.0 for error in errors], dtype=torch.float32) + 0.0


def turn_penalties(trajectories: list[Trajectory], cfg: ShapingConfig) -> list[torch.Tensor]:
    """Per trajectory, one fp32 value per turn: clip(c_len + c_tool, -clip, +clip)."""
    out = []
    for traj in trajectories:
        try:
            total = length_penalties(traj.turns, cfg) + tool_penalties(traj.turns, cfg)
        except ValueError as err:
            raise ValueError(f"trajectory of task {traj.task_id!r}: {err}") from None
        out.append(total.clamp(-cfg.clip, cfg.clip))
    return out
