"""SPO / SPO++ advantages and the Beta tracker, checked against hand-computed values.

Every expected number is worked out in the comments from the formulas of the SPO recipe
(SPO: Beta-tracked per-task baseline, advantage = reward - baseline; SPO++ as in trainer/rl/spo.py's docstring), not by calling the code under test.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from builders import trajectory
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainer.rl.config import RLConfig, ShapingConfig, SPOConfig, SPOPlusPlusConfig
from trainer.rl.spo import (
    BetaTracker,
    logprob_divergence,
    rho_from_divergence,
    spo_advantages,
    spo_plus_plus_advantages,
    spo_update_tracker,
    update_tracker_in_arrival_order,
)
from trainer.rl.trajectory import Trajectory, Turn

torch.set_num_threads(1)
FAST = settings(max_examples=60, deadline=None)


def traj(task_id: str, reward: float, turn_lengths=(1,), baseline=None, policy_version=0) -> Trajectory:
    """A trajectory whose turns are back to back, with the given generated lengths."""
    return trajectory(task_id, reward, turn_lengths, baseline=baseline, policy_version=policy_version)


def values(rows):
    return [row.tolist() for row in rows]


# ---------------------------------------------------------------------------------------------------------
# Forgetting factor and D


def test_rho_from_divergence_clips_at_both_ends_and_is_exact_inside():
    # D = 0 (first visit): 2**0 = 1, clipped down to rho_max = 0.96
    assert rho_from_divergence(0.0) == 0.96
    # D = 0.003: 2**(-0.05) = 0.96594 > 0.96, still clipped to 0.96
    assert rho_from_divergence(0.003) == 0.96
    # D = 0.006: 2**(-0.1) = 0.9330329915, inside [0.875, 0.96]
    assert rho_from_divergence(0.006) == pytest.approx(0.9330329915, abs=1e-9)
    # D = 0.01: 2**(-1/6) = 0.8908987181, inside
    assert rho_from_divergence(0.01) == pytest.approx(0.8908987181, abs=1e-9)
    # D = 0.06 = d_half: 2**(-1) = 0.5, clipped up to rho_min = 0.875
    assert rho_from_divergence(0.06) == 0.875
    # custom bounds: D = 0.06, d_half = 0.06, bounds [0.4, 0.9] -> 0.5 unclipped
    assert rho_from_divergence(0.06, d_half=0.06, rho_min=0.4, rho_max=0.9) == 0.5


@pytest.mark.parametrize(
    "bad",
    [
        dict(divergence=-0.1),
        dict(divergence=float("nan")),
        dict(divergence=0.1, d_half=0.0),
        dict(divergence=0.1, rho_min=0.97),
        dict(divergence=0.1, rho_max=1.5),
    ],
)
def test_rho_from_divergence_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        rho_from_divergence(**bad)


def test_tracker_rho_modes():
    adaptive = BetaTracker()
    assert adaptive.rho(None) == 0.96  # first visit: D = 0 -> 0.96
    assert adaptive.rho(0.006) == pytest.approx(2**-0.1)
    assert adaptive.rho(1.0) == 0.875  # 2**(-16.7) clipped up
    constant = BetaTracker(SPOConfig(rho_mode="constant"))
    assert constant.rho(None) == 0.875 and constant.rho(0.0) == 0.875 and constant.rho(5.0) == 0.875


def test_logprob_divergence_masked_mean_abs():
    then = torch.tensor([-1.0, -2.0, -0.5, float("-inf")])
    now = torch.tensor([-1.5, -1.0, -0.5, 0.0])
    mask = torch.tensor([1, 1, 0, 0])
    # |(-1)-(-1.5)| = 0.5, |(-2)-(-1)| = 1.0; masked-out entries (even -inf) ignored; mean = 1.5 / 2 = 0.75
    assert logprob_divergence(then, now, mask) == pytest.approx(0.75)
    # nothing masked in: no evidence of a shift, D = 0
    assert logprob_divergence(then, now, torch.zeros(4)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        logprob_divergence(then, now[:3], mask[:3])
    with pytest.raises(ValueError, match="0 and 1"):
        logprob_divergence(then, now, torch.tensor([0.5, 1, 0, 0]))
    with pytest.raises(ValueError, match="not finite"):
        logprob_divergence(then, now, torch.tensor([1, 1, 0, 1]))


# ---------------------------------------------------------------------------------------------------------
# Tracker: init, baseline, update


def test_offline_init_with_recipe_numbers():
    # n0 = 8 samples, s = 3 successes, rho_min = 0.875 -> N_init = 1 / 0.125 = 8
    # alpha0 = 8 * (3 + 0.5) / 9 = 28/9 = 3.1111; beta0 = 8 * (8 - 3 + 0.5) / 9 = 44/9 = 4.8889
    tracker = BetaTracker.from_offline({"t": (8, 3)})
    alpha, beta = tracker.alpha_beta("t")
    assert alpha == pytest.approx(28 / 9) and beta == pytest.approx(44 / 9)
    assert alpha + beta == pytest.approx(8.0)  # = N_init
    assert tracker.baseline("t") == pytest.approx(7 / 18)  # 28 / 72
    # n0 = 0 -> the prior, as in the recipe's offline_N = 0 case
    tracker.init_task("u", 0, 0)
    assert tracker.alpha_beta("u") == (0.5, 0.5)
    # rho_min = 0.75 -> N_init = 4; n0 = 1, s = 1: alpha0 = 4 * 1.5 / 2 = 3, beta0 = 4 * 0.5 / 2 = 1
    other = BetaTracker.from_offline({"v": (1, 1)}, SPOConfig(rho_min=0.75))
    assert other.alpha_beta("v") == pytest.approx((3.0, 1.0))


def test_unseen_task_reads_configurable_prior_without_inserting():
    tracker = BetaTracker(SPOConfig(prior_alpha=1.0, prior_beta=3.0))
    assert tracker.baseline("never") == 0.25  # 1 / (1 + 3)
    assert "never" not in tracker and len(tracker) == 0 and tracker.visits("never") == 0


def test_update_formula():
    tracker = BetaTracker()
    # prior (0.5, 0.5); rho = 0.875, r = 1: alpha = 0.4375 + 1 = 1.4375, beta = 0.4375 + 0 = 0.4375
    tracker.update("t", 1.0, 0.875)
    assert tracker.alpha_beta("t") == (1.4375, 0.4375)
    assert tracker.baseline("t") == pytest.approx(1.4375 / 1.875)  # 0.766667
    # rho = 0.5, r = 0: alpha = 0.71875, beta = 0.21875 + 1 = 1.21875
    tracker.update("t", 0.0, 0.5)
    assert tracker.alpha_beta("t") == (0.71875, 1.21875)
    assert tracker.visits("t") == 2


@pytest.mark.parametrize("reward", [-0.1, 1.5, float("nan")])
def test_update_rejects_reward_outside_unit_interval(reward):
    tracker = BetaTracker()
    with pytest.raises(ValueError, match="reward"):
        tracker.update("t", reward, 0.9)
    assert "t" not in tracker


@pytest.mark.parametrize("rho", [0.0, -0.5, 1.01])
def test_update_rejects_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        BetaTracker().update("t", 1.0, rho)


def test_bad_config_and_init_are_rejected():
    with pytest.raises(ValueError, match="prior_alpha"):
        SPOConfig(prior_alpha=0.0)
    with pytest.raises(ValueError, match="rho_mode"):
        SPOConfig(rho_mode="kl")
    with pytest.raises(ValueError, match="rho_min"):
        SPOConfig(rho_min=1.0, rho_max=1.0)  # N_init would be infinite
    with pytest.raises(ValueError, match="n_successes"):
        BetaTracker().init_task("t", 3, 4)
    with pytest.raises(TypeError, match="task_id"):
        BetaTracker().baseline(7)


@FAST
@given(
    offline=st.one_of(st.none(), st.tuples(st.integers(0, 20), st.integers(0, 20))),
    steps=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.875, 0.96)), max_size=50),
)
def test_baseline_stays_in_open_unit_interval(offline, steps):
    tracker = BetaTracker()
    if offline is not None:
        n, s = max(offline), min(offline)
        tracker.init_task("t", n, s)
    assert 0.0 < tracker.baseline("t") < 1.0
    for reward, rho in steps:
        tracker.update("t", reward, rho)
        assert 0.0 < tracker.baseline("t") < 1.0


# ---------------------------------------------------------------------------------------------------------
# Sampling


def test_sampling_weights_by_hand():
    tracker = BetaTracker.from_offline({"b": (8, 3)})
    w = tracker.sampling_weights(["a", "b"])
    # a: prior p = 0.5 -> sqrt(0.25) + 0.05 = 0.55
    # b: p = 7/18 -> sqrt(7/18 * 11/18) = sqrt(77)/18 = 0.487498; + 0.05 = 0.537498
    assert w.tolist() == pytest.approx([0.55, math.sqrt(77) / 18 + 0.05])


def test_sampling_is_deterministic_and_without_replacement():
    tracker = BetaTracker.from_offline({f"t{i}": (8, i) for i in range(9)})
    ids = [f"t{i}" for i in range(9)]
    first = tracker.sample_tasks(ids, 5, torch.Generator().manual_seed(123))
    again = tracker.sample_tasks(ids, 5, torch.Generator().manual_seed(123))
    assert first == again
    assert len(first) == 5 and len(set(first)) == 5 and set(first) <= set(ids)
    # k = pool size: a permutation of the pool
    assert sorted(tracker.sample_tasks(ids, 9, torch.Generator().manual_seed(0))) == sorted(ids)
    # different seeds give different draws for at least one of several seeds
    draws = {tuple(tracker.sample_tasks(ids, 5, torch.Generator().manual_seed(s))) for s in range(5)}
    assert len(draws) > 1
    assert tracker.sample_tasks(ids, 0) == []


def test_sampling_with_replacement_follows_weights():
    # "easy": n0 = 100, s = 0 -> alpha0 = 8 * 0.5/101 = 0.039604, beta0 = 8 * 100.5/101 = 7.960396,
    #   p = 0.0049505, w = sqrt(p (1-p)) + 0.05 = 0.070186 + 0.05 = 0.120186
    # "mid": prior p = 0.5, w = 0.55.  P(mid) = 0.55 / 0.670186 = 0.820668
    tracker = BetaTracker.from_offline({"easy": (100, 0)})
    draw = tracker.sample_tasks(["mid", "easy"], 4000, torch.Generator().manual_seed(7))
    assert len(draw) == 4000  # k > pool size -> with replacement
    assert draw.count("mid") / 4000 == pytest.approx(0.820668, abs=0.03)  # 5 sigma = 0.03


def test_sampling_rejects_bad_requests():
    tracker = BetaTracker()
    with pytest.raises(ValueError, match="duplicates"):
        tracker.sample_tasks(["a", "a"], 1)
    with pytest.raises(ValueError, match="empty pool"):
        tracker.sample_tasks([], 2)
    with pytest.raises(ValueError, match="k must"):
        tracker.sample_tasks(["a"], -1)


# ---------------------------------------------------------------------------------------------------------
# Checkpoint round trip


def test_state_dict_round_trips_exactly_through_json():
    cfg = SPOConfig(prior_alpha=0.7, rho_mode="constant", rho_constant=0.9, sampling_eps=0.01)
    tracker = BetaTracker.from_offline({"a": (8, 3), "b": (5, 5)}, cfg)
    for i, task in enumerate(["a", "c", "a", "b"]):
        tracker.update(task, i % 2, 0.875 + 0.01 * i)
    state = tracker.state_dict()
    restored_state = json.loads(json.dumps(state))  # plain containers only
    restored = BetaTracker()
    restored.load_state_dict(restored_state)
    assert restored.state_dict() == state
    assert restored.cfg == cfg
    for task in ["a", "b", "c", "unseen"]:
        assert restored.alpha_beta(task) == tracker.alpha_beta(task)
        assert restored.visits(task) == tracker.visits(task)
    assert torch.equal(restored.sampling_weights(["a", "b", "c"]), tracker.sampling_weights(["a", "b", "c"]))
    # mutating the state dict afterwards does not touch the tracker
    state["tasks"]["a"]["alpha"] = 99.0
    assert tracker.alpha_beta("a")[0] != 99.0
    bad = copy.deepcopy(restored_state)
    bad["version"] = 99
    with pytest.raises(ValueError, match="version"):
        BetaTracker().load_state_dict(bad)


# ---------------------------------------------------------------------------------------------------------
# SPO advantages


def test_spo_advantages_by_hand_and_baseline_read_before_update():
    tracker = BetaTracker.from_offline({"b": (8, 3)})  # v(b) = 7/18; v(a) = 0.5 (prior)
    batch = [traj("a", 1.0, (2, 3)), traj("b", 0.0), traj("a", 0.0, (1, 1, 1))]
    # A = [1 - 0.5, 0 - 7/18, 0 - 0.5] = [27/54, -21/54, -27/54]  (both "a" episodes read v = 0.5)
    # mean = -21/162 = -7/54; centred = [34/54, -14/54, -20/54]
    # unbiased var = (34^2 + 14^2 + 20^2) / 54^2 / 2 = 1752 / 2916 / 2 = 73/243; std = 0.548098
    std = math.sqrt(73 / 243)
    expect = [34 / 54 / std, -14 / 54 / std, -20 / 54 / std]  # [1.148754, -0.473016, -0.675737]
    out = spo_advantages(batch, tracker)
    assert [len(r) for r in out] == [2, 1, 3] and all(r.dtype == torch.float32 for r in out)
    for row, e in zip(out, expect):
        assert row.tolist() == pytest.approx([e] * len(row), abs=1e-6)
    # the estimator only reads: the tracker is untouched
    assert "a" not in tracker and tracker.visits("b") == 0
    # the update happens in a separate call, after which the same batch would give other values
    spo_update_tracker(batch, tracker, 0.875)
    # a: 0.5 -> (0.4375 + 1, 0.4375) -> (0.875*1.4375, 0.875*0.4375 + 1) = (1.2578125, 1.3828125)
    assert tracker.alpha_beta("a") == (1.2578125, 1.3828125)
    assert values(spo_advantages(batch, tracker))[0][0] != pytest.approx(expect[0], abs=1e-3)


def test_spo_unnormalised_and_bonus_added_after_standardisation():
    tracker = BetaTracker()
    batch = [traj("a", 1.0, (1, 1)), traj("b", 0.0)]
    # raw: [1 - 0.5, 0 - 0.5] = [0.5, -0.5]
    assert values(spo_advantages(batch, tracker, normalize=False)) == [[0.5, 0.5], [-0.5]]
    # normalised: mean 0, unbiased std = sqrt((0.25 + 0.25) / 1) = 0.707107 -> +-0.707107
    # bonus [0, -0.25] and [-0.25] is added after: [0.707107, 0.457107], [-0.957107]
    out = spo_advantages(batch, tracker, turn_bonus=[torch.tensor([0.0, -0.25]), torch.tensor([-0.25])])
    assert out[0].tolist() == pytest.approx([0.707107, 0.457107], abs=1e-6)
    assert out[1].tolist() == pytest.approx([-0.957107], abs=1e-6)


def test_spo_single_trajectory_and_equal_advantages_give_zero_not_nan():
    tracker = BetaTracker()
    # one entry: centred value 0, std taken as 1 -> 0 (torch.std would be NaN)
    assert values(spo_advantages([traj("a", 1.0, (1, 1))], tracker)) == [[0.0, 0.0]]
    # all A equal (two unseen tasks, both r = 1 -> A = 0.5, 0.5): centred 0 -> 0
    assert values(spo_advantages([traj("a", 1.0), traj("b", 1.0)], tracker)) == [[0.0], [0.0]]
    # near-equal values (0.1 three times, which floating point sums inexactly) stay finite and tiny
    tracker.init_task("x", 0, 0)
    batch = [traj("x", 0.6), traj("x", 0.6), traj("x", 0.6)]
    out = torch.cat(spo_advantages(batch, tracker))
    assert torch.isfinite(out).all() and out.abs().max() < 1e-6


def test_spo_rejects_bad_batches():
    tracker = BetaTracker()
    with pytest.raises(ValueError, match="zero turns"):
        spo_advantages([traj("a", 1.0), Trajectory("b", 1.0, [], 0)], tracker)
    with pytest.raises(ValueError, match="reward"):
        spo_advantages([traj("a", 2.0)], tracker)
    with pytest.raises(ValueError, match="empty batch"):
        spo_advantages([], tracker)
    with pytest.raises(ValueError, match="one value per turn"):
        spo_advantages([traj("a", 1.0, (1, 1))], tracker, turn_bonus=[torch.tensor([0.0])])
    with pytest.raises(ValueError, match="not finite"):
        spo_advantages([traj("a", 1.0)], tracker, turn_bonus=[torch.tensor([float("nan")])])
    with pytest.raises(ValueError, match="eps"):
        spo_advantages([traj("a", 1.0)], tracker, eps=0.0)
    with pytest.raises(ValueError, match="rhos"):
        spo_update_tracker([traj("a", 1.0)], tracker, [0.9, 0.9])


def test_failed_update_batch_leaves_tracker_unchanged():
    tracker = BetaTracker()
    tracker.update("a", 1.0, 0.9)
    before = tracker.state_dict()
    with pytest.raises(ValueError, match="rho"):
        spo_update_tracker([traj("a", 1.0), traj("b", 0.0)], tracker, [0.9, 1.5])  # second rho is bad
    assert tracker.state_dict() == before


@FAST
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 16), st.integers(1, 4)), min_size=2, max_size=12))
def test_spo_normalised_has_zero_mean_unit_std(rows):
    tracker = BetaTracker.from_offline({f"t{i}": (16, s) for i, (_, s, _) in enumerate(rows)})
    batch = [traj(f"t{i}", float(r), (1,) * k) for i, (r, _, k) in enumerate(rows)]
    raw = torch.tensor([float(r) - tracker.baseline(f"t{i}") for i, (r, _, _) in enumerate(rows)], dtype=torch.float64)
    assume(raw.std() > 1e-2)  # then std / (std + 1e-8) is 1 within 1e-6
    out = spo_advantages(batch, tracker)
    per_traj = torch.stack([row[0] for row in out]).double()
    assert all(torch.all(row == row[0]) for row in out)  # broadcast to every turn
    assert abs(float(per_traj.mean())) < 1e-5
    assert abs(float(per_traj.std()) - 1.0) < 1e-5


# ---------------------------------------------------------------------------------------------------------
# SPO++ advantages


def _spopp_batch():
    # tau1: task a, r = 1, dispatch baseline 0.5, turns of 3 and 1 tokens, bonus [0, -0.25]
    # tau2: task b, r = 0, dispatch baseline 0.25, one turn of 4 tokens, bonus [0]
    batch = [traj("a", 1.0, (3, 1), baseline=0.5), traj("b", 0.0, (4,), baseline=0.25)]
    bonus = [torch.tensor([0.0, -0.25]), torch.tensor([0.0])]
    return batch, bonus


def test_spo_plus_plus_turn_unit_by_hand():
    batch, bonus = _spopp_batch()
    # a(tau1) = 0.5, a(tau2) = -0.25; turn entries {0.5 + 0, 0.5 - 0.25, -0.25} = {0.5, 0.25, -0.25}
    # mean = 0.5 / 3 = 1/6; centred = [1/3, 1/12, -5/12]
    # unbiased var = (16 + 1 + 25) / 144 / 2 = 7/48; std = 0.381881
    std = math.sqrt(7 / 48)
    out = spo_plus_plus_advantages(batch, None, bonus, SPOPlusPlusConfig())  # default: dispatch + turn
    assert out[0].tolist() == pytest.approx([(1 / 3) / std, (1 / 12) / std], abs=1e-6)  # 0.872872, 0.218218
    assert out[1].tolist() == pytest.approx([(-5 / 12) / std], abs=1e-6)  # -1.091089


def test_spo_plus_plus_token_unit_by_hand():
    batch, bonus = _spopp_batch()
    # token multiset: 0.5 x3, 0.25 x1, -0.25 x4 (N = 8)
    # mean = (1.5 + 0.25 - 1.0) / 8 = 0.09375; centred = [0.40625, 0.15625, -0.34375]
    # sum of squares = 3*0.1650390625 + 0.0244140625 + 4*0.1181640625 = 0.9921875
    # unbiased var = 0.9921875 / 7 = 0.141741; std = 0.376485
    std = math.sqrt(0.9921875 / 7)
    out = spo_plus_plus_advantages(batch, None, bonus, SPOPlusPlusConfig(unit="token"))
    assert out[0].tolist() == pytest.approx([0.40625 / std, 0.15625 / std], abs=1e-6)  # 1.079060, 0.415023
    assert out[1].tolist() == pytest.approx([-0.34375 / std], abs=1e-6)  # -0.913051


def test_spo_plus_plus_trajectory_unit_by_hand():
    batch, bonus = _spopp_batch()
    # a = [0.5, -0.25]; mean 0.125; centred +-0.375; unbiased var = 2 * 0.140625 / 1 = 0.28125
    # std = 0.530330; standardised = +-0.707107; then bonuses: [0.707107, 0.457107], [-0.707107]
    out = spo_plus_plus_advantages(batch, None, bonus, SPOPlusPlusConfig(unit="trajectory"))
    assert out[0].tolist() == pytest.approx([0.707107, 0.457107], abs=1e-6)
    assert out[1].tolist() == pytest.approx([-0.707107], abs=1e-6)


def test_spo_plus_plus_dispatch_vs_consume_baseline():
    tracker = BetaTracker()
    batch = [
        traj("a", 1.0, baseline=tracker.baseline("a")),  # snapshot 0.5
        traj("b", 0.0, baseline=tracker.baseline("b")),
    ]  # snapshot 0.5
    assert [t.baseline for t in batch] == [0.5, 0.5]
    # while the rollouts run, another episode of "a" arrives and fails:
    # a: (0.875*0.5 + 0, 0.875*0.5 + 1) = (0.4375, 1.4375), v = 0.4375/1.875 = 0.233333
    tracker.update("a", 0.0, 0.875)
    # a third task "c", dispatched after that update (unseen, so its snapshot is also 0.5)
    batch.append(traj("c", 1.0, baseline=tracker.baseline("c")))
    # dispatch: a(tau) = {1 - 0.5, 0 - 0.5, 1 - 0.5} = {1/2, -1/2, 1/2}: mean 1/6, centred [1/3, -2/3, 1/3],
    # unbiased var = (1 + 4 + 1) / 9 / 2 = 1/3
    d = math.sqrt(1 / 3)
    dispatch = spo_plus_plus_advantages(batch, tracker, None, SPOPlusPlusConfig(baseline="dispatch"))
    assert [r.item() for r in dispatch] == pytest.approx([1 / 3 / d, -2 / 3 / d, 1 / 3 / d], abs=1e-6)
    # consume reads v(a) = 0.4375 / 1.875 = 7/30 now: a(tau) = {23/30, -1/2, 1/2}, mean = 23/90,
    # centred [46/90, -68/90, 22/90], unbiased var = (2116 + 4624 + 484) / 8100 / 2 = 3612/8100
    c = math.sqrt(3612 / 8100)
    consume = spo_plus_plus_advantages(batch, tracker, None, SPOPlusPlusConfig(baseline="consume"))
    assert [r.item() for r in consume] == pytest.approx([46 / 90 / c, -68 / 90 / c, 22 / 90 / c], abs=1e-6)
    with pytest.raises(ValueError, match="tracker"):
        spo_plus_plus_advantages(batch, None, None, SPOPlusPlusConfig(baseline="consume"))


def test_spo_plus_plus_consume_turn_equals_spo_when_no_bonus_and_one_turn_each():
    # with one turn per trajectory and no bonus, the turn multiset is the trajectory multiset
    tracker = BetaTracker.from_offline({"a": (8, 3), "b": (8, 6)})
    batch = [traj("a", 1.0), traj("b", 0.0), traj("c", 1.0)]
    spo = spo_advantages(batch, tracker)
    spopp = spo_plus_plus_advantages(batch, tracker, None, SPOPlusPlusConfig(baseline="consume"))
    assert values(spopp) == values(spo)


def test_spo_plus_plus_edge_cases():
    # single trajectory, single turn: zero, not NaN
    for unit in ("turn", "token", "trajectory"):
        out = spo_plus_plus_advantages([traj("a", 1.0, baseline=0.3)], None, None, SPOPlusPlusConfig(unit=unit))
        assert values(out) == [[0.0]]
    # all rewards equal and equal baselines, no bonus: all turn entries equal -> zeros
    batch = [traj("a", 0.0, (2, 2), baseline=0.5), traj("b", 0.0, (1,), baseline=0.5)]
    assert values(spo_plus_plus_advantages(batch, None, None)) == [[0.0, 0.0], [0.0]]
    with pytest.raises(ValueError, match="zero turns"):
        spo_plus_plus_advantages([Trajectory("a", 1.0, [], 0, baseline=0.5)], None, None)
    with pytest.raises(ValueError, match="no dispatch-time baseline"):
        spo_plus_plus_advantages([traj("a", 1.0)], None, None)  # dispatch needs a snapshot
    with pytest.raises(ValueError, match="baseline must be in"):
        spo_plus_plus_advantages([traj("a", 1.0, baseline=1.5)], None, None)
    with pytest.raises(ValueError, match="no generated tokens"):
        spo_plus_plus_advantages([traj("a", 1.0, (0,), baseline=0.5)], None, None, SPOPlusPlusConfig(unit="token"))
    with pytest.raises(ValueError, match="unit"):
        SPOPlusPlusConfig(unit="sequence")
    with pytest.raises(ValueError, match="baseline"):
        SPOPlusPlusConfig(baseline="now")


@FAST
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.floats(0.01, 0.99),
            st.lists(st.tuples(st.integers(0, 6), st.sampled_from([0.0, -0.25, -0.1])), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["turn", "token"]),
)
def test_spo_plus_plus_matches_expanded_multiset_reference(rows, unit):
    batch = [traj(f"t{i}", float(r), [n for n, _ in turns], baseline=v) for i, (r, v, turns) in enumerate(rows)]
    bonus = [torch.tensor([c for _, c in turns]) for _, _, turns in rows]
    # independent reference: expand the multiset (one entry per turn, or per token) and use torch.std
    per_turn = [(float(r) - v + c, n) for r, v, turns in rows for n, c in turns]
    entries = [a for a, n in per_turn for _ in range(n if unit == "token" else 1)]
    assume(len(entries) >= 2)
    ref = torch.tensor(entries, dtype=torch.float64)
    mean, std = ref.mean(), ref.std()
    out = torch.cat(spo_plus_plus_advantages(batch, None, bonus, SPOPlusPlusConfig(unit=unit))).double()
    expect = torch.tensor([(a - mean) / (std + 1e-8) for a, _ in per_turn], dtype=torch.float64)
    assert torch.allclose(out, expect, atol=1e-5, rtol=1e-5)
    if std > 1e-2 and unit == "turn":
        assert abs(float(out.mean())) < 1e-5 and abs(float(out.std()) - 1.0) < 1e-5


# ---------------------------------------------------------------------------------------------------------
# Arrival-order updates


def test_arrival_order_matters_when_a_task_appears_twice():
    # task "a" twice: the later-dispatched episode (version 2, success) arrives first,
    # the earlier-dispatched one (version 1, failure) arrives second.
    arrived = [traj("a", 1.0, policy_version=2), traj("a", 0.0, policy_version=1)]
    by_dispatch = sorted(arrived, key=lambda t: t.policy_version)  # the "batch order" alternative
    in_arrival, in_batch = BetaTracker(), BetaTracker()
    update_tracker_in_arrival_order(arrived, in_arrival, lambda t: 0.875)
    update_tracker_in_arrival_order(by_dispatch, in_batch, lambda t: 0.875)
    # arrival [1, 0]: after r=1: (0.4375 + 1, 0.4375) = (1.4375, 0.4375)
    #                 after r=0: (0.875*1.4375, 0.875*0.4375 + 1) = (1.2578125, 1.3828125)
    assert in_arrival.alpha_beta("a") == (1.2578125, 1.3828125)
    # dispatch order [0, 1]: (0.4375, 1.4375) then (0.875*0.4375 + 1, 0.875*1.4375) = (1.3828125, 1.2578125)
    assert in_batch.alpha_beta("a") == (1.3828125, 1.2578125)
    # baselines 1.2578125 / 2.640625 = 0.476331 vs 1.3828125 / 2.640625 = 0.523669: the order matters
    assert in_arrival.baseline("a") == pytest.approx(0.476331, abs=1e-6)
    assert in_batch.baseline("a") == pytest.approx(0.523669, abs=1e-6)


def test_arrival_order_rho_depends_on_trajectory():
    # rho from policy-version lag: current version 3; lag 0 -> 0.96, otherwise 0.875
    seen = []

    def rho_fn(t):
        seen.append(t.task_id)
        return 0.96 if t.policy_version == 3 else 0.875

    tracker = BetaTracker()
    batch = [traj("a", 1.0, policy_version=3), traj("b", 0.0, policy_version=1), traj("a", 0.0, policy_version=2)]
    rhos = update_tracker_in_arrival_order(batch, tracker, rho_fn)
    assert seen == ["a", "b", "a"] and rhos == [0.96, 0.875, 0.875]
    # a: (0.96*0.5 + 1, 0.96*0.5) = (1.48, 0.48); then r=0, rho 0.875: (1.295, 0.42 + 1) = (1.295, 1.42)
    assert tracker.alpha_beta("a") == pytest.approx((1.295, 1.42))
    # b: (0.875*0.5, 0.875*0.5 + 1) = (0.4375, 1.4375)
    assert tracker.alpha_beta("b") == pytest.approx((0.4375, 1.4375))
    assert tracker.visits("a") == 2 and tracker.visits("b") == 1
    # a bad rho partway leaves the tracker as it was
    before = tracker.state_dict()
    with pytest.raises(ValueError, match="rho"):
        update_tracker_in_arrival_order(batch, tracker, lambda t: 0.9 if t.task_id == "a" else 2.0)
    assert tracker.state_dict() == before


# ---------------------------------------------------------------------------------------------------------
# The SPO estimator's KL-adaptive forgetting (trainer/rl/estimators.py), by hand


def _episode(task_id: str, tokens: list[int], mask: list[int], reward: float):
    from trainer.rollout.episode import Episode

    e = Episode(task_id=task_id, reward=reward)
    e.tokens, e.loss_mask = list(tokens), list(mask)
    e.turns = [Turn(start=i, end=i + 1) for i, m in enumerate(mask) if m]
    return e


def _visit(estimator, episodes, score, old_logp_rows):
    """One update as the trainer drives the estimator: before_update, (the policy update), after_update."""
    estimator.before_update(episodes, score)
    estimator.after_update(episodes, [e.trajectory() for e in episodes], {"old_logp_rows": old_logp_rows})


def _no_scoring(sequences):
    raise AssertionError(f"nothing to re-score, asked for {sequences}")


def test_kl_adaptive_rho_before_the_update_from_the_policy_shift_since_the_last_visit_by_hand():
    from trainer.rl.estimators import SPOEstimator

    # recipe: d_half 0.06, rho in [0.875, 0.96]; D measured before the update, against the update's old log-probs
    est = SPOEstimator(RLConfig("spo++"), ShapingConfig(), BetaTracker(SPOConfig(rho_timing="before_update")))
    assert est.needs_old_logp
    a = _episode("a", [10, 11, 12, 13, 14], [0, 1, 1, 0, 1], 1.0)
    b = _episode("b", [20, 21, 22], [0, 1, 1], 0.0)
    # first visits: D = 0, 2**0 = 1 clipped to rho_max 0.96; nothing is re-scored.
    # a: (0.96*0.5 + 1, 0.96*0.5) = (1.48, 0.48); b: (0.48, 1.48)
    _visit(est, [a, b], _no_scoring, [[-1.0, -2.0, -3.0, -0.5], [-0.25, -0.5]])
    assert est.tracker.alpha_beta("a") == pytest.approx((1.48, 0.48), abs=1e-12)
    assert est.tracker.alpha_beta("b") == pytest.approx((0.48, 1.48), abs=1e-12)
    # the log-probs recorded for each response are kept for the task's next visit (targets tokens[1:])
    assert est.last_visit["a"] == ([10, 11, 12, 13, 14], [0, 1, 1, 0, 1], [-1.0, -2.0, -3.0, -0.5])

    asked = []

    def score(sequences):
        asked.append(sequences)
        # one padded fp32 batch, rows in the order asked (a, then b), values exact in fp32; beyond a row's length
        # and off its mask: anything
        return torch.tensor(
            [[-1.0 - 1 / 256, -2.0 + 1 / 128, 7.0, -0.5 - 3 / 256, 99.0], [-0.375, -0.375, 99.0, 99.0, 99.0]]
        )

    c = _episode("c", [30, 31], [0, 1], 1.0)
    a2, b2 = _episode("a", [10, 15, 16], [0, 1, 1], 0.0), _episode("b", [20, 23], [0, 1], 1.0)
    _visit(est, [a2, b2, c], score, [[-0.3, -0.4], [-0.9], [-0.7]])
    # only the revisited tasks are re-scored, with their previous responses, in one call
    assert asked == [[([10, 11, 12, 13, 14], [0, 1, 1, 0, 1]), ([20, 21, 22], [0, 1, 1])]]
    # a: mask[1:] = [1, 1, 0, 1]: D = (1/256 + 1/128 + 3/256) / 3 = 1/128 = 0.0078125;
    #    rho = 2**(-0.0078125/0.06) = 2**(-0.130208333) = 0.913699497321 (inside [0.875, 0.96]);
    #    r = 0: (rho*1.48, rho*0.48 + 1) = (1.352275256035, 1.438575758714)
    assert est.tracker.alpha_beta("a") == pytest.approx((1.352275256035, 1.438575758714), abs=1e-11)
    # b: D = (0.125 + 0.125) / 2 = 0.125; 2**(-2.083) = 0.236, clipped up to rho_min 0.875;
    #    r = 1: (0.875*0.48 + 1, 0.875*1.48) = (1.42, 1.295)
    assert est.tracker.alpha_beta("b") == pytest.approx((1.42, 1.295), abs=1e-12)
    # c: a first visit, 0.96: (1.48, 0.48)
    assert est.tracker.alpha_beta("c") == pytest.approx((1.48, 0.48), abs=1e-12)
    assert est.last_visit["a"] == ([10, 15, 16], [0, 1, 1], [-0.3, -0.4])

    # the state (tracker and last visits) round-trips: a restored estimator re-scores and forgets identically
    restored = SPOEstimator(RLConfig("spo++"), ShapingConfig(), BetaTracker(SPOConfig(rho_timing="before_update")))
    restored.load_state_dict(copy.deepcopy(est.state_dict()))
    assert restored.state_dict() == est.state_dict()


def test_kl_adaptive_rho_after_the_update_by_hand():
    """The recipe's timing (the default): after the update, the updated policy re-scores the previous responses
    and the batch's own in one call; D compares the former with the log-probs recorded after the previous visit's
    update. Same numbers as the before-update case above, so the same tracker values."""
    from trainer.rl.estimators import SPOEstimator

    est = SPOEstimator(RLConfig("spo++"), ShapingConfig(), BetaTracker())
    assert est.rho_timing == "after_update" and not est.needs_old_logp
    a = _episode("a", [10, 11, 12, 13, 14], [0, 1, 1, 0, 1], 1.0)
    b = _episode("b", [20, 21, 22], [0, 1, 1], 0.0)
    asked = []

    def first(sequences):
        asked.append(sequences)
        return torch.tensor([[-1.0, -2.0, -3.0, -0.5], [-0.25, -0.5, 99.0, 99.0]])

    # first visits: D = 0, rho 0.96; the updated policy scores the batch's responses, kept for the next visit
    est.before_update([a, b], first)
    assert asked == []  # nothing is scored before the update
    est.after_update([a, b], [e.trajectory() for e in [a, b]], {})
    assert asked == [[([10, 11, 12, 13, 14], [0, 1, 1, 0, 1]), ([20, 21, 22], [0, 1, 1])]]
    assert est.tracker.alpha_beta("a") == pytest.approx((1.48, 0.48), abs=1e-12)
    assert est.tracker.alpha_beta("b") == pytest.approx((0.48, 1.48), abs=1e-12)
    assert est.last_visit["a"] == ([10, 11, 12, 13, 14], [0, 1, 1, 0, 1], [-1.0, -2.0, -3.0, -0.5])
    assert est.last_visit["b"] == ([20, 21, 22], [0, 1, 1], [-0.25, -0.5])

    def second(sequences):
        asked.append(sequences)
        # rows: previous a, previous b (the revisits), then this batch's a2, b2, c; values exact in fp32
        return torch.tensor(
            [
                [-1.0 - 1 / 256, -2.0 + 1 / 128, 7.0, -0.5 - 3 / 256],
                [-0.375, -0.375, 99.0, 99.0],
                [-0.3125, -0.4375, 99.0, 99.0],
                [-0.875, 99.0, 99.0, 99.0],
                [-0.6875, 99.0, 99.0, 99.0],
            ]
        )

    c = _episode("c", [30, 31], [0, 1], 1.0)
    a2, b2 = _episode("a", [10, 15, 16], [0, 1, 1], 0.0), _episode("b", [20, 23], [0, 1], 1.0)
    asked.clear()
    est.before_update([a2, b2, c], second)
    est.after_update([a2, b2, c], [e.trajectory() for e in [a2, b2, c]], {})
    assert asked == [
        [
            ([10, 11, 12, 13, 14], [0, 1, 1, 0, 1]),
            ([20, 21, 22], [0, 1, 1]),
            ([10, 15, 16], [0, 1, 1]),
            ([20, 23], [0, 1]),
            ([30, 31], [0, 1]),
        ]
    ]
    # a: D = 1/128, rho = 0.913699497321, r = 0; b: D = 0.125, rho clipped to 0.875, r = 1; c: first visit
    assert est.tracker.alpha_beta("a") == pytest.approx((1.352275256035, 1.438575758714), abs=1e-11)
    assert est.tracker.alpha_beta("b") == pytest.approx((1.42, 1.295), abs=1e-12)
    assert est.tracker.alpha_beta("c") == pytest.approx((1.48, 0.48), abs=1e-12)
    assert est.last_visit["a"] == ([10, 15, 16], [0, 1, 1], [-0.3125, -0.4375])
    assert est.last_visit["c"] == ([30, 31], [0, 1], [-0.6875])
    # after_update needs this update's score from before_update
    with pytest.raises(RuntimeError, match="before_update"):
        est.after_update([c], [c.trajectory()], {})


class _ShiftingPolicy:
    """A stand-in policy whose log-prob of every token is `offset`; an update moves it by a given shift."""

    def __init__(self):
        self.offset = 0.0

    def score(self, sequences):
        width = max(len(tokens) for tokens, _ in sequences) - 1
        return torch.full((len(sequences), width), self.offset)


@pytest.mark.parametrize("timing, rho", [("after_update", 0.96), ("before_update", 0.875)])
def test_the_two_rho_timings_measure_windows_one_update_apart(timing, rho):
    """Task a is visited at updates 0 and 2; only update 0 moves the policy (by 0.125 per token). After the update
    (the recipe) the window is updates 1-2: D = 0, rho = 0.96. Before it, updates 0-1: D = 0.125,
    2**(-0.125/0.06) = 0.236, clipped to 0.875."""
    from trainer.rl.estimators import SPOEstimator

    est, policy = (
        SPOEstimator(RLConfig("spo"), ShapingConfig(), BetaTracker(SPOConfig(rho_timing=timing))),
        _ShiftingPolicy(),
    )
    for task, reward, shift in [("a", 1.0, 0.125), ("b", 0.0, 0.0), ("a", 0.0, 0.0)]:
        episodes = [_episode(task, [1, 2, 3], [0, 1, 1], reward)]
        est.before_update(episodes, policy.score)
        old_logp_rows = [[policy.offset] * 2]  # what the update recorded: the policy it started from
        policy.offset += shift
        est.after_update(episodes, [e.trajectory() for e in episodes], {"old_logp_rows": old_logp_rows})
    # a: (0.96*0.5 + 1, 0.96*0.5) = (1.48, 0.48), then r = 0: (rho*1.48, rho*0.48 + 1)
    assert est.tracker.alpha_beta("a") == pytest.approx((rho * 1.48, rho * 0.48 + 1), abs=1e-12)


def test_rho_timing_is_checked():
    from trainer.rl.estimators import SPOEstimator

    with pytest.raises(ValueError, match="rho_timing"):
        SPOEstimator(RLConfig("spo"), ShapingConfig(), BetaTracker(SPOConfig(rho_timing="during")))


def test_constant_rho_re_scores_nothing_and_keeps_no_responses():
    from trainer.rl.estimators import SPOEstimator

    est = SPOEstimator(RLConfig("spo"), ShapingConfig(), BetaTracker(SPOConfig(rho_mode="constant")))
    assert not est.needs_old_logp
    for reward in (1.0, 0.0):
        episodes = [_episode("a", [1, 2], [0, 1], reward)]
        est.before_update(episodes, _no_scoring)
        est.after_update(episodes, [e.trajectory() for e in episodes], {})
    # (0.875*0.5 + 1, 0.875*0.5) = (1.4375, 0.4375), then r = 0: (1.2578125, 1.3828125)
    assert est.tracker.alpha_beta("a") == (1.2578125, 1.3828125) and est.last_visit == {}
