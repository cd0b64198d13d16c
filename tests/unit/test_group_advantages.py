"""Tests of GRPO, GiGPO and GraphGPO (trainer/rl/group_advantages.py).

Hand-computed examples carry their arithmetic in comments; hypothesis checks the structural properties
(omega=0 GiGPO == GRPO, zero-sum mean_norm advantages, permutation equivariance, Dijkstra against a
Bellman-Ford reference, finiteness on arbitrary groups).
"""

from __future__ import annotations

import math

import pytest
import torch
from builders import trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.rl.config import STEP_PENALTIES, GiGPOConfig, GraphGPOConfig, GRPOConfig
from trainer.rl.group_advantages import (
    SUCCESS,
    discounted_returns,
    distances_to_success,
    episode_return,
    gigpo_advantages,
    gigpo_step_advantages,
    graph_advantages,
    graph_edge_returns,
    graphgpo_advantages,
    grpo_advantages,
    step_returns,
    step_rewards,
    transition_edges,
)
from trainer.rl.trajectory import Trajectory, turn_values_to_tokens

torch.set_num_threads(1)
EPS = 1e-6


def make_traj(
    states: list[str],
    success: bool,
    invalid: tuple[int, ...] = (),
    final: str = "end",
    group: str | None = "g",
    task: str = "task",
) -> Trajectory:
    """A trajectory whose turn k was taken in states[k]; turns listed in `invalid` had invalid actions.

    Each turn spans 3 tokens so the records also work with turn_values_to_tokens.
    """
    return trajectory(
        task,
        1.0 if success else 0.0,
        [3] * len(states),
        invalid=invalid,
        states=states,
        final_state=final,
        group_id=group,
    )


def as_lists(values: list[torch.Tensor]) -> list[list[float]]:
    return [v.tolist() for v in values]


def assert_close(actual: list[torch.Tensor], expected: list[list[float]], tol: float = 1e-5) -> None:
    assert len(actual) == len(expected)
    for row, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == (len(e),), f"row {row}: shape {tuple(a.shape)} vs {len(e)} turns"
        assert torch.allclose(a.double(), torch.tensor(e, dtype=torch.float64), atol=tol, rtol=0), (
            f"row {row}: {a.tolist()} != {e}"
        )


# --------------------------------------------------------------------------------------------- GRPO


def grpo_example() -> list[Trajectory]:
    """Group g: A (2 turns, success) R=10; B (1 turn, fail, 1 invalid) R=-0.1; C (3 turns, fail) R=0.
    Group h: D (2 turns, success, 1 invalid) R=9.9, alone. Input order interleaves the groups: A, D, B, C."""
    a = make_traj(["s0", "s1"], success=True)
    d = make_traj(["x", "y"], success=True, invalid=(0,), group="h")
    b = make_traj(["s0"], success=False, invalid=(0,))
    c = make_traj(["s0", "s2", "s3"], success=False)
    return [a, d, b, c]


def test_episode_return_counts_success_and_invalid_turns():
    trajs = grpo_example()
    # A: 10*1 - 0.1*0 = 10; D: 10*1 - 0.1*1 = 9.9; B: 10*0 - 0.1*1 = -0.1; C: 0
    assert [episode_return(t, 10.0, 0.1) for t in trajs] == pytest.approx([10.0, 9.9, -0.1, 0.0])
    # both terms can be switched off
    assert [episode_return(t, 0.0, 0.0) for t in trajs] == [0.0, 0.0, 0.0, 0.0]


def test_grpo_per_trajectory_statistics_hand_computed():
    trajs = grpo_example()
    # group g returns 10, -0.1, 0: mu = 9.9/3 = 3.3 -> centred 6.7, -3.4, -3.3
    # group h has one member: mu = 0, sigma = 1 -> D gets its return 9.9
    out = grpo_advantages(trajs, GRPOConfig(mode="mean_norm", cross_steps=False))
    assert_close(out, [[6.7, 6.7], [9.9, 9.9], [-3.4], [-3.3, -3.3, -3.3]])
    # unbiased sigma^2 = (6.7^2 + 3.4^2 + 3.3^2) / 2 = (44.89 + 11.56 + 10.89) / 2 = 33.67
    sd = math.sqrt(33.67)
    out = grpo_advantages(trajs, GRPOConfig(mode="mean_std_norm", cross_steps=False))
    assert_close(out, [[6.7 / (sd + EPS)] * 2, [9.9 / (1 + EPS)] * 2, [-3.4 / (sd + EPS)], [-3.3 / (sd + EPS)] * 3])
    assert all(t.dtype == torch.float32 for t in out)


