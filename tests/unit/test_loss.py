"""Tests of trainer/rl/loss.py against hand-computed numbers and an independent scalar reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from trainer.rl.config import LossConfig
from trainer.rl.loss import (
    AGGREGATIONS,
    aggregate_loss,
    masked_mean,
    policy_loss,
    tis_weights,
    token_entropy_from_logits,
)

torch.set_num_threads(1)
D = torch.float64
FAST = settings(max_examples=60, deadline=None)


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


def logs(ratios, base=-1.0):
    """log-probs whose difference from `base` has exp equal to the given ratios."""
    return t([[base + math.log(r) for r in row] for row in ratios])


# ---------------------------------------------------------------------------------------------------------------
# Clipping: one row of six tokens, old_logp = -1, logp = -1 + ln(ratio), TIS off, token-mean over 6 tokens.
#   tok  ratio   A    p1=-A*r   p2=-A*clip(r,0.8,1.28)  max     which
#   0    1.1     1    -1.1      -1.1                    -1.1    inside the clip range
#   1    1.5     1    -1.5      -1.28                   -1.28   upper clip (A>0, r>1.28)
#   2    0.5    -1     0.5       0.8                     0.8    lower clip (A<0, r<0.8)
#   3    0.5     2    -1.0      -1.6                    -1.0    A>0 and r small: not clipped
#   4    1.5    -2     3.0       2.56                    3.0    A<0 and r large: not clipped (dual clip 3: 6.0)
#   5    4.0    -1     4.0       1.28                    4.0    dual clip c=3 -> min(4.0, 3.0) = 3.0
# sum without dual clip = -1.1-1.28+0.8-1.0+3.0+4.0 = 4.42 -> mean 0.73666...; with dual clip 3.42 -> 0.57.
RATIOS = [[1.1, 1.5, 0.5, 0.5, 1.5, 4.0]]
ADV = [[1.0, 1.0, -1.0, 2.0, -2.0, -1.0]]


def clip_example(dual_clip=None):
    logp = logs(RATIOS).requires_grad_(True)
    old = t([[-1.0] * 6])
    loss, metrics = policy_loss(
        logp, old, None, t(ADV), torch.ones(1, 6), LossConfig(tis_cap=None, dual_clip=dual_clip)
    )
    loss.backward()
    return loss, metrics, logp.grad


def test_clip_low_high_hand_example():
    loss, metrics, grad = clip_example()
    assert loss.item() == pytest.approx(4.42 / 6, abs=1e-12)
    # d/dlogp of -A*r is -A*r (dr/dlogp = r); clipped tokens (1, 2) have zero gradient; all divided by 6.
    expected = [-1.1 / 6, 0.0, 0.0, -1.0 / 6, 3.0 / 6, 4.0 / 6]
    assert grad[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert metrics["clip_frac_low"].item() == pytest.approx(1 / 6)  # token 2
    assert metrics["clip_frac_high"].item() == pytest.approx(1 / 6)  # token 1
    assert "dual_clip_frac" not in metrics
    # approx_kl = mean(old - logp) = -mean(ln r) = -ln(1.1*1.5*0.5*0.5*1.5*4)/6 = -ln(2.475)/6
    assert metrics["approx_kl"].item() == pytest.approx(-math.log(2.475) / 6, abs=1e-12)
    # k3 = mean(r - 1 - ln r) = (9.1 - 6 - ln 2.475)/6
    assert metrics["approx_kl_k3"].item() == pytest.approx((3.1 - math.log(2.475)) / 6, abs=1e-12)
    assert metrics["tis_weight_mean"].item() == 1.0 and metrics["tis_truncated_frac"].item() == 0.0


def test_approx_kl_is_verls_ppo_kl_on_the_log_ratio_clamped_at_20():
    # log-ratios d = logp - old on the mask: +25, -30, +0.5 (the off-mask +100 is ignored)
    # verl: ppo_kl = mean(-clamp(d, -20, 20)) = -(20 - 20 + 0.5)/3 = -0.5/3; unclamped: -(25 - 30 + 0.5)/3 = +1.5
    logp = t([[-1.0, -31.0, -0.5, 99.0]])
    old = t([[-26.0, -1.0, -1.0, -1.0]])
    _, metrics = policy_loss(logp, old, None, t([[1.0, 1.0, 1.0, 1.0]]), t([[1, 1, 1, 0]]), LossConfig(tis_cap=None))
    assert metrics["approx_kl"].item() == pytest.approx(-0.5 / 3, abs=1e-12)
    # k3 uses the same clamped d: (e^20 - 1 - 20) + (e^-20 - 1 + 20) + (e^0.5 - 1 - 0.5), over 3
    k3 = (math.expm1(20) - 20 + math.expm1(-20) + 20 + math.expm1(0.5) - 0.5) / 3
    assert metrics["approx_kl_k3"].item() == pytest.approx(k3, rel=1e-12)


def test_dual_clip_hand_example():
    loss, metrics, grad = clip_example(dual_clip=3.0)
    assert loss.item() == pytest.approx(3.42 / 6, abs=1e-12)
    expected = [-1.1 / 6, 0.0, 0.0, -1.0 / 6, 3.0 / 6, 0.0]  # token 5 is now dual-clipped
    assert grad[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 6)


# ---------------------------------------------------------------------------------------------------------------
# TIS: ratio 1 everywhere (logp == old_logp), so the PPO loss per token is -A.
#   old - rollout = ln[0.5, 1.5, 3, 10]  -> raw [0.5, 1.5, 3, 10] -> w = min(2, raw) = [0.5, 1.5, 2, 2]
#   A = [2, -1, 1, -3] -> -A*w = [-1, 1.5, -2, 6], sum 4.5, token-mean over 4 policy tokens = 1.125
#   tis_weight_mean = 6/4 = 1.5, tis_truncated_frac = 2/4; a fifth, masked token holds garbage.
def test_tis_hand_example():
    old = t([[-1.0, -2.0, -0.5, -3.0, 7.0]])
    rollout = old - logs([[0.5, 1.5, 3.0, 10.0, 1.0]], base=0.0)
    rollout[0, 4] = -1e30
    logp = old.clone().requires_grad_(True)
    adv = t([[2.0, -1.0, 1.0, -3.0, 1e30]])
    mask = t([[1, 1, 1, 1, 0]])
    loss, metrics = policy_loss(logp, old, rollout, adv, mask, LossConfig(tis_cap=2.0))
    loss.backward()
    assert loss.item() == pytest.approx(1.125, abs=1e-12)
    assert logp.grad[0].tolist() == pytest.approx([-1 / 4, 1.5 / 4, -2 / 4, 6 / 4, 0.0], abs=1e-12)
    assert metrics["tis_weight_mean"].item() == pytest.approx(1.5)
    assert metrics["tis_truncated_frac"].item() == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------------------------
# Gradient with clipping, TIS and a mask together (2 x 3):
#   row 0: r = [1.1, 1.5, 0.5], A = [1, 1, -1], raw w = [0.5, 3, 1] -> w = [0.5, 2, 1], mask [1, 1, 1]
#   row 1: r = [0.5, 2.0, 1.2], A = [2, 5, -1], raw w = [1.5, 1, 4] -> w = [1.5, 1, 2], mask [1, 0, 1]
#   per token w*l:  r0: -1.1*0.5=-0.55, -1.28*2=-2.56 (upper clip), 0.8*1=0.8 (lower clip)
#                   r1: -1.0*1.5=-1.5, (masked), 1.2*2=2.4
#   token-mean: (-0.55-2.56+0.8-1.5+2.4)/5 = -1.41/5 = -0.282
#   seq-mean-token-mean: row means -2.31/3 = -0.77 and 0.9/2 = 0.45 -> -0.16
#   gradient of unclipped tokens: -A*r*w/denom; clipped and masked tokens: 0.
def grad_example(agg):
    logp = logs([[1.1, 1.5, 0.5], [0.5, 2.0, 1.2]]).requires_grad_(True)
    old = t([[-1.0] * 3] * 2)
    rollout = old - logs([[0.5, 3.0, 1.0], [1.5, 1.0, 4.0]], base=0.0)
    adv = t([[1.0, 1.0, -1.0], [2.0, 5.0, -1.0]])
    mask = torch.tensor([[True, True, True], [True, False, True]])
    loss, metrics = policy_loss(logp, old, rollout, adv, mask, LossConfig(agg=agg))
    loss.backward()
    return loss.item(), logp.grad


def test_gradient_token_mean_hand_formula():
    loss, grad = grad_example("token-mean")
    assert loss == pytest.approx(-0.282, abs=1e-12)
    expected = [[-1 * 1.1 * 0.5 / 5, 0.0, 0.0], [-2 * 0.5 * 1.5 / 5, 0.0, 1 * 1.2 * 2 / 5]]
    assert grad.tolist()[0] == pytest.approx(expected[0], abs=1e-12)
    assert grad.tolist()[1] == pytest.approx(expected[1], abs=1e-12)


def test_gradient_seq_mean_token_mean_hand_formula():
    loss, grad = grad_example("seq-mean-token-mean")
    assert loss == pytest.approx(-0.16, abs=1e-12)
    # denominators: row 0 has 3 tokens, row 1 has 2, and there are 2 rows -> 6 and 4.
    expected = [[-1 * 1.1 * 0.5 / 6, 0.0, 0.0], [-2 * 0.5 * 1.5 / 4, 0.0, 1 * 1.2 * 2 / 4]]
    assert grad.tolist()[0] == pytest.approx(expected[0], abs=1e-12)
    assert grad.tolist()[1] == pytest.approx(expected[1], abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Aggregations: ratio 1, TIS off, so per-token loss = -A. Width 5, third row empty, garbage off the mask.
#   row sums: -(1+2+3) = -6, -4, 0;  token counts 3, 1, 0
#   token-mean               (-6-4)/4           = -2.5
#   seq-mean-token-mean      (-6/3 + -4/1)/2    = -3     (the empty row is not counted)
#   seq-mean-token-sum       (-6 + -4)/2        = -5     (nor here: verl >= 0.6.1; verl <= 0.6.0 gave -10/3)
#   seq-mean-token-sum-norm  (-6-4)/5           = -2,   and with loss_scale_factor=8: -10/8 = -1.25
@pytest.mark.parametrize(
    "agg, kwargs, expected",
    [
        ("token-mean", {}, -2.5),
        ("seq-mean-token-mean", {}, -3.0),
        ("seq-mean-token-sum", {}, -5.0),
        ("seq-mean-token-sum-norm", {}, -2.0),
        ("seq-mean-token-sum-norm", {"loss_scale_factor": 8.0}, -1.25),
    ],
)
def test_aggregations_hand_example(agg, kwargs, expected):
    mask = t([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    adv = t([[1, 2, 3, 1e30, -1e30], [4, 1e30, 1e30, 1e30, 1e30], [9, 9, 9, 9, 9]])
    logp = torch.where(mask.bool(), t(-0.7), t(-1e30))
    old = torch.where(mask.bool(), t(-0.7), t(1e30))
    loss, _ = policy_loss(logp, old, old, adv, mask, LossConfig(agg=agg), **kwargs)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_empty_mask_gives_zero_loss_zero_grads_zero_metrics(agg):
    logp = t([[-1.0, -2.0], [-3.0, -4.0]]).requires_grad_(True)
    loss, metrics = policy_loss(
        logp,
        logp.detach() + 1,
        logp.detach() - 5,
        t([[1.0, -1.0], [2.0, 3.0]]),
        torch.zeros(2, 2),
        LossConfig(agg=agg, dual_clip=3.0),
    )
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(2, 2, dtype=D))
    assert set(metrics) == {
        "clip_frac_low",
        "clip_frac_high",
        "approx_kl",
        "approx_kl_k3",
        "tis_weight_mean",
        "tis_truncated_frac",
        "dual_clip_frac",
    }
    assert all(v.item() == 0.0 for v in metrics.values())


def test_zero_size_batch_is_finite():
    logp = torch.zeros(0, 3, dtype=D, requires_grad=True)
    for agg in AGGREGATIONS:
        loss, metrics = policy_loss(
            logp, logp.detach(), logp.detach(), logp.detach(), torch.zeros(0, 3), LossConfig(agg=agg)
        )
        assert loss.item() == 0.0
        assert all(math.isfinite(v.item()) for v in metrics.values())


def test_bf16_inputs_are_computed_in_fp32():
    logp = t([[-1.0, -2.0]], torch.bfloat16).requires_grad_(True)
    loss, metrics = policy_loss(
        logp, logp.detach(), logp.detach(), t([[1.0, 3.0]], torch.bfloat16), torch.ones(1, 2, dtype=torch.bool)
    )
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(-2.0)  # ratio 1: -(1+3)/2
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -1.5])


def test_metrics_are_detached_scalars():
    _, metrics, _ = clip_example(dual_clip=3.0)
    for name, value in metrics.items():
        assert value.dim() == 0 and not value.requires_grad, name


# ---------------------------------------------------------------------------------------------------------------
# Bad input
def test_bad_input_errors():
    x = torch.zeros(2, 3, dtype=D)
    ones = torch.ones(2, 3)
    with pytest.raises(ValueError, match="seq-mean.*token-mean|token-mean.*seq-mean"):
        policy_loss(x, x, x, x, ones, LossConfig(agg="sequence-mean"))
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        policy_loss(x, x, torch.zeros(2, 4), x, ones)
    with pytest.raises(ValueError, match="batch, time"):
        policy_loss(x[0], x[0], x[0], x[0], ones[0])
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(x, x, x, x, ones, LossConfig(dual_clip=1.0))
    with pytest.raises(ValueError, match="tis_cap"):
        policy_loss(x, x, x, x, ones, LossConfig(tis_cap=0.0))
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(x, x, x, x, ones, LossConfig(clip_low=1.0))
    with pytest.raises(ValueError, match="clip_high"):
        policy_loss(x, x, x, x, ones, LossConfig(clip_high=-0.1))
    with pytest.raises(ValueError, match="rollout_logp is None"):
        policy_loss(x, x, None, x, ones)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        policy_loss(x, x, x, x, ones, loss_scale_factor=4.0)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        policy_loss(x, x, x, x, ones, LossConfig(agg="seq-mean-token-sum-norm"), loss_scale_factor=0.0)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(x, x, x, x, ones * 0.5)
    nan_mask = ones.clone()
    nan_mask[0, 0] = float("nan")
    with pytest.raises(ValueError, match="mask"):
        policy_loss(x, x, x, x, nan_mask)
    bad = x.clone()
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, x, bad, ones)
    with pytest.raises(ValueError, match="rollout_logp"):
        policy_loss(x, x, bad * -1, x, ones)
    # the same non-finite value off the mask is fine
    off = ones.clone()
    off[1, 2] = 0
    loss, _ = policy_loss(x, x, bad, bad, off)
    assert math.isfinite(loss.item())


def test_inf_and_nan_off_the_mask_do_not_leak():
    mask = torch.tensor([[True, False, True]])
    logp = t([[-1.0, float("nan"), -2.0]]).requires_grad_(True)
    old = t([[-1.2, float("inf"), -1.9]])
    rollout = t([[-1.0, float("-inf"), -2.5]])
    adv = t([[1.0, float("nan"), -0.5]])
    loss, metrics = policy_loss(logp, old, rollout, adv, mask, LossConfig(dual_clip=3.0))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    assert all(math.isfinite(v.item()) for v in metrics.values())


# ---------------------------------------------------------------------------------------------------------------
# Independent scalar reference (plain Python floats, a loop per token) for hypothesis to compare against.
def reference(logp, old, rollout, adv, mask, clip_low, clip_high, cap, agg, dual_clip):
    rows = []
    for b in range(len(mask)):
        row = []
        for k in range(len(mask[b])):
            if not mask[b][k]:
                continue
            r = math.exp(max(-20.0, min(20.0, logp[b][k] - old[b][k])))
            a = adv[b][k]
            loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
            if dual_clip is not None and a < 0:
                loss = min(loss, -a * dual_clip)
            w = 1.0 if cap is None else min(cap, math.exp(max(-20.0, min(20.0, old[b][k] - rollout[b][k]))))
            row.append(loss * w)
        rows.append(row)
    total = sum(sum(row) for row in rows)
    if agg == "token-mean":
        return total / max(1, sum(len(row) for row in rows))
    if agg == "seq-mean-token-mean":
        means = [sum(row) / len(row) for row in rows if row]
        return sum(means) / max(1, len(means))
    if agg == "seq-mean-token-sum":
        return total / max(1, sum(1 for row in rows if row))
    return total / max(1, len(mask[0]))


@st.composite
def batches(draw, min_count_per_row=None):
    b, width = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def arr(lo, hi):
        return draw(arrays(np.float64, (b, width), elements=st.floats(lo, hi)))

    if min_count_per_row is None:
        mask = draw(arrays(np.bool_, (b, width)))
    else:  # every row gets exactly k policy tokens, at drawn positions
        k = draw(st.integers(1, width))
        mask = np.zeros((b, width), dtype=bool)
        for row in range(b):
            mask[row, draw(st.permutations(range(width)))[:k]] = True
    return arr(-6, 0), arr(-6, 0), arr(-6, 0), arr(-3, 3), mask


@FAST
@given(
    batches(),
    st.sampled_from(AGGREGATIONS),
    st.sampled_from([None, 0.5, 2.0]),
    st.sampled_from([None, 3.0]),
    st.floats(0.0, 0.9),
    st.floats(0.0, 2.0),
)
def test_matches_scalar_reference(batch, agg, cap, dual_clip, clip_low, clip_high):
    logp, old, rollout, adv, mask = batch
    loss, metrics = policy_loss(
        t(logp),
        t(old),
        t(rollout),
        t(adv),
        torch.from_numpy(mask),
        LossConfig(agg=agg, tis_cap=cap, dual_clip=dual_clip, clip_low=clip_low, clip_high=clip_high),
    )
    expected = reference(
        logp.tolist(),
        old.tolist(),
        rollout.tolist(),
        adv.tolist(),
        mask.tolist(),
        clip_low,
        clip_high,
        cap,
        agg,
        dual_clip,
    )
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-9)
    for name in ("clip_frac_low", "clip_frac_high", "tis_truncated_frac"):
        assert 0.0 <= metrics[name].item() <= 1.0
    assert metrics["approx_kl_k3"].item() >= 0.0
    kl = [
        -max(-20.0, min(20.0, logp[b][k] - old[b][k]))
        for b in range(len(mask))
        for k in range(len(mask[b]))
        if mask[b][k]
    ]
    assert metrics["approx_kl"].item() == pytest.approx(sum(kl) / max(1, len(kl)), rel=1e-9, abs=1e-9)


@FAST
@given(
    arrays(np.float64, st.integers(0, 12), elements=st.floats(-1e6, 1e6)),
    arrays(np.float64, 12, elements=st.floats(-1e6, 1e6)),
    st.floats(1e-3, 1e3),
)
def test_tis_weights_are_between_zero_and_cap(old, rollout, cap):
    rollout = rollout[: len(old)]
    w, truncated = tis_weights(t(old), t(rollout), cap)
    assert torch.all(w >= 0) and torch.all(w <= cap)
    for k in range(len(old)):  # the scalar definition, token by token
        raw = math.exp(max(-20.0, min(20.0, old[k] - rollout[k])))
        assert w[k].item() == pytest.approx(min(cap, raw), rel=1e-12)
        assert bool(truncated[k]) == (raw > cap)


@FAST
@given(batches(min_count_per_row=True))
def test_token_mean_equals_seq_mean_token_mean_when_counts_are_equal(batch):
    logp, old, rollout, adv, mask = batch
    args = (t(logp), t(old), t(rollout), t(adv), torch.from_numpy(mask))
    a, _ = policy_loss(*args, LossConfig(agg="token-mean"))
    b, _ = policy_loss(*args, LossConfig(agg="seq-mean-token-mean"))
    assert a.item() == pytest.approx(b.item(), rel=1e-12, abs=1e-12)


@FAST
@given(batches(), st.sampled_from(AGGREGATIONS))
def test_tis_off_equals_huge_cap_when_rollout_matches_old(batch, agg):
    logp, old, _, adv, mask = batch
    args = (t(logp), t(old), t(old), t(adv), torch.from_numpy(mask))
    off, m_off = policy_loss(*args, LossConfig(agg=agg, tis_cap=None))
    huge, m_huge = policy_loss(*args, LossConfig(agg=agg, tis_cap=1e30))
    assert torch.equal(off, huge)
    assert torch.equal(m_off["tis_weight_mean"], m_huge["tis_weight_mean"])


GARBAGE = st.sampled_from([1e30, -1e30, 1e15, -1e15, 0.0, 123.0])


@FAST
@given(batches(), st.sampled_from(AGGREGATIONS), st.data())
def test_masked_positions_never_influence_loss_or_grad(batch, agg, data):
    logp, old, rollout, adv, mask = batch

    def run(fill):
        tensors = []
        for x in (logp, old, rollout, adv):
            x = x.copy()
            if fill:
                x[~mask] = data.draw(arrays(np.float64, int((~mask).sum()), elements=GARBAGE))
            tensors.append(t(x))
        tensors[0].requires_grad_(True)
        loss, metrics = policy_loss(*tensors, torch.from_numpy(mask), LossConfig(agg=agg, dual_clip=3.0))
        loss.backward()
        return loss, metrics, tensors[0].grad

    clean, garbage = run(False), run(True)
    assert torch.equal(clean[0], garbage[0])
    assert torch.equal(clean[2], garbage[2])
    assert torch.all(garbage[2][torch.from_numpy(~mask)] == 0)
    for name in clean[1]:
        assert torch.equal(clean[1][name], garbage[1][name]), name


# ---------------------------------------------------------------------------------------------------------------
# Helpers
def test_masked_mean():
    x = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(x, mask).item() == pytest.approx((1 + 2 + 4 + 6) / 4)
    assert masked_mean(x, mask, dim=1).tolist() == pytest.approx([1.5, 5.0])
    assert masked_mean(x, torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0
    assert masked_mean(torch.tensor([True, False, True]), torch.tensor([1, 1, 0])).item() == 0.5
    with pytest.raises(ValueError, match="shape"):
        masked_mean(x, mask[0])


def test_aggregate_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="agg='nope'.*token-mean"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "nope")


def test_entropy_hand_examples():
    # uniform over 4: ln 4; p = [1/3, 2/3] from logits [0, ln 2]: ln 3 - (2/3) ln 2; one finite logit: 0.
    logits = t(
        [
            [
                [0.0, 0.0, 0.0, 0.0],
                [0.0, math.log(2.0), float("-inf"), float("-inf")],
                [5.0, float("-inf"), float("-inf"), float("-inf")],
            ]
        ]
    ).requires_grad_(True)
    h = token_entropy_from_logits(logits)
    assert h.shape == (1, 3)
    assert h[0].tolist() == pytest.approx([math.log(4), math.log(3) - 2 / 3 * math.log(2), 0.0], abs=1e-12)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 0].tolist() == pytest.approx([0.0] * 4, abs=1e-12)  # uniform is a maximum


def test_entropy_is_stable_for_huge_logits_and_bf16():
    logits = t([[1e4, 1e4, -1e4]], torch.bfloat16)
    h = token_entropy_from_logits(logits)
    assert h.dtype == torch.float32 and h.item() == pytest.approx(math.log(2), abs=1e-6)
    with pytest.raises(ValueError, match="no finite entropy"):
        token_entropy_from_logits(t([[float("-inf"), float("-inf")]]))
    with pytest.raises(ValueError, match="no finite entropy"):
        token_entropy_from_logits(t([[0.0, float("nan")]]))
