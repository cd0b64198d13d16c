"""PPO policy loss with clip-higher, optional dual clip, truncated importance sampling (TIS) and loss aggregation.

The paper's loss, token by token (all tensors are [batch, time]; the mask is 1 only on tokens the policy generated):

    ratio = exp(clamp(logp - old_logp, -20, 20))                      # current vs old training policy
    l     = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))   # DAPO clip-higher
    l     = min(l, -A * dual_clip)            where A < 0 (only if dual_clip is set)
    w     = min(C, exp(clamp(old_logp - rollout_logp, -20, 20)))      # TIS, a constant (no gradient)
    loss  = agg(mask * w * l)

Choices, and why:
- TIS multiplies the *already clipped* per-token loss and is not renormalised by sum(w): that is verl's placement
  (`rollout_is_batch_normalize: false`) and what the paper states ("multiplied onto the masked token loss, no
  renormalisation"). `tis_cap=None` switches TIS off (w = 1), which is what the no-TIS recipes mean.
- Masked-out positions are replaced by zeros *before* any arithmetic (`torch.where`, not a multiply by the mask).
  A multiply would turn garbage in padding (inf, NaN, 1e30 advantages) into NaN via 0 * inf, in the loss or in
  the gradient; a `where` cannot. So padding, prompt and observation tokens can never influence loss or gradient.
- Policy tokens holding non-finite values are bad input and raise a ValueError (one host sync per call); a
  non-binary mask raises too. The hyper-parameters are a `LossConfig` (trainer/rl/config.py), checked when built.
- The arithmetic runs in at least fp32 (bf16 log-probs are upcast; fp64 stays fp64 so gradient tests are exact).
- old_logp, rollout_logp and advantages are detached: they are data, never something to differentiate.
- An all-zero mask gives loss 0.0 that is still attached to `logp`'s graph (backward gives zero gradients) and
  all-zero metrics; every denominator is clamped to at least 1, so nothing divides by zero.
- Aggregations follow verl's `agg_loss` on one data-parallel rank, as of verl 0.6.1: both `seq-mean-*` means
  average over the rows with at least one policy token, so a fully masked row (an episode with no action token)
  neither adds to nor dilutes the mean. (verl <= 0.6.0 averaged `seq-mean-token-sum` over all rows; one
  convention for both is the point.) `seq-mean-token-sum-norm` (Dr.GRPO) divides the total by the mask's width
  unless `loss_scale_factor` is given (verl 0.6.1's form; a later verl also divides it by the non-empty rows).
- Metrics are masked token means, detached: `clip_frac_low` counts tokens where the lower clip is active
  (A < 0 and ratio < 1 - clip_low), `clip_frac_high` where the upper one is (A > 0 and ratio > 1 + clip_high).
  `approx_kl` is verl's `ppo_kl`: the mean of -d, with d = clamp(logp - old_logp, -20, 20) the loss's clamped
  log-ratio (verl clamps before its `masked_mean(-negative_approx_kl)`); `approx_kl_k3` is Schulman's k3,
  (r - 1) - log r, computed as expm1(d) - d from the same d (never negative).
  With TIS off, `tis_weight_mean` is the masked mean of ones (1, or 0 for an empty mask) and
  `tis_truncated_frac` is 0.
"""

from __future__ import annotations

import torch

from trainer.rl.config import AGGREGATIONS, LossConfig

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before exp (as verl does), so a ratio is at most exp(20) ~ 4.9e8."""


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is nonzero (bool or 0/1 mask of the same shape); 0 where none are.

    Masked-out entries are selected away, not multiplied by zero, so they may hold inf or NaN.
    """
    if x.shape != mask.shape:
        raise ValueError(f"masked_mean: x has shape {tuple(x.shape)} but mask has shape {tuple(mask.shape)}")
    keep = mask if mask.dtype == torch.bool else mask != 0
    if not x.is_floating_point():
        x = x.float()
    total = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim)
    count = keep.sum(dim).clamp(min=1)
    return total / count.to(x.dtype)