def test_grpo_cross_steps_statistics_hand_computed():
    trajs = grpo_example()
    # cross steps: entries A,A,B,C,C,C = 10, 10, -0.1, 0, 0, 0 -> mu = 19.9/6 = 3.31667
    mu = 19.9 / 6
    out = grpo_advantages(trajs, GRPOConfig(mode="mean_norm", cross_steps=True))
    assert_close(out, [[10 - mu] * 2, [9.9] * 2, [-0.1 - mu], [-mu] * 3])  # 6.68333, 9.9, -3.41667, -3.31667
    # unbiased variance over the 6 entries: (2*(10-mu)^2 + (-0.1-mu)^2 + 3*mu^2) / 5 = 26.8017, sigma = 5.17704
    sd = math.sqrt((2 * (10 - mu) ** 2 + (-0.1 - mu) ** 2 + 3 * mu**2) / 5)
    assert sd == pytest.approx(5.17704, abs=1e-5)
    out = grpo_advantages(trajs)  # defaults: mean_std_norm, cross steps
    assert_close(out, [[(10 - mu) / sd] * 2, [9.9 / (1 + EPS)] * 2, [(-0.1 - mu) / sd], [-mu / sd] * 3])


def test_grpo_all_equal_returns_give_exact_zeros():
    # three failures with one invalid turn each: returns all -0.1 -> no signal, exactly 0 (no (x-mu)/eps noise)
    trajs = [make_traj(["s"] * n, success=False, invalid=(0,)) for n in (1, 2, 3)]
    for mode in ("mean_norm", "mean_std_norm"):
        for cross in (True, False):
            out = grpo_advantages(trajs, GRPOConfig(mode=mode, cross_steps=cross))
            assert all(bool((t == 0).all()) for t in out), (mode, cross, as_lists(out))


def test_grpo_rewards_switched_off_give_zeros():
    out = grpo_advantages(grpo_example(), GRPOConfig(success_reward=0.0, invalid_penalty=0.0))
    assert all(bool((t == 0).all()) for t in out)


def test_output_broadcasts_onto_tokens():
    trajs = grpo_example()
    out = grpo_advantages(trajs, GRPOConfig(mode="mean_norm", cross_steps=False))
    tokens = turn_values_to_tokens(trajs, out)
    # C has 3 turns of 3 tokens each, all carrying -3.3
    assert tokens.shape == (4, 9)
    assert torch.allclose(tokens[3], torch.full((9,), -3.3))
    assert torch.allclose(tokens[2, :3], torch.full((3,), -3.4)) and bool((tokens[2, 3:] == 0).all())


# --------------------------------------------------------------------------------------------- GiGPO


def gigpo_example() -> list[Trajectory]:
    """One group with shared anchor states s0 and s1, a singleton s2, and s0 revisited inside T3."""
    t1 = make_traj(["s0", "s1"], success=True)
    t2 = make_traj(["s0", "s2", "s1"], success=False, invalid=(1,))
    t3 = make_traj(["s0", "s0"], success=False)
    return [t1, t2, t3]


def test_step_rewards_and_discounted_returns_hand_computed():
    t1, t2, t3 = gigpo_example()
    # T1: r = [0, 10]; R_1 = 10, R_0 = 0 + 0.95*10 = 9.5
    assert step_rewards(t1, 10.0, 0.1).tolist() == [0.0, 10.0]
    assert discounted_returns(step_rewards(t1, 10.0, 0.1), 0.95).tolist() == pytest.approx([9.5, 10.0])
    # T2: r = [0, -0.1, 0]; R_2 = 0, R_1 = -0.1, R_0 = 0.95 * -0.1 = -0.095
    assert step_rewards(t2, 10.0, 0.1).tolist() == pytest.approx([0.0, -0.1, 0.0])
    assert discounted_returns(step_rewards(t2, 10.0, 0.1), 0.95).tolist() == pytest.approx([-0.095, -0.1, 0.0])
    # a success whose last turn is also invalid gets both: 10 - 0.1 = 9.9
    both = make_traj(["a"], success=True, invalid=(0,))
    assert step_rewards(both, 10.0, 0.1).tolist() == pytest.approx([9.9])
    # gamma = 0 keeps only the immediate reward; gamma = 1 sums the tail: [1, 2, 3] -> [6, 5, 3]
    r = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert discounted_returns(r, 0.0).tolist() == [1.0, 2.0, 3.0]
    assert discounted_returns(r, 1.0).tolist() == [6.0, 5.0, 3.0]


def test_step_returns_place_the_penalty_as_each_reading_says():
    t1, t2, _ = gigpo_example()
    # "discounted" (the penalty is a reward): T2 [-0.095, -0.1, 0], as discounted_returns(step_rewards) above
    assert step_returns(t2, GiGPOConfig(penalty="discounted")).tolist() == pytest.approx([-0.095, -0.1, 0.0])
    # "own_turn" (verl-agent, the default): environment returns [0, 0, 0], minus each turn's own 0.1: [0, -0.1, 0]
    assert step_returns(t2, GiGPOConfig()).tolist() == pytest.approx([0.0, -0.1, 0.0])
    # without penalties the readings agree: T1 [9.5, 10]
    assert step_returns(t1, GiGPOConfig()).tolist() == step_returns(t1, GiGPOConfig(penalty="discounted")).tolist()
    # an invalid turn before a success: env [0.95 * 10, 10] = [9.5, 10]; own_turn [9.5 - 0.1, 10] = [9.4, 10];
    # discounted: r = [-0.1, 10] -> [-0.1 + 9.5, 10] = [9.4, 10] (the same: nothing is invalid after turn 0)
    early = make_traj(["a", "b"], success=True, invalid=(0,))
    assert step_returns(early, GiGPOConfig()).tolist() == pytest.approx([9.4, 10.0])
    assert step_returns(early, GiGPOConfig(penalty="discounted")).tolist() == pytest.approx([9.4, 10.0])
    # an invalid last turn of a success: own_turn [9.5, 10 - 0.1] = [9.5, 9.9]; discounted: r = [0, 9.9] ->
    # [0.95 * 9.9, 9.9] = [9.405, 9.9]
    late = make_traj(["a", "b"], success=True, invalid=(1,))
    assert step_returns(late, GiGPOConfig()).tolist() == pytest.approx([9.5, 9.9])
    assert step_returns(late, GiGPOConfig(penalty="discounted")).tolist() == pytest.approx([9.405, 9.9])


