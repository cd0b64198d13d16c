"""The trainer's single advantage call: estimator + penalties, broadcast onto action tokens."""

import math

import pytest
import torch

from trainer.rl.advantages import compute_advantages
from trainer.rl.config import GiGPOConfig, RLConfig, ShapingConfig, SPOConfig
from trainer.rl.spo import BetaTracker
from trainer.rl.trajectory import Trajectory, Turn

OFF = ShapingConfig(length_penalty=False, tool_penalty=False)
"""No per-turn penalties."""


def _batch():
    # trajectory 0: success, two turns: tokens [2,5) then [8,10); the first turn is 3 tokens long (over a
    # threshold of 2, ramp 1 -> full -0.5), the second is the last turn (exempt) but a tool error (-0.5).
    t0 = Trajectory("a", 1.0, [Turn(2, 5), Turn(8, 10, exec_error=True)], length=12, baseline=0.5)
    # trajectory 1: failure, one short turn [1,3).
    t1 = Trajectory("b", 0.0, [Turn(1, 3)], length=6, baseline=0.5)
    return [t0, t1]


def test_spo_plus_plus_with_penalties_by_hand():
    shaping = ShapingConfig(length_threshold=2, length_ramp=1)
    adv, stats = compute_advantages(_batch(), RLConfig("spo++"), shaping, tracker=BetaTracker())
    # a = r - 0.5: +0.5 (t0), -0.5 (t1); penalties clipped to -0.25 on both turns of t0:
    # turn values 0.25, 0.25, -0.5; mean 0, unbiased std = sqrt((0.0625 + 0.0625 + 0.25) / 2) = sqrt(0.1875)
    s = math.sqrt(0.1875)
    expected = torch.zeros(2, 12)
    expected[0, 2:5] = 0.25 / s
    expected[0, 8:10] = 0.25 / s
    expected[1, 1:3] = -0.5 / s
    assert torch.allclose(adv, expected, atol=1e-6)
    assert stats["tool_error_rate"] == pytest.approx(1 / 3)
    assert stats["overlong_rate"] == pytest.approx(1 / 3)  # only turn 0 of t0 is > 2 tokens
    assert stats["penalty_mean"] == pytest.approx(-0.5 / 3)


def test_plain_spo_without_penalties_reads_the_tracker():
    tracker = BetaTracker()  # prior 0.5/0.5: baseline 0.5 for both tasks
    adv, _ = compute_advantages(_batch(), RLConfig("spo"), OFF, tracker=tracker)
    # A = [+0.5, -0.5], mean 0, std sqrt(0.5): +-0.7071 on every action token
    assert torch.allclose(adv[0, 2:5], torch.full((3,), 0.5 / math.sqrt(0.5)), atol=1e-6)
    assert torch.allclose(adv[1, 1:3], torch.full((2,), -0.5 / math.sqrt(0.5)), atol=1e-6)
    assert adv[0, :2].abs().sum() == 0 and adv[0, 5:8].abs().sum() == 0  # prompt and observation tokens


def test_group_estimator_adds_penalties_after_its_own_normalisation():
    batch = _batch()
    for t in batch:
        t.group_id = "g"
    plain, _ = compute_advantages(batch, RLConfig("grpo", group_size=2), OFF)
    shaped, _ = compute_advantages(
        batch, RLConfig("grpo", group_size=2), ShapingConfig(length_threshold=2, length_ramp=1)
    )
    diff = shaped - plain
    assert torch.allclose(diff[0, 2:5], torch.full((3,), -0.25)) and torch.allclose(
        diff[0, 8:10], torch.full((2,), -0.25)
    )
    assert diff[1].abs().sum() == 0


def test_a_cells_gigpo_settings_reach_the_estimator():
    """rl.gigpo.penalty and rl.gigpo.mode on the issue's example: two failed episodes from "init", A's second action
    invalid. Episode term (cross steps, mean_norm): R = -0.1, 0 -> -0.05, +0.05; the step term at "init" is 0
    under "own_turn" and -0.0475, +0.0475 under "discounted"; mean_std_norm scales both terms."""
    from builders import trajectory

    trajs = [
        trajectory("t", 0.0, [3, 3], invalid=(1,), states=["init", "a1"], group_id="g"),
        trajectory("t", 0.0, [3, 3], states=["init", "b1"], group_id="g"),
    ]

    def per_turn(**gigpo):
        cell = RLConfig(estimator="gigpo", group_size=2, gigpo=GiGPOConfig(**gigpo))
        tokens, _ = compute_advantages(trajs, cell, OFF)
        return [float(row[3 * k]) for row in tokens for k in range(2)]  # A's two turns, then B's

    assert per_turn() == pytest.approx([-0.05, -0.05, 0.05, 0.05], abs=1e-7)
    assert per_turn(penalty="discounted") == pytest.approx([-0.0975, -0.05, 0.0975, 0.05], abs=1e-7)
    # mean_std_norm, own_turn: episode entries -0.1, -0.1, 0, 0: sigma = sqrt(4 * 0.0025 / 3) = 0.057735
    #   -> +-0.05 / 0.057735 = +-0.866025 (sqrt(3)/2); step term 0
    e = 0.05 / (math.sqrt(0.01 / 3) + 1e-6)
    assert per_turn(mode="mean_std_norm") == pytest.approx([-e, -e, e, e], abs=1e-6)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="'ppo'"):
        RLConfig("ppo")
    with pytest.raises(ValueError, match="tracker"):
        compute_advantages(_batch(), RLConfig("spo"), OFF)


def test_the_estimators_give_the_advantages_on_the_batch_targets():
    """`Estimator.advantages` is `compute_advantages` shifted onto the update's targets (tokens[1:]) and zeroed off
    the loss mask; `make_estimator` picks the SPO estimator (with its tracker) or the stateless group one."""
    from types import SimpleNamespace

    from trainer.rl.estimators import GroupEstimator, SPOEstimator, make_estimator

    spo = make_estimator(RLConfig(estimator="spo++"), ShapingConfig(length_threshold=2, length_ramp=1))
    assert isinstance(spo, SPOEstimator) and spo.sample_tasks is not None and spo.dispatch_baseline("a") == 0.5
    uniform = RLConfig(estimator="spo", spo=SPOConfig(prioritised_sampling=False))
    assert make_estimator(uniform, OFF).sample_tasks is None
    group = make_estimator(RLConfig(estimator="grpo", group_size=2), OFF)
    assert isinstance(group, GroupEstimator) and group.sample_tasks is None and group.dispatch_baseline("a") is None
    assert group.state_dict() == {} and group.baseline_informed(_batch()) is None

    mask = torch.zeros(2, 11)
    mask[0, [1, 2, 3, 7, 8]] = 1  # targets of tokens 2..4 and 8..9: the turns' action tokens
    mask[1, [0, 1]] = 1
    adv, stats = spo.advantages(_batch(), SimpleNamespace(width=11, loss_mask=mask))
    full, expected_stats = compute_advantages(_batch(), spo.cfg, spo.shaping, spo.tracker, width=12)
    assert torch.equal(adv, full[:, 1:] * mask) and stats == expected_stats
    assert spo.baseline_informed(_batch()) == [False, False]  # never visited, no offline stats