def token_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim, per position: [..., vocab] -> [...], fp32 (fp64 stays fp64).

    Computed from log_softmax, so huge logits are stable; vocabulary entries at -inf (masked tokens) contribute
    exactly 0 to the value and to the gradient. A position whose logits are all -inf, or hold NaN or +inf, has no
    entropy: ValueError. Memory: makes two fp32 copies of `logits`; chunk over positions at large vocabularies.
    """
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(
            f"token_entropy_from_logits: logits need a non-empty last (vocab) dim, got shape {tuple(logits.shape)}"
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logp = torch.log_softmax(logits.to(dtype), dim=-1)
    # p * log p with log p = -inf is 0 * -inf = NaN; select those entries away (a where, so the gradient is 0 too).
    finite_logp = torch.where(torch.isneginf(logp), torch.zeros((), dtype=dtype, device=logp.device), logp)
    entropy = -(logp.exp() * finite_logp).sum(-1)
    bad = int((~torch.isfinite(entropy)).sum())
    if bad:
        raise ValueError(
            f"token_entropy_from_logits: {bad} position(s) have no finite entropy "
            f"(logits all -inf, or holding NaN/+inf)"
        )
    return entropy


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights min(cap, pi_old / pi_rollout) per token, detached; also where the cap bit.

    Returns (weights, truncated) with truncated = raw ratio > cap (bool). No masking is done here.
    """
    log_w = (old_logp.detach() - rollout_logp.detach()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    raw = log_w.exp()
    return raw.clamp(max=cap), raw > cap


def aggregate_loss(
    per_token: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", *, loss_scale_factor: float | None = None
) -> torch.Tensor:
    """Reduce a [batch, time] per-token loss to a scalar (verl's `agg_loss`). Entries off the mask are ignored.

    token-mean:              sum(M*l) / sum(M)
    seq-mean-token-mean:     mean over rows with sum_t M > 0 of sum_t(M*l) / sum_t(M)
    seq-mean-token-sum:      mean over rows with sum_t M > 0 of sum_t(M*l)
    seq-mean-token-sum-norm: sum(M*l) / T, T = mask width, or `loss_scale_factor` when given
    Every denominator is at least 1, so an empty mask gives 0.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation agg={agg!r}; valid: {', '.join(AGGREGATIONS)}")
    if per_token.dim() != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"aggregate_loss: per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must be "
            f"the same [batch, time] shape"
        )
    if loss_scale_factor is not None:
        if agg != "seq-mean-token-sum-norm":
            raise ValueError(
                f"loss_scale_factor={loss_scale_factor} only applies to agg='seq-mean-token-sum-norm', not agg={agg!r}"
            )
        if not loss_scale_factor > 0 or loss_scale_factor == float("inf"):
            raise ValueError(f"loss_scale_factor must be a finite number > 0, got {loss_scale_factor}")
    keep = mask if mask.dtype == torch.bool else mask != 0
    dtype = per_token.dtype
    masked = torch.where(keep, per_token, torch.zeros((), dtype=dtype, device=per_token.device))
    if agg == "token-mean":
        return masked.sum() / keep.sum().clamp(min=1).to(dtype)
    if agg in ("seq-mean-token-mean", "seq-mean-token-sum"):
        per_row_count = keep.sum(-1)
        nonempty_rows = (per_row_count > 0).sum().clamp(min=1).to(dtype)
        if agg == "seq-mean-token-sum":
            return masked.sum() / nonempty_rows  # empty rows sum to 0
        per_row_mean = masked.sum(-1) / per_row_count.clamp(min=1).to(dtype)  # empty rows give 0 here
        return per_row_mean.sum() / nonempty_rows
    scale = float(loss_scale_factor) if loss_scale_factor is not None else max(masked.shape[1], 1)
    return masked.sum() / scale


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig | None = None,
    *,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip-higher loss with TIS and aggregation; returns (scalar loss, detached scalar metrics).

    logp: log-probs of the taken tokens under the policy being trained (carries the gradient).
    old_logp: the same under the training engine's weights before this update's PPO epochs.
    rollout_logp: the same as reported by the rollout engine at sampling time; may be None only when tis_cap is None.
    advantages: per-token advantages. mask: 1 (or True) on policy tokens, 0 elsewhere.
    cfg: the clip, TIS and aggregation settings (None: `LossConfig()`'s defaults, the paper's).
    Metrics: clip_frac_low, clip_frac_high, approx_kl, approx_kl_k3, tis_weight_mean, tis_truncated_frac,
    and dual_clip_frac when dual_clip is set.
    """
    cfg = cfg if cfg is not None else LossConfig()
    clip_low, clip_high, tis_cap, dual_clip = cfg.clip_low, cfg.clip_high, cfg.tis_cap, cfg.dual_clip
    if rollout_logp is None and tis_cap is not None:
        raise ValueError(f"rollout_logp is None but TIS is on (tis_cap={tis_cap}); pass tis_cap=None to turn it off")
    named = {"logp": logp, "old_logp": old_logp, "advantages": advantages, "mask": mask}
    if rollout_logp is not None:
        named["rollout_logp"] = rollout_logp
    shapes = {name: tuple(t.shape) for name, t in named.items()}
    if mask.dim() != 2 or len(set(shapes.values())) != 1:
        raise ValueError(f"policy_loss needs tensors of one [batch, time] shape, got {shapes}")

    # One host sync for all data checks: a non-binary mask, or a non-finite value on a policy token.
    keep = mask if mask.dtype == torch.bool else mask != 0
    with torch.no_grad():
        if mask.dtype == torch.bool:
            checks = {"mask": torch.zeros((), dtype=torch.bool, device=mask.device)}
        else:
            checks = {"mask": (keep & (mask != 1)).any()}  # NaN != 0 and NaN != 1, so NaN is caught too
        for name in ("logp", "old_logp", "advantages", "rollout_logp"):
            if name in named:
                checks[name] = (keep & ~torch.isfinite(named[name])).any()
        failed = [name for name, bad in zip(checks, torch.stack(list(checks.values())).tolist()) if bad]
    if "mask" in failed:
        raise ValueError("mask must hold only 0 and 1 (or be bool)")
    if failed:
        raise ValueError(f"non-finite values on policy tokens (mask == 1) in: {', '.join(failed)}")

    dtype = torch.promote_types(logp.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp.device)

    def on_mask(t: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, t.to(dtype), zero)

    lp, old, adv = on_mask(logp), on_mask(old_logp.detach()), on_mask(advantages.detach())

    log_ratio = (lp - old).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)

    if tis_cap is None:
        weights, truncated = torch.ones_like(ratio), torch.zeros_like(keep)
    else:
        weights, truncated = tis_weights(old, on_mask(rollout_logp.detach()), tis_cap)
    loss = aggregate_loss(per_token * weights, keep, cfg.agg, loss_scale_factor=loss_scale_factor)

    with torch.no_grad():
        metrics = {
            "clip_frac_low": masked_mean((adv < 0) & (ratio < 1.0 - clip_low), keep),
            "clip_frac_high": masked_mean((adv > 0) & (ratio > 1.0 + clip_high), keep),
            "approx_kl": masked_mean(-log_ratio, keep),
            "approx_kl_k3": masked_mean(torch.expm1(log_ratio) - log_ratio, keep),
            "tis_weight_mean": masked_mean(weights, keep),
            "tis_truncated_frac": masked_mean(truncated, keep),
        }
        if dual_clip is not None:
            metrics["dual_clip_frac"] = masked_mean((adv < 0) & (ratio > dual_clip), keep)
    return loss, {name: value.detach() for name, value in metrics.items()}