def test_gigpo_invalid_action_penalty_worked_example_both_readings():
    """The issue's example: two failed episodes from "init", A's second action invalid, later states distinct."""
    a = make_traj(["init", "a1"], success=False, invalid=(1,))
    b = make_traj(["init", "b1"], success=False)
    # verl-agent ("own_turn"): A's returns [0, 0] - [0, 0.1] = [0, -0.1], B's [0, 0]; cluster init = {0, 0}:
    #   equal, so exactly 0; a1 and b1 are singletons: 0
    assert as_lists(gigpo_step_advantages([a, b], GiGPOConfig())) == [[0.0, 0.0], [0.0, 0.0]]
    # "discounted": A's r = [0, -0.1] -> returns [-0.095, -0.1]; cluster init = {-0.095, 0}: mu = -0.0475
    #   -> A -0.0475, B +0.0475; singletons 0
    assert_close(
        gigpo_step_advantages([a, b], GiGPOConfig(penalty="discounted")), [[-0.0475, 0.0], [0.0475, 0.0]], tol=1e-12
    )
    # The episode term is the same in both: R_A = -0.1, R_B = 0, each counted twice (cross steps): mu = -0.05
    #   -> A -0.05, B +0.05 on every turn; omega = 1 adds the step term
    assert_close(gigpo_advantages([a, b]), [[-0.05, -0.05], [0.05, 0.05]], tol=1e-7)
    assert_close(
        gigpo_advantages([a, b], GiGPOConfig(penalty="discounted")), [[-0.0975, -0.05], [0.0975, 0.05]], tol=1e-7
    )
    # mean_std_norm, discounted: init = {-0.095, 0}, unbiased sigma = 0.095 / sqrt(2) -> +-0.0475 / (sigma + eps)
    #   = +-1/sqrt(2) (up to eps); own_turn stays 0
    s = 0.0475 / (0.095 / math.sqrt(2) + EPS)
    assert_close(
        gigpo_step_advantages([a, b], GiGPOConfig(mode="mean_std_norm", penalty="discounted")),
        [[-s, 0.0], [s, 0.0]],
        tol=1e-12,
    )
    assert as_lists(gigpo_step_advantages([a, b], GiGPOConfig(mode="mean_std_norm"))) == [[0.0, 0.0], [0.0, 0.0]]


# Episode term of gigpo_example, cross steps: entries 10,10, -0.1,-0.1,-0.1, 0,0 -> mu = 19.7/7 = 2.8142857
#   A^E: T1 7.1857143, T2 -2.9142857, T3 -2.8142857 (both penalty readings: it is per episode)
E1, E2, E3 = 10 - 19.7 / 7, -0.1 - 19.7 / 7, -19.7 / 7


def test_gigpo_mean_norm_hand_computed():
    trajs = gigpo_example()
    # own_turn (the default): step returns T1 [9.5, 10], T2 [0, -0.1, 0], T3 [0, 0].
    # Cluster s0 = {T1k0 9.5, T2k0 0, T3k0 0, T3k1 0}: mu = 9.5/4 = 2.375 -> A^S = 7.125, -2.375, -2.375, -2.375
    # Cluster s1 = {T1k1 10, T2k2 0}: mu = 5 -> A^S = 5, -5.   Cluster s2 = {T2k1}: singleton -> 0.
    step = gigpo_step_advantages(trajs, GiGPOConfig())
    assert_close(step, [[7.125, 5.0], [-2.375, 0.0, -5.0], [-2.375, -2.375]])
    out = gigpo_advantages(trajs)  # omega = 1
    assert_close(out, [[E1 + 7.125, E1 + 5.0], [E2 - 2.375, E2, E2 - 5.0], [E3 - 2.375] * 2])
    # omega = 2 doubles only the step term
    out = gigpo_advantages(trajs, GiGPOConfig(omega=2.0))
    assert_close(out, [[E1 + 14.25, E1 + 10.0], [E2 - 4.75, E2, E2 - 10.0], [E3 - 4.75] * 2])


