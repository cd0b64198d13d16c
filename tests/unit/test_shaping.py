"""Tests of trainer/rl/shaping.py against hand-computed per-turn penalties."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from builders import turns
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.rl.shaping import ShapingConfig, length_penalties, overlong_flags, tool_penalties, turn_penalties
from trainer.rl.trajectory import Trajectory, Turn


def turns_of(lengths, invalid=(), exec_error=()):
    """Consecutive turns with the given generated lengths (a 3-token observation between turns)."""
    return turns(lengths, gap=3, invalid=invalid, exec_error=exec_error)


def traj(spans, task="t"):
    return Trajectory(task_id=task, reward=0.0, turns=spans, length=spans[-1].end if spans else 0)


# Threshold 2048, ramp 2048 (the default = threshold), max 0.5:
#   L = 2048 -> 0 (at the threshold, not over it)
#   L = 2560 -> -0.5 * 512/2048  = -0.125
#   L = 3072 -> -0.5 * 1024/2048 = -0.25
#   L = 4096 -> -0.5 * min(1, 1) = -0.5;  L = 9000 -> -0.5 (saturated)
#   the last turn (here L = 9000) is exempt -> 0
def test_length_penalty_graded_hand_example():
    cfg = ShapingConfig()
    turns = turns_of([2048, 2560, 3072, 4096, 9000, 100, 9000])
    assert length_penalties(turns, cfg).tolist() == [0.0, -0.125, -0.25, -0.5, -0.5, 0.0, 0.0]
    assert overlong_flags(turns, cfg).tolist() == [False, True, True, True, True, False, True]


def test_length_penalty_ramp_variants():
    turns = turns_of([2049, 2100, 3000, 10])
    # flat (ramp 0): any excess gives the full -0.5
    assert length_penalties(turns, ShapingConfig(length_ramp=0)).tolist() == [-0.5, -0.5, -0.5, 0.0]
    # ramp 100, max 0.4: -0.4 * min(1, [1, 52, 952]/100) = [-0.004, -0.208, -0.4]
    got = length_penalties(turns, ShapingConfig(length_ramp=100, length_penalty_max=0.4))
    assert got.tolist() == pytest.approx([-0.004, -0.208, -0.4, 0.0])
    # threshold 16 at embedded scale, ramp defaults to 16: L = 24 -> -0.5 * 8/16 = -0.25
    small = ShapingConfig(length_threshold=16)
    assert small.ramp == 16
    assert length_penalties(turns_of([24, 16, 40]), small).tolist() == [-0.25, 0.0, 0.0]
    # the ramp default follows the threshold through dataclasses.replace
    assert dataclasses.replace(small, length_threshold=8).ramp == 8


def test_last_turn_exemption_can_be_turned_off():
    turns = turns_of([10, 5000])
    assert length_penalties(turns, ShapingConfig()).tolist() == [0.0, 0.0]
    assert length_penalties(turns, ShapingConfig(exempt_last_turn=False)).tolist() == [0.0, -0.5]
    # a single-turn trajectory is its own last turn
    assert length_penalties(turns_of([5000]), ShapingConfig()).tolist() == [0.0]


def test_tool_penalty_hand_example():
    turns = turns_of([5, 5, 5, 5], invalid={1, 2}, exec_error={2, 3})
    # invalid: 1 and 2; exec error: 2 and 3 -> with exec errors counted, turns 1, 2, 3 get -0.5
    assert tool_penalties(turns, ShapingConfig()).tolist() == [0.0, -0.5, -0.5, -0.5]
    assert tool_penalties(turns, ShapingConfig(count_exec_errors=False)).tolist() == [0.0, -0.5, -0.5, 0.0]
    assert tool_penalties(turns, ShapingConfig(tool_error_penalty=0.1)).tolist() == pytest.approx(
        [0.0, -0.1, -0.1, -0.1]
    )
    # no exemption for the last turn: turn 3 (the last) is penalised above


def test_turn_penalties_combine_and_clip():
    # turn 0: L=2560 -> c_len -0.125, no error          -> -0.125 (inside the clip)
    # turn 1: L=2560 -> -0.125, invalid -0.5 = -0.625    -> -0.25
    # turn 2: L=9000 -> -0.5,  exec error -0.5 = -1.0    -> -0.25 (both saturate at -clip)
    # turn 3: L=100, invalid                             -> -0.5 -> -0.25
    # turn 4 (last): L=9000 exempt, no error             -> 0
    turns = turns_of([2560, 2560, 9000, 100, 9000], invalid={1, 3}, exec_error={2})
    second = turns_of([3072, 10])  # -0.25 (length only, exactly at the clip), 0
    out = turn_penalties([traj(turns), traj(second)], ShapingConfig())
    assert [x.dtype for x in out] == [torch.float32, torch.float32]
    assert out[0].tolist() == [-0.125, -0.25, -0.25, -0.25, 0.0]
    assert out[1].tolist() == [-0.25, 0.0]
    # a wider clip lets the sum through: turn 2 gives -1.0 under clip 1.0
    assert turn_penalties([traj(turns)], ShapingConfig(clip=1.0))[0].tolist() == [-0.125, -0.625, -1.0, -0.5, 0.0]


def test_switches_off_give_zeros():
    turns = turns_of([9000, 9000, 9000], invalid={0, 1, 2}, exec_error={0})
    off = ShapingConfig(length_penalty=False, tool_penalty=False)
    assert turn_penalties([traj(turns)], off)[0].tolist() == [0.0, 0.0, 0.0]
    assert length_penalties(turns, off).tolist() == [0.0, 0.0, 0.0]
    assert tool_penalties(turns, off).tolist() == [0.0, 0.0, 0.0]
    # only one switch on: only that penalty
    assert turn_penalties([traj(turns)], ShapingConfig(tool_penalty=False))[0].tolist() == [-0.25, -0.25, 0.0]
    no_len = ShapingConfig(length_penalty=False, clip=1.0)
    assert turn_penalties([traj(turns)], no_len)[0].tolist() == [-0.5, -0.5, -0.5]
    # overlong flags are a fact about the turns, logged whatever the switch
    assert overlong_flags(turns, off).tolist() == [True, True, True]


def test_empty_inputs():
    assert turn_penalties([], ShapingConfig()) == []
    out = turn_penalties([traj([])], ShapingConfig())
    assert out[0].shape == (0,) and out[0].dtype == torch.float32
    assert overlong_flags([], ShapingConfig()).shape == (0,)


def test_negative_turn_length_is_rejected():
    bad = [Turn(start=10, end=4)]
    with pytest.raises(ValueError, match="turn 0.*start=10 > end=4"):
        length_penalties(bad, ShapingConfig())
    with pytest.raises(ValueError, match="task 'x'.*turn 0"):
        turn_penalties([Trajectory(task_id="x", reward=1.0, turns=bad, length=10)], ShapingConfig())


@pytest.mark.parametrize(
    "field, value",
    [
        ("length_threshold", -1),
        ("length_threshold", 2.5),
        ("length_threshold", True),
        ("length_ramp", -5),
        ("length_penalty_max", -0.5),
        ("tool_error_penalty", -0.1),
        ("clip", -0.25),
        ("clip", float("nan")),
        ("length_penalty_max", float("inf")),
        ("length_penalty", "yes"),
        ("exempt_last_turn", 1),
        ("count_exec_errors", None),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"ShapingConfig.{field}"):
        ShapingConfig(**{field: value})


# Magnitudes of 0 or at least 0.01 (a tiny one like 1e-117 would underflow to 0 in fp32 and say nothing).
MAGNITUDE = st.one_of(st.just(0.0), st.floats(0.01, 2.0))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20000), st.booleans(), st.booleans()), max_size=8),
    st.integers(0, 5000),
    st.one_of(st.none(), st.integers(0, 5000)),
    MAGNITUDE,
    MAGNITUDE,
    MAGNITUDE,
    st.booleans(),
    st.booleans(),
)
def test_penalties_are_bounded_and_monotone(spec, threshold, ramp, len_max, tool_max, clip, exempt, count_exec):
    cfg = ShapingConfig(
        length_threshold=threshold,
        length_ramp=ramp,
        length_penalty_max=len_max,
        tool_error_penalty=tool_max,
        clip=clip,
        exempt_last_turn=exempt,
        count_exec_errors=count_exec,
    )
    turns = turns_of(
        [s[0] for s in spec],
        invalid={k for k, s in enumerate(spec) if s[1]},
        exec_error={k for k, s in enumerate(spec) if s[2]},
    )
    c_len, c_tool = length_penalties(turns, cfg), tool_penalties(turns, cfg)
    (total,) = turn_penalties([traj(turns)], cfg)
    assert total.shape == (len(turns),)
    assert torch.all(c_len <= 0) and torch.all(c_len >= -len_max - 1e-6)
    assert torch.all(c_tool <= 0) and torch.all(c_tool >= -tool_max - 1e-6)
    assert torch.all(total <= 0) and torch.all(total >= -clip - 1e-6)
    # a turn is penalised for length exactly when it is overlong (and not the exempt last turn)
    flagged = overlong_flags(turns, cfg)
    if exempt and turns:
        flagged[-1] = False
    if len_max > 0:
        assert torch.equal(c_len < 0, flagged)
    # the length penalty never decreases in magnitude as the turn grows
    lengths = torch.tensor([turn.length for turn in turns])
    order = torch.argsort(lengths[:-1] if exempt else lengths, stable=True)
    ordered = (c_len[:-1] if exempt else c_len)[order]
    assert torch.all(ordered[1:] <= ordered[:-1] + 1e-7)