def test_gigpo_mean_norm_hand_computed_with_the_penalty_discounted():
    trajs = gigpo_example()
    cfg = GiGPOConfig(penalty="discounted")
    # Step returns: T1 [9.5, 10], T2 [-0.095, -0.1, 0], T3 [0, 0].
    # Cluster s0 = {T1k0 9.5, T2k0 -0.095, T3k0 0, T3k1 0}: mu = 9.405/4 = 2.35125
    #   A^S = 7.14875, -2.44625, -2.35125, -2.35125
    # Cluster s1 = {T1k1 10, T2k2 0}: mu = 5 -> A^S = 5, -5.   Cluster s2 = {T2k1}: singleton -> 0.
    step = gigpo_step_advantages(trajs, cfg)
    assert_close(step, [[7.14875, 5.0], [-2.44625, 0.0, -5.0], [-2.35125, -2.35125]])
    out = gigpo_advantages(trajs, cfg)  # omega = 1
    assert_close(out, [[E1 + 7.14875, E1 + 5.0], [E2 - 2.44625, E2 + 0.0, E2 - 5.0], [E3 - 2.35125] * 2])
    # omega = 2 doubles only the step term
    out = gigpo_advantages(trajs, GiGPOConfig(omega=2.0, penalty="discounted"))
    assert_close(out, [[E1 + 14.2975, E1 + 10.0], [E2 - 4.8925, E2, E2 - 10.0], [E3 - 4.7025] * 2])


def test_gigpo_mean_std_norm_step_term_hand_computed():
    trajs = gigpo_example()
    # s1 = {10, 0}: mu 5, unbiased sigma = sqrt((25 + 25)/1) = sqrt(50) -> A^S = +-5/sqrt(50) = +-0.7071068
    s1 = 5 / (math.sqrt(50) + EPS)
    # own_turn: s0 deviations 7.125, -2.375 x3; sigma^2 = (50.765625 + 3 * 5.640625) / 3 = 22.5625, sigma = 4.75
    #   -> A^S = 7.125/4.75 = 1.5 and -2.375/4.75 = -0.5 (up to eps)
    step = gigpo_step_advantages(trajs, GiGPOConfig(mode="mean_std_norm"))
    s0_sd = 4.75 + EPS
    assert_close(step, [[7.125 / s0_sd, s1], [-2.375 / s0_sd, 0.0, -s1], [-2.375 / s0_sd] * 2], tol=1e-12)
    assert_close(step, [[1.5, s1], [-0.5, 0.0, -s1], [-0.5, -0.5]], tol=1e-6)
    # discounted: s0 deviations 7.14875, -2.44625, -2.35125, -2.35125; sigma^2 = sum of squares / 3
    s0_sd = math.sqrt((7.14875**2 + 2.44625**2 + 2 * 2.35125**2) / 3)  # = sqrt(68.1455/3) = 4.76604
    assert s0_sd == pytest.approx(4.76604, abs=1e-5)
    step = gigpo_step_advantages(trajs, GiGPOConfig(mode="mean_std_norm", penalty="discounted"))
    assert_close(step, [[7.14875 / s0_sd, s1], [-2.44625 / s0_sd, 0.0, -s1], [-2.35125 / s0_sd] * 2])


def test_gigpo_singleton_clusters_give_zero_step_advantage():
    # every turn in its own state: all clusters are singletons, so GiGPO == its episode term == GRPO
    trajs = [make_traj(["a", "b"], True), make_traj(["c"], False, invalid=(0,)), make_traj(["d", "e", "f"], False)]
    step = gigpo_step_advantages(trajs, GiGPOConfig())
    assert all(bool((s == 0).all()) for s in step)
    for mode in ("mean_norm", "mean_std_norm"):
        gi = gigpo_advantages(trajs, GiGPOConfig(mode=mode, omega=5.0))
        gr = grpo_advantages(trajs, GRPOConfig(mode=mode))
        assert all(torch.equal(a, b) for a, b in zip(gi, gr))


def test_gigpo_clusters_do_not_cross_groups():
    # same state "s0" in two groups of one trajectory each: no cluster partner -> A^S = 0
    trajs = [make_traj(["s0"], True, group="g1"), make_traj(["s0"], False, group="g2")]
    step = gigpo_step_advantages(trajs, GiGPOConfig())
    assert as_lists(step) == [[0.0], [0.0]]
    # and both single-member groups keep their own return (mu 0): 10 and 0
    assert as_lists(gigpo_advantages(trajs)) == [[10.0], [0.0]]


# --------------------------------------------------------------------------------------------- GraphGPO


def graph_example() -> list[Trajectory]:
    """T1: a -> b -> SUCCESS.  T2: a -> d -> e (e is a dead end).  T3: b -> a -> b (a cycle a <-> b, fails).

    T1's final_state "d" is ignored: a success's last edge always points to the SUCCESS sink.
    """
    t1 = make_traj(["a", "b"], success=True, final="d")
    t2 = make_traj(["a", "d"], success=False, final="e")
    t3 = make_traj(["b", "a"], success=False, final="b")
    return [t1, t2, t3]


def test_transition_edges():
    t1, t2, t3 = graph_example()
    assert transition_edges(t1) == [("a", "b"), ("b", SUCCESS)]
    assert transition_edges(t2) == [("a", "d"), ("d", "e")]
    assert transition_edges(t3) == [("b", "a"), ("a", "b")]


def test_graph_distances_cycle_and_dead_end():
    edges = [e for t in graph_example() for e in transition_edges(t)]
    # b -> SUCCESS: 1; a -> b -> SUCCESS: 2 (the cycle b -> a -> b never shortens it);
    # d only reaches the dead end e: unreachable -> max finite (2) + 1 = 3, and so does e
    assert distances_to_success(edges, 1.0) == {SUCCESS: 0.0, "b": 1.0, "a": 2.0, "d": 3.0, "e": 3.0}
    # cost 2 doubles the finite distances; unreachable stays max finite + 1 = 4 + 1
    assert distances_to_success(edges, 2.0) == {SUCCESS: 0.0, "b": 2.0, "a": 4.0, "d": 5.0, "e": 5.0}


def test_graph_distances_take_the_shortest_of_two_routes():
    # x -> y -> z -> SUCCESS (3 steps) and x -> SUCCESS directly: d(x) = 1, not 3
    edges = [("x", "y"), ("y", "z"), ("z", SUCCESS), ("x", SUCCESS)]
    assert distances_to_success(edges, 1.0) == {SUCCESS: 0.0, "x": 1.0, "y": 2.0, "z": 1.0}


def test_a_state_named_success_is_not_the_sink():
    trajs = [make_traj(["SUCCESS"], success=False, final="SUCCESS"), make_traj(["a"], success=True)]
    dist = distances_to_success([e for t in trajs for e in transition_edges(t)], 1.0)
    # the string "SUCCESS" only loops to itself: unreachable -> max finite (1) + 1 = 2
    assert dist["SUCCESS"] == 2.0 and dist[SUCCESS] == 0.0


def test_graph_raw_returns_both_conventions():
    trajs = graph_example()
    # reference: G = 10 * 0.1^d(target)
    #   T1: a->b d=1 -> 1;  b->SUCCESS d=0 -> 10
    #   T2: a->d d=3 -> 0.01; d->e d=3 -> 0.01
    #   T3: b->a d=2 -> 0.1;  a->b d=1 -> 1
    ref = graph_edge_returns(trajs, GraphGPOConfig())
    assert_close(ref, [[1.0, 10.0], [0.01, 0.01], [0.1, 1.0]], tol=1e-12)
    # paper (Eq. 4): exponent d(target) + cost, i.e. every value times decay = 0.1
    paper = graph_edge_returns(trajs, GraphGPOConfig(convention="paper"))
    for r, p in zip(ref, paper):
        assert torch.allclose(p, 0.1 * r, rtol=1e-12, atol=0)
    # with cost 2 and decay 0.5 the conventions differ by decay^cost = 0.25
    cfg = dict(edge_cost=2.0, decay=0.5)
    ref2 = graph_edge_returns(trajs, GraphGPOConfig(**cfg))
    paper2 = graph_edge_returns(trajs, GraphGPOConfig(convention="paper", **cfg))
    # reference with cost 2: d = b 2, a 4, d/e 5 -> T1 [10*0.5^2, 10*0.5^0] = [2.5, 10]
    assert ref2[0].tolist() == pytest.approx([2.5, 10.0])
    for r, p in zip(ref2, paper2):
        assert torch.allclose(p, 0.25 * r, rtol=1e-12, atol=0)


def test_graph_advantages_hand_computed():
    trajs = graph_example()
    # source a: {T1k0 G=1, T2k0 G=0.01, T3k1 G=1}: mu = 2.01/3 = 0.67, deviations 0.33, -0.66, 0.33
    #   sigma^2 = (0.1089 + 0.4356 + 0.1089)/2 = 0.3267
    # source b: {T1k1 G=10, T3k0 G=0.1}: mu = 5.05, deviations +-4.95, sigma^2 = 2*4.95^2 = 49.005
    # source d: {T2k1}: singleton -> 0
    sa, sb = math.sqrt(0.3267), math.sqrt(49.005)
    expected = [
        [0.33 / (sa + EPS), 4.95 / (sb + EPS)],
        [-0.66 / (sa + EPS), 0.0],
        [-4.95 / (sb + EPS), 0.33 / (sa + EPS)],
    ]
    assert_close(graph_advantages(trajs, GraphGPOConfig()), expected)
    # the paper convention scales every G by 0.1; standardisation removes it up to eps
    assert_close(graph_advantages(trajs, GraphGPOConfig(convention="paper")), expected, tol=1e-4)


def test_graphgpo_hand_computed():
    trajs = graph_example()
    # episode returns 10, 0, 0 once per trajectory: mu = 10/3, deviations 20/3, -10/3, -10/3
    #   sigma^2 = (400/9 + 100/9 + 100/9)/2 = 100/3, sigma = 5.773503 -> A^E = 1.154700, -0.577350, -0.577350
    sd = math.sqrt(100 / 3)
    e1, e0 = (20 / 3) / (sd + EPS), (-10 / 3) / (sd + EPS)
    ga, gb = 0.33 / (math.sqrt(0.3267) + EPS), 4.95 / (math.sqrt(49.005) + EPS)  # 0.577350, 0.707107
    out = graphgpo_advantages(trajs)
    assert_close(out, [[e1 + ga, e1 + gb], [e0 - 2 * ga, e0], [e0 - gb, e0 + ga]])
    # betas weight the two terms
    out = graphgpo_advantages(trajs, GraphGPOConfig(beta_episode=0.5, beta_graph=2.0))
    assert_close(
        out,
        [[0.5 * e1 + 2 * ga, 0.5 * e1 + 2 * gb], [0.5 * e0 - 4 * ga, 0.5 * e0], [0.5 * e0 - 2 * gb, 0.5 * e0 + 2 * ga]],
    )


def test_graphgpo_cross_steps_episode_term():
    trajs = [make_traj(["a", "b", "c"], True), make_traj(["a"], False)]
    # entries 10, 10, 10, 0 -> mu = 7.5, sigma^2 = (3*2.5^2 + 7.5^2)/3 = (18.75 + 56.25)/3 = 25, sigma = 5
    #   A^E = 2.5/5 = 0.5 and -7.5/5 = -1.5; graph: source a has {T1k0 G=10*0.1^2=0.1, T2k0 G=unreachable}
    #   d: SUCCESS 0, c 1, b 2, a 3, final "end" unreachable -> 4; G = 10*0.1^2 = 0.1 and 10*0.1^4 = 0.001
    #   mu = 0.0505, deviations +-0.0495, sigma = sqrt(2 * 0.0495^2) = 0.0700036 -> about +-1/sqrt(2)
    #   (eps matters at 1e-5 here because sigma is small); b and c are singleton sources -> 0
    out = graphgpo_advantages(trajs, GraphGPOConfig(cross_steps=True, beta_graph=0.0))
    assert_close(out, [[2.5 / (5 + EPS)] * 3, [-7.5 / (5 + EPS)]])
    ga = 0.0495 / (math.sqrt(2 * 0.0495**2) + EPS)
    g = graph_advantages(trajs, GraphGPOConfig())
    assert_close(g, [[ga, 0.0, 0.0], [-ga]], tol=1e-9)


def test_graphgpo_group_without_success_has_no_graph_term():
    trajs = [make_traj(["a", "b"], False, invalid=(1,)), make_traj(["a", "c"], False)]
    assert as_lists(graph_edge_returns(trajs)) == [[0.0, 0.0], [0.0, 0.0]]
    assert all(bool((g == 0).all()) for g in graph_advantages(trajs))
    # episode returns -0.1 and 0: mu = -0.05, sigma = sqrt(2*0.05^2) = 0.0707107 -> -+0.7071
    sd = math.sqrt(2 * 0.05**2)
    assert_close(graphgpo_advantages(trajs), [[-0.05 / (sd + EPS)] * 2, [0.05 / (sd + EPS)] * 2])


def test_graphgpo_groups_are_separate_graphs():
    # "a" succeeds in g1 only; in g2 (no success) the same state string has no graph term
    trajs = [
        make_traj(["a"], True, group="g1"),
        make_traj(["a"], False, group="g1"),
        make_traj(["a"], False, group="g2"),
        make_traj(["a"], False, group="g2", final="z"),
    ]
    g = graph_advantages(trajs)
    assert g[2].tolist() == [0.0] and g[3].tolist() == [0.0]
    assert g[0].item() > 0 > g[1].item()


# --------------------------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("estimator", [grpo_advantages, gigpo_advantages, graphgpo_advantages])
def test_missing_group_id_names_the_trajectory(estimator):
    trajs = [make_traj(["a"], True), make_traj(["a"], False, group=None, task="task-7")]
    with pytest.raises(ValueError, match=r"trajectory 1 \(task 'task-7'.*group_id"):
        estimator(trajs)


@pytest.mark.parametrize("estimator", [grpo_advantages, gigpo_advantages, graphgpo_advantages])
def test_zero_turns_names_the_trajectory(estimator):
    empty = Trajectory(task_id="t0", reward=0.0, turns=[], length=0, group_id="g")
    with pytest.raises(ValueError, match=r"trajectory 1 \(task 't0'.*zero turns"):
        estimator([make_traj(["a"], True), empty])


@pytest.mark.parametrize("estimator", [grpo_advantages, gigpo_advantages, graphgpo_advantages])
def test_bad_records_are_rejected(estimator):
    nan_reward = make_traj(["a"], True)
    nan_reward.reward = float("nan")
    with pytest.raises(ValueError, match="reward nan"):
        estimator([nan_reward])
    bad_state = make_traj(["a"], True)
    bad_state.turns[0].state = None
    with pytest.raises(ValueError, match="turn 0 has state None"):
        estimator([bad_state])
    with pytest.raises(ValueError, match="not a Trajectory"):
        estimator([{"reward": 1.0}])


@pytest.mark.parametrize("estimator", [grpo_advantages, gigpo_advantages, graphgpo_advantages])
def test_empty_batch_gives_empty_list(estimator):
    assert estimator([]) == []


@pytest.mark.parametrize(
    "make_cfg, field",
    [
        (lambda: GRPOConfig(mode="mean"), "mode"),
        (lambda: GRPOConfig(eps=0.0), "eps"),
        (lambda: GRPOConfig(invalid_penalty=-0.1), "invalid_penalty"),
        (lambda: GRPOConfig(success_reward=float("nan")), "success_reward"),
        (lambda: GiGPOConfig(gamma=1.5), "gamma"),
        (lambda: GiGPOConfig(omega=float("inf")), "omega"),
        (lambda: GiGPOConfig(mode="std"), "mode"),
        (lambda: GiGPOConfig(penalty="verl-agent"), "penalty"),
        (lambda: GraphGPOConfig(decay=0.0), "decay"),
        (lambda: GraphGPOConfig(decay=1.5), "decay"),
        (lambda: GraphGPOConfig(edge_cost=0.0), "edge_cost"),
        (lambda: GraphGPOConfig(convention="eq4"), "convention"),
        (lambda: GraphGPOConfig(beta_graph=float("nan")), "beta_graph"),
        (lambda: GraphGPOConfig(cross_steps=1), "cross_steps"),
    ],
)
def test_bad_config_names_the_field(make_cfg, field):
    with pytest.raises(ValueError, match=rf"\.{field}: "):
        make_cfg()


def test_config_mutated_after_construction_is_checked_at_call():
    cfg = GRPOConfig()
    cfg.eps = 0.0
    with pytest.raises(ValueError, match=r"GRPOConfig\.eps"):
        grpo_advantages(grpo_example(), cfg)
    with pytest.raises(ValueError, match="expected a GiGPOConfig"):
        gigpo_advantages(grpo_example(), GRPOConfig())


def test_distances_need_a_success_edge():
    with pytest.raises(ValueError, match="SUCCESS"):
        distances_to_success([("a", "b")], 1.0)


@pytest.mark.parametrize(
    "estimator, cfg",
    [
        (grpo_advantages, GRPOConfig(mode="mean_std_norm", cross_steps=True)),
        (grpo_advantages, GRPOConfig(mode="mean_std_norm", cross_steps=False)),
        (gigpo_advantages, GiGPOConfig(mode="mean_std_norm")),
        (graphgpo_advantages, GraphGPOConfig()),
    ],
)
def test_single_member_group_uses_mu0_sigma1(estimator, cfg):
    # one successful trajectory of 3 turns, alone: A^E = (10 - 0)/(1 + eps) in every estimator;
    # its step/graph terms have no partner (GiGPO clusters by distinct states; GraphGPO sources distinct)
    out = estimator([make_traj(["a", "b", "c"], True)], cfg)
    assert_close(out, [[10 / (1 + EPS)] * 3])


# --------------------------------------------------------------------------------------------- properties

STATES = ["s0", "s1", "s2", "s3"]


@st.composite
def groups_of_trajectories(draw, max_groups: int = 3, max_size: int = 4, max_turns: int = 5):
    """Shuffled trajectories from 1-3 groups over a 4-state alphabet, so states repeat often."""
    trajs = []
    for g in range(draw(st.integers(1, max_groups))):
        for _ in range(draw(st.integers(1, max_size))):
            n = draw(st.integers(1, max_turns))
            states = draw(st.lists(st.sampled_from(STATES), min_size=n, max_size=n))
            invalid = tuple(k for k in range(n) if draw(st.booleans()))
            trajs.append(
                make_traj(states, draw(st.booleans()), invalid, final=draw(st.sampled_from(STATES)), group=f"g{g}")
            )
    order = draw(st.permutations(range(len(trajs))))
    return [trajs[i] for i in order]


FAST = settings(max_examples=60, deadline=None)


@FAST
@given(
    groups_of_trajectories(),
    st.sampled_from(["mean_norm", "mean_std_norm"]),
    st.booleans(),
    st.sampled_from([0.0, 1.0, 10.0]),
    st.sampled_from([0.0, 0.1, 0.5]),
)
def test_gigpo_with_omega_zero_equals_grpo(trajs, mode, cross, success_reward, invalid_penalty):
    shared = dict(mode=mode, cross_steps=cross, success_reward=success_reward, invalid_penalty=invalid_penalty)
    gi = gigpo_advantages(trajs, GiGPOConfig(omega=0.0, gamma=0.9, **shared))
    gr = grpo_advantages(trajs, GRPOConfig(**shared))
    assert all(torch.equal(a, b) for a, b in zip(gi, gr))


@FAST
@given(groups_of_trajectories(), st.booleans())
def test_graphgpo_without_graph_term_equals_grpo_mean_std(trajs, cross):
    gg = graphgpo_advantages(trajs, GraphGPOConfig(beta_graph=0.0, cross_steps=cross))
    gr = grpo_advantages(trajs, GRPOConfig(mode="mean_std_norm", cross_steps=cross))
    assert all(torch.equal(a, b) for a, b in zip(gg, gr))


@FAST
@given(groups_of_trajectories())
def test_grpo_mean_norm_sums_to_zero_within_groups(trajs):
    per_traj = grpo_advantages(trajs, GRPOConfig(mode="mean_norm", cross_steps=False))
    cross = grpo_advantages(trajs, GRPOConfig(mode="mean_norm", cross_steps=True))
    for g in {t.group_id for t in trajs}:
        members = [i for i, t in enumerate(trajs) if t.group_id == g]
        if len(members) < 2:
            continue
        # once-per-trajectory statistics: the trajectories' advantages sum to 0
        assert abs(sum(per_traj[i][0].item() for i in members)) < 1e-4
        # cross-steps statistics: the turn-weighted sum (one entry per turn) is 0
        assert abs(sum(cross[i].double().sum().item() for i in members)) < 1e-3


@FAST
@given(groups_of_trajectories(), st.sampled_from([0.0, 0.5, 0.95]), st.sampled_from([0.0, 0.1]))
def test_gigpo_penalty_readings_differ_only_by_later_turns_discounted_penalties(trajs, gamma, penalty):
    """discounted - own_turn = sum_{j>k} gamma^(j-k) * (-penalty at j): zero at gamma 0 or without penalties."""
    for traj in trajs:
        own = step_returns(traj, GiGPOConfig(gamma=gamma, invalid_penalty=penalty))
        disc = step_returns(traj, GiGPOConfig(gamma=gamma, invalid_penalty=penalty, penalty="discounted"))
        later = discounted_returns(step_rewards(traj, 0.0, penalty), gamma) - step_rewards(traj, 0.0, penalty)
        assert torch.allclose(disc - own, later, atol=1e-12, rtol=0)
        if gamma == 0.0 or penalty == 0.0:
            assert torch.equal(disc, own)


@FAST
@given(groups_of_trajectories(), st.sampled_from(["mean_norm", "mean_std_norm"]), st.sampled_from(STEP_PENALTIES))
def test_gigpo_step_term_sums_to_zero_in_each_anchor_cluster(trajs, mode, penalty):
    step = gigpo_step_advantages(trajs, GiGPOConfig(mode=mode, penalty=penalty))
    totals: dict[tuple, float] = {}
    for i, t in enumerate(trajs):
        for k, turn in enumerate(t.turns):
            key = (t.group_id, turn.state)
            totals[key] = totals.get(key, 0.0) + step[i][k].item()
    assert all(abs(v) < 1e-9 for v in totals.values())


@FAST
@given(groups_of_trajectories(), st.randoms(use_true_random=False))
def test_permuting_trajectories_permutes_outputs(trajs, rng):
    perm = list(range(len(trajs)))
    rng.shuffle(perm)
    shuffled = [trajs[i] for i in perm]
    for estimator in (grpo_advantages, gigpo_advantages, graphgpo_advantages):
        base, moved = estimator(trajs), estimator(shuffled)
        for j, i in enumerate(perm):
            assert torch.allclose(moved[j], base[i], atol=1e-5, rtol=1e-5), estimator.__name__


@FAST
@given(
    groups_of_trajectories(),
    st.sampled_from(["mean_norm", "mean_std_norm"]),
    st.booleans(),
    st.sampled_from(["reference", "paper"]),
)
def test_outputs_are_finite_float32_one_value_per_turn(trajs, mode, cross, convention):
    results = [
        grpo_advantages(trajs, GRPOConfig(mode=mode, cross_steps=cross)),
        gigpo_advantages(trajs, GiGPOConfig(mode=mode, cross_steps=cross)),
        graphgpo_advantages(trajs, GraphGPOConfig(cross_steps=cross, convention=convention)),
    ]
    for out in results:
        assert len(out) == len(trajs)
        for t, a in zip(trajs, out):
            assert a.dtype == torch.float32 and a.shape == (len(t.turns),)
            assert bool(torch.isfinite(a).all())


def bellman_ford_distances(edges, cost):
    """Independent reference: relax every edge |V| times from d(SUCCESS) = 0, then apply max finite + 1."""
    nodes = {n for e in edges for n in e}
    d = {n: math.inf for n in nodes}
    d[SUCCESS] = 0.0
    for _ in range(len(nodes)):
        for src, tgt in edges:
            d[src] = min(d[src], d[tgt] + cost)
    top = max(v for v in d.values() if v < math.inf)
    return {n: (v if v < math.inf else top + 1.0) for n, v in d.items()}


@FAST
@given(
    st.lists(
        st.tuples(st.sampled_from(STATES + ["s4", "s5"]), st.sampled_from(STATES + ["s4", "s5", "WIN"])),
        min_size=1,
        max_size=14,
    ),
    st.sampled_from([1.0, 0.5, 3.0]),
)
def test_dijkstra_matches_bellman_ford(raw_edges, cost):
    edges = [(s, SUCCESS if t == "WIN" else t) for s, t in raw_edges] + [("s0", SUCCESS)]
    assert distances_to_success(edges, cost) == bellman_ford_distances(edges, cost)
