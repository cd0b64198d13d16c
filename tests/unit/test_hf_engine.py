"""Tests of trainer/rollout/hf_engine.py and trainer/policy/chat_format.py.

The reference for the engine is `naive_play`: one episode at a time, and for every token a plain forward pass
over the whole history re-encoded from scratch (no cache, no batch, no padding, no position ids). The engine
(batched, per-row KV buffers kept across turns, right-aligned chunks, custom masks) must produce exactly the same
greedy tokens, and log-probs equal to a full-sequence forward pass.

The test policy is a tiny model from trainer/policy/tiny.py with a fresh random output layer in which the special
markers can never win, and in which <eot> takes over the output row of an ordinary token that the greedy policy
writes at varied places (`make_policy`): so actions end at different steps in different episodes, some by <eot>
and some by the per-turn limit, which desynchronises the batch and exercises the observation-prefill path.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainer.environments.protocol import EpisodeStartError, StepInfo, StepResult
from trainer.policy.chat_format import SPECIAL_TOKENS, HFChatFormat, TinyFormat, build_tokenizer
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rl.trajectory import turn_values_to_tokens
from trainer.rollout.env_pool import EnvPool
from trainer.rollout.episode import ENV_TOKEN
from trainer.rollout.hf_engine import HFEngine, sample_tokens
from trainer.rollout.sampling import SamplingParams

torch.set_num_threads(1)

TEXTS = [f"task {i}: count the apples and the pears, then say done. turn {i % 4} got {i} chars" for i in range(40)]
PRESETS = ["minicpm-tiny", "qwen-tiny"]
TASKS = list(range(8))


class CountEnv:
    """A scripted game: 2-4 turns by task, prompts and observations of task- and turn-dependent lengths.

    Flags: the first action of an odd task is invalid; the second action of task 0 mod 4 is an execution error,
    of task 2 mod 4 a timeout. Reward 1 at the end for even tasks. Keeps the actions it received.
    """

    max_turns = 4

    def reset(self, task: int) -> str:
        self.task, self.k, self.received = task, 0, []
        return f"task {task}: count" + " the apples" * (task % 5)

    def step(self, action: str) -> StepResult:
        self.k += 1
        self.received.append(action)
        done = self.k >= 2 + self.task % 3
        info = StepInfo(
            tool="count",
            invalid_action=self.k == 1 and self.task % 2 == 1,
            exec_error=self.k == 2 and self.task % 4 == 0,
            timed_out=self.k == 2 and self.task % 4 == 2,
        )
        obs = f"turn {self.k} got {len(action)} chars" + " pears" * ((self.task + 3 * self.k) % 7)
        return StepResult(observation=obs, done=done, reward=float(done and self.task % 2 == 0), info=info)

    def close(self) -> None:
        pass


def flags_expected(task: int, k: int) -> tuple[bool, bool]:
    """(invalid_action, exec_error) CountEnv reports for the k-th action (1-based); timeouts count as errors."""
    return (k == 1 and task % 2 == 1), (k == 2 and task % 4 in (0, 2))


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fmt() -> TinyFormat:
    return TinyFormat(build_tokenizer(TEXTS, vocab_size=300))


def make_policy(preset: str, fmt, markers: list[int], stop_id: int, seed: int = 1):
    """A tiny model whose greedy actions end at varied lengths (see the module docstring)."""
    model = build_tiny_model(TinyModelSpec(preset, vocab_size=fmt.vocab_size), seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        out = torch.randn(model.lm_head.weight.shape, generator=g) * 0.2
        out[markers + [stop_id]] = 0.0  # logit 0 never beats the max of ~300 random logits
        model.lm_head.weight = torch.nn.Parameter(out)
    # Probe run: which ordinary token does the greedy policy write in some (not most) actions, at varied places?
    probe = HFEngine(model, fmt).play(
        [CountEnv() for _ in TASKS], TASKS, sampling=SamplingParams(temperature=0, max_turn_tokens=10)
    )
    actions = [e.tokens[t.start : t.end] for e in probe for t in e.turns]
    first = {}
    for a in actions:
        for tok in set(a):
            first.setdefault(tok, []).append(a.index(tok))
    candidates = [(len(set(p)), -tok) for tok, p in first.items() if 0.25 <= len(p) / len(actions) <= 0.75]
    relabel = -max(candidates)[1]
    with torch.no_grad():  # <eot> now wins wherever `relabel` would have
        weight = model.lm_head.weight
        weight[stop_id], weight[relabel] = weight[relabel].clone(), 0.0
    return model


@pytest.fixture(scope="module")
def policies(fmt) -> dict:
    markers = [fmt.pad_id, fmt.bos_id, fmt.obs_id, fmt.act_id]
    return {p: make_policy(p, fmt, markers, fmt.eot_id) for p in PRESETS}


# ------------------------------------------------------------------------------------------- the reference


@torch.no_grad()
def naive_play(model, fmt, env, task, sp: SamplingParams) -> dict:
    """Greedy, one episode, full re-encoding per token; the token-budget rules written out independently."""
    tokens = list(fmt.prompt_ids(env.reset(task)))
    actions, done, truncated, reward = [], False, False, 0.0
    while True:
        action = []
        while True:
            logits = model(input_ids=torch.tensor([tokens + action])).logits[0, -1]
            action.append(int(logits.argmax()))
            ended = action[-1] in fmt.stop_ids or len(action) == sp.max_turn_tokens
            if ended or len(tokens) + len(action) == sp.max_episode_tokens:
                break
        tokens += action
        actions.append(fmt.decode_action(action))
        if not ended:  # budget reached mid-action: not executed
            truncated = True
            break
        result = env.step(actions[-1])
        if result.done:
            done, reward = True, result.reward
            break
        obs = fmt.observation_ids(result.observation, last_token=action[-1])
        if len(tokens) + len(obs) + 1 > sp.max_episode_tokens:
            truncated = True
            break
        tokens += obs
    return dict(tokens=tokens, actions=actions, done=done, truncated=truncated, reward=reward)


def flat(lists) -> list:
    return [x for row in lists for x in row]


def assert_matches_naive(episodes, model, fmt, tasks, sp):
    for task, ep in zip(tasks, episodes):
        ref = naive_play(model, fmt, CountEnv(), task, sp)
        assert ep.tokens == ref["tokens"], f"task {task}: engine and naive tokens differ"
        assert ep.actions == ref["actions"]
        assert (ep.done, ep.truncated, ep.reward) == (ref["done"], ref["truncated"], ref["reward"])


# ------------------------------------------------------------------------------------------- engine vs reference


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_play_equals_naive_reencoding(fmt, policies, preset):
    sp = SamplingParams(temperature=0, max_turn_tokens=10, max_episode_tokens=400)
    engine = HFEngine(policies[preset], fmt)
    episodes = engine.play([CountEnv() for _ in TASKS], TASKS, sampling=sp, policy_version=0)
    # The batch really is ragged: prompts of several lengths, actions ended both ways, observation prefills
    # that did not include every row (the gathered-subset path).
    assert len({len(fmt.prompt_ids(CountEnv().reset(t))) for t in TASKS}) >= 4
    ends = Counter((t.length < 10, e.tokens[t.end - 1] == fmt.eot_id) for e in episodes for t in e.turns)
    assert ends[(True, True)] >= 3 and ends[(False, False)] >= 3, ends
    assert engine.last_stats["prefill_passes"] > 2 + max(len(e.turns) for e in episodes)
    # Nothing is re-encoded: every token is fed to the cache once, except each episode's final sampled token.
    assert engine.last_stats["tokens_fed"] == sum(e.length - 1 for e in episodes)
    assert_matches_naive(episodes, policies[preset], fmt, TASKS, sp)


@pytest.mark.parametrize(
    "preset,dtype",
    [
        ("minicpm-tiny", torch.float32),
        ("qwen-tiny", torch.float32),
        ("qwen2.5-tiny", torch.float32),
        ("qwen-tiny", torch.bfloat16),
    ],
)
def test_lean_forward_is_bit_identical_to_the_transformers_call(fmt, policies, preset, dtype):
    """Sampled episodes (tokens and log-probs) with `LeanDecoder.step` equal those of the model's own forward, exactly."""
    model = policies.get(preset) or build_tiny_model(TinyModelSpec(preset, vocab_size=fmt.vocab_size), seed=1)
    sp = SamplingParams(temperature=1.0, max_turn_tokens=10)
    runs = []
    for lean in (True, False):
        engine = HFEngine(copy.deepcopy(model), fmt, dtype=dtype, lean=lean)
        assert (engine._lean is not None) == lean
        runs.append(
            engine.play([CountEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(3))
        )
    assert engine.last_stats["prefill_passes"] > 2
    for a, b in zip(*runs):
        assert a.tokens == b.tokens and a.rollout_logp == b.rollout_logp


def test_masking_finished_rows_gives_the_same_episodes(fmt, policies):
    sp = SamplingParams(temperature=0, max_turn_tokens=10)
    model = policies["minicpm-tiny"]
    free = HFEngine(model, fmt, free_finished=True).play([CountEnv() for _ in TASKS], TASKS, sampling=sp)
    masked = HFEngine(model, fmt, free_finished=False).play([CountEnv() for _ in TASKS], TASKS, sampling=sp)
    assert [e.tokens for e in free] == [e.tokens for e in masked]
    assert flat(e.rollout_logp for e in free) == pytest.approx(flat(e.rollout_logp for e in masked), abs=1e-5)


@settings(max_examples=15, deadline=None, derandomize=True)  # fixed examples: a near-tie cannot make it flaky
@given(tasks=st.lists(st.integers(0, 40), min_size=1, max_size=4), turn=st.integers(1, 8), budget=st.integers(30, 110))
def test_token_budgets_match_reference(fmt, policies, tasks, turn, budget):
    """Any per-turn and per-episode limit: same tokens, same truncation as the reference; lengths within bounds."""
    prompt = max(len(fmt.prompt_ids(CountEnv().reset(t))) for t in tasks)
    sp = SamplingParams(temperature=0, max_turn_tokens=turn, max_episode_tokens=max(budget, prompt + 1))
    model = policies["qwen-tiny"]
    envs = [CountEnv() for _ in tasks]
    episodes = HFEngine(model, fmt).play(envs, tasks, sampling=sp)
    for ep, env in zip(episodes, envs):
        assert ep.length <= sp.max_episode_tokens
        assert all(1 <= t.length <= turn for t in ep.turns)
        assert ep.done != ep.truncated
        if ep.truncated:
            assert ep.reward == 0.0
        executed = len(env.received)
        # A mid-action cut is recorded but not executed, and no observation follows it.
        assert executed in (len(ep.turns), len(ep.turns) - 1)
        assert len(ep.observations) == executed + 1
        assert env.received == ep.actions[:executed]
    assert_matches_naive(episodes, model, fmt, tasks, sp)


def test_budget_cut_mid_action_and_observation_that_does_not_fit(fmt, policies):
    model = policies["minicpm-tiny"]
    free = HFEngine(model, fmt).play(
        [CountEnv() for _ in TASKS], TASKS, sampling=SamplingParams(temperature=0, max_turn_tokens=10)
    )
    task = next(t for t, e in zip(TASKS, free) if e.turns[0].length >= 3 and e.turns[1].length >= 2)
    prompt = len(fmt.prompt_ids(CountEnv().reset(task)))
    # Room for the prompt and 2 action tokens: the first action (3 or more tokens) is cut, and not executed.
    env = CountEnv()
    [ep] = HFEngine(model, fmt).play(
        [env], [task], sampling=SamplingParams(temperature=0, max_turn_tokens=10, max_episode_tokens=prompt + 2)
    )
    assert (ep.length, ep.truncated, ep.done, ep.reward) == (prompt + 2, True, False, 0.0)
    assert [(t.start, t.end) for t in ep.turns] == [(prompt, prompt + 2)]
    assert ep.tokens[prompt:] == free[task].tokens[prompt : prompt + 2]
    assert env.received == [] and len(ep.actions) == 1 and ep.observations == [CountEnv().reset(task)]
    # The budget ends exactly after the first observation: no room for a token, so it is not appended;
    # one token more, and it is appended and the second action is cut after one token.
    second = free[task].turns[1].start
    for budget, length, n_turns in [(second, free[task].turns[0].end, 1), (second + 1, second + 1, 2)]:
        env = CountEnv()
        [ep] = HFEngine(model, fmt).play(
            [env], [task], sampling=SamplingParams(temperature=0, max_turn_tokens=10, max_episode_tokens=budget)
        )
        assert (ep.length, len(ep.turns), ep.truncated) == (length, n_turns, True)
        assert ep.tokens == free[task].tokens[:length] and len(env.received) == 1 and len(ep.observations) == 2
    # Actions of one token: the first is executed, its observation (>= 7 tokens) does not fit in 5 more.
    env, prompt = CountEnv(), len(fmt.prompt_ids(CountEnv().reset(3)))
    [ep] = HFEngine(model, fmt).play(
        [env], [3], sampling=SamplingParams(temperature=0, max_turn_tokens=1, max_episode_tokens=prompt + 6)
    )
    assert (ep.length, ep.truncated, ep.done) == (prompt + 1, True, False)
    assert len(env.received) == 1 and len(ep.observations) == 2 and ep.observations[1].startswith("turn 1")


def test_a_prompt_without_room_for_an_action_skips_its_task_and_the_driver_leaves_it_out(fmt, policies):
    """Task 4's prompt (the longest) fills the budget: its episode comes back skipped, unplayed and unrewarded;
    the others are played exactly as without it; the driver's batch leaves it out, and a batch with nothing but
    such tasks is an error naming the budget."""
    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    budget = len(fmt.prompt_ids(CountEnv().reset(4)))
    sp = SamplingParams(temperature=0.0, max_turn_tokens=6, max_episode_tokens=budget)
    engine = HFEngine(policies["qwen-tiny"], fmt)
    mixed = engine.play([CountEnv() for _ in range(3)], [0, 4, 5], sampling=sp)
    alone = engine.play([CountEnv() for _ in range(2)], [0, 5], sampling=sp)
    assert "max_episode_tokens=" in mixed[1].extra["skipped"] and mixed[1].truncated
    assert mixed[1].tokens == [] and mixed[1].reward == 0.0 and not mixed[1].actions
    assert [dataclasses.asdict(e) for e in (mixed[0], mixed[2])] == [dataclasses.asdict(e) for e in alone]

    Task = SimpleNamespace

    def driver(ids):
        d = RolloutDriver(
            engine,
            CountEnv,
            TaskSampler([Task(task_id=i) for i in ids]),
            RolloutConfig(mode="sync", batch_size=len(ids)),
            sp,
        )
        d.engine.play = lambda envs, tasks, **kw: HFEngine.play(engine, envs, [t.task_id for t in tasks], **kw)
        d.publish(engine.model.state_dict(), 0)
        return d

    batch = driver([0, 4, 5]).next_batch(0)
    assert sorted(e.task_id for e in batch) == [0, 5]
    with pytest.raises(ValueError, match="every task left out .*rollout.max_episode_tokens"):
        driver([4]).next_batch(0)


class FailingEnv(CountEnv):
    """CountEnv whose task 1 cannot start (its container, say) and whose task 3's grading fails."""

    def reset(self, task: int) -> str:
        self.last_grading = None
        if task == 1:
            raise EpisodeStartError("task 1: the sandbox did not start (twice): engine gone")
        return super().reset(task)

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        if result.done:
            self.last_grading = {"failed": "grading failed twice: copy broke"} if self.task == 3 else {"reward": 1}
        return result


def test_an_episode_that_cannot_start_or_be_graded_fails_alone(fmt, policies):
    """A failed start or grading costs its episode (left out with the reason), not the batch: the others are played
    exactly as without it; the driver stops the cell, with the counts, once such failures pass its share."""
    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    sp = SamplingParams(temperature=0.0, max_turn_tokens=6, max_episode_tokens=400)
    engine = HFEngine(policies["qwen-tiny"], fmt)
    mixed = engine.play([FailingEnv() for _ in range(4)], [0, 1, 2, 3], sampling=sp)
    alone = engine.play([CountEnv() for _ in range(2)], [0, 2], sampling=sp)
    assert (
        mixed[1].extra["failed"]
        == mixed[1].extra["skipped"]
        == "task 1: the sandbox did not start (twice): engine gone"
    )
    assert mixed[1].tokens == [] and not mixed[1].actions
    assert mixed[3].extra["failed"] == "grading failed twice: copy broke" and mixed[3].actions
    for played, reference in zip((mixed[0], mixed[2]), alone):
        assert played.tokens == reference.tokens and played.reward == reference.reward
        assert played.extra == {"grading": {"reward": 1}} and "failed" not in reference.extra

    def driver(share):
        d = RolloutDriver(
            engine,
            FailingEnv,
            TaskSampler([SimpleNamespace(task_id=i) for i in (0, 1, 2, 3, 4)]),
            RolloutConfig(mode="sync", batch_size=5, max_failed_share=share),
            sp,
        )
        d.engine.play = lambda envs, tasks, **kw: HFEngine.play(engine, envs, [t.task_id for t in tasks], **kw)
        d.publish(engine.model.state_dict(), 0)
        return d

    tolerant = driver(0.5)
    batch = tolerant.next_batch(0)
    assert sorted(e.task_id for e in batch) == [0, 2, 4] and len(tolerant.failures) == 2
    with pytest.raises(RuntimeError, match=r"2 of 5 episodes failed .*40% > rollout.max_failed_share 20%.*engine gone"):
        driver(0.2).next_batch(0)


# ------------------------------------------------------------------------------------------- records


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_episode_records_are_exact(fmt, policies, temperature):
    sp = SamplingParams(temperature=temperature, top_p=0.95, max_turn_tokens=6, max_episode_tokens=500)
    envs = [CountEnv() for _ in TASKS]
    engine = HFEngine(policies["qwen-tiny"], fmt)
    engine.load_state_dict(policies["qwen-tiny"].state_dict(), version=5)
    episodes = engine.play(
        envs,
        TASKS,
        sampling=sp,
        generator=torch.Generator().manual_seed(0),
        task_ids=[f"t{t}" for t in TASKS],
        baselines=[0.25 * t for t in TASKS],
    )
    for task, ep, env in zip(TASKS, episodes, envs):
        assert (ep.task_id, ep.baseline, ep.dispatch_version) == (f"t{task}", 0.25 * task, 5)
        assert ep.done and not ep.truncated and ep.reward == float(task % 2 == 0)
        assert len(ep.turns) == 2 + task % 3 == len(ep.actions) == len(ep.observations) - 1
        assert env.received == ep.actions
        # Rebuild the sequence from the records: prompt, then (action, observation) per turn.
        expected = list(fmt.prompt_ids(ep.observations[0]))
        mask, versions, turn_index = [0] * len(expected), [ENV_TOKEN] * len(expected), [ENV_TOKEN] * len(expected)
        for k, turn in enumerate(ep.turns):
            assert turn.start == len(expected) and turn.state == ep.observations[k]
            action = ep.tokens[turn.start : turn.end]
            assert 1 <= len(action) <= 6 and (action[-1] == fmt.eot_id or len(action) == 6)
            assert fmt.eot_id not in action[:-1]
            assert fmt.decode_action(action) == ep.actions[k]
            assert (turn.invalid_action, turn.exec_error) == flags_expected(task, k + 1)
            expected += action
            mask += [1] * len(action)
            versions += [5] * len(action)
            turn_index += [k] * len(action)
            if k + 1 < len(ep.turns):
                obs = fmt.observation_ids(ep.observations[k + 1])
                expected += obs
                mask += [0] * len(obs)
                versions += [ENV_TOKEN] * len(obs)
                turn_index += [ENV_TOKEN] * len(obs)
        assert ep.tokens == expected
        assert (ep.loss_mask, ep.versions, ep.turn_index) == (mask, versions, turn_index)
        assert all((lp == 0.0) == (m == 0) for lp, m in zip(ep.rollout_logp, mask))  # sampled: log p < 0
        assert all(lp <= 0.0 for lp in ep.rollout_logp)
        # The advantage broadcast of trajectory.py lands exactly on the loss mask, turn k getting value k + 1.
        spread = turn_values_to_tokens([ep.trajectory()], [torch.arange(1.0, len(ep.turns) + 1)])[0]
        assert spread.tolist() == [float(t + 1) if t != ENV_TOKEN else 0.0 for t in turn_index]


@pytest.mark.parametrize(
    "preset,temperature,top_p", [("minicpm-tiny", 1.0, 1.0), ("qwen-tiny", 0.7, 0.9), ("minicpm-tiny", 0.0, 1.0)]
)
def test_rollout_logp_equals_full_sequence_forward(fmt, policies, preset, temperature, top_p):
    """log_softmax(logits / T) of a plain forward over each finished episode, at the loss-mask positions."""
    model = policies[preset]
    sp = SamplingParams(temperature=temperature, top_p=top_p, max_turn_tokens=8)
    episodes = HFEngine(model, fmt).play(
        [CountEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(3)
    )
    scale = temperature if temperature > 0 else 1.0
    worst = 0.0
    with torch.no_grad():
        for ep in episodes:
            tokens = torch.tensor([ep.tokens])
            logp = torch.log_softmax(model(input_ids=tokens).logits[0].float() / scale, dim=-1)
            # the token at position i is predicted by the logits at i - 1
            ref = logp[:-1].gather(-1, tokens[0, 1:, None])[:, 0]
            mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)
            got = torch.tensor(ep.rollout_logp[1:])
            worst = max(worst, (ref[mask] - got[mask]).abs().max().item())
            assert ep.loss_mask[0] == 0
    assert worst < 1e-4


# ------------------------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_with_a_seeded_generator(fmt, policies):
    model = policies["minicpm-tiny"]
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_turn_tokens=8)

    def run(seed):
        eps = HFEngine(model, fmt).play(
            [CountEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(seed)
        )
        return [e.tokens for e in eps], [e.rollout_logp for e in eps]

    a, b, c = run(11), run(11), run(12)
    assert a == b
    assert a[0] != c[0]


def test_tiny_top_p_samples_the_greedy_tokens(fmt, policies):
    model = policies["qwen-tiny"]
    greedy = HFEngine(model, fmt).play(
        [CountEnv() for _ in TASKS], TASKS, sampling=SamplingParams(temperature=0, max_turn_tokens=8)
    )
    nucleus = HFEngine(model, fmt).play(
        [CountEnv() for _ in TASKS],
        TASKS,
        sampling=SamplingParams(temperature=1.0, top_p=1e-6, max_turn_tokens=8),
        generator=torch.Generator().manual_seed(0),
    )
    assert [e.tokens for e in greedy] == [e.tokens for e in nucleus]
    # Both record log-probs under temperature 1 over the full vocabulary (top-p does not renormalise them).
    assert flat(e.rollout_logp for e in greedy) == pytest.approx(flat(e.rollout_logp for e in nucleus), abs=1e-6)


def test_sample_tokens_hand_example():
    # probabilities 0.5, 0.3, 0.2 as logits log(p)
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    tok, lp = sample_tokens(logits, temperature=0.0)
    assert tok.tolist() == [0] and lp.item() == pytest.approx(math.log(0.5))
    # T = 2: p^(1/2) = 0.70711, 0.54772, 0.44721; sum 1.70204 -> 0.41545, 0.32180, 0.26275
    many = logits.expand(4000, 3)
    g = torch.Generator().manual_seed(0)
    tok, lp = sample_tokens(many, temperature=2.0, generator=g)
    assert lp[tok == 2][0].item() == pytest.approx(math.log(0.26275), abs=1e-4)
    assert (tok == 2).float().mean().item() == pytest.approx(0.26275, abs=0.03)
    # top_p = 0.6 at T = 1: mass before token 1 is 0.5 < 0.6 (kept), before token 2 is 0.8 (dropped);
    # draws then follow 0.5/0.8 = 0.625 and 0.3/0.8 = 0.375, but log-probs stay log 0.5 and log 0.3.
    tok, lp = sample_tokens(many, temperature=1.0, top_p=0.6, generator=g)
    assert set(tok.tolist()) == {0, 1}
    assert (tok == 0).float().mean().item() == pytest.approx(0.625, abs=0.03)
    assert lp[tok == 1][0].item() == pytest.approx(math.log(0.3), abs=1e-5)
    # top_p = 0.45: token 0 alone (mass 0.5) reaches it, so only token 0 is ever drawn.
    tok, _ = sample_tokens(many, temperature=1.0, top_p=0.45, generator=g)
    assert set(tok.tolist()) == {0}


@settings(max_examples=40, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8), min_size=2, max_size=12),
    temperature=st.floats(0.05, 3.0),
    top_p=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_sample_tokens_stays_in_the_nucleus(logits, temperature, top_p, seed):
    row = torch.tensor([logits], dtype=torch.float64).expand(16, -1)
    tok, lp = sample_tokens(row, temperature, top_p, torch.Generator().manual_seed(seed))
    # Independent nucleus: sort by probability, keep while the mass strictly before a token is below top_p
    # (with a small tolerance on that boundary for float rounding).
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float64) / temperature, dim=-1).tolist()
    order = sorted(range(len(logits)), key=lambda i: -probs[i])
    allowed, before = set(), 0.0
    for i in order:
        if before < top_p + 1e-6:
            allowed.add(i)
        before += probs[i]
    # the engine ranks in fp32: a token within fp32 rounding of a kept one may rank above it there
    floor = min(probs[i] for i in allowed) - 1e-6
    allowed |= {i for i in range(len(probs)) if probs[i] >= floor}
    assert set(tok.tolist()) <= allowed
    for t, logp in zip(tok.tolist(), lp.tolist()):
        assert logp == pytest.approx(math.log(probs[t]), abs=1e-4)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_turn_tokens=0), "max_turn_tokens"),
        (dict(max_episode_tokens=1), "max_episode_tokens"),
        (dict(max_turn_tokens=2.5), "max_turn_tokens"),
    ],
)
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


# ------------------------------------------------------------------------------------------- engine API


def test_load_state_dict_publishes_weights_and_version(fmt, policies):
    old, new = policies["minicpm-tiny"], make_policy("minicpm-tiny", fmt, [0, 1, 2, 3], fmt.eot_id, seed=7)
    engine = HFEngine(make_policy("minicpm-tiny", fmt, [0, 1, 2, 3], fmt.eot_id, seed=1), fmt)
    sp = SamplingParams(temperature=0, max_turn_tokens=6)
    before = engine.play([CountEnv() for _ in TASKS[:3]], TASKS[:3], sampling=sp)
    assert engine.policy_version == 0 and all(v in (0, ENV_TOKEN) for v in before[0].versions)
    engine.load_state_dict(new.state_dict(), version=7)
    assert engine.policy_version == 7
    after = engine.play([CountEnv() for _ in TASKS[:3]], TASKS[:3], sampling=sp)
    assert {v for e in after for v in e.versions} == {7, ENV_TOKEN}
    assert after[0].tokens != before[0].tokens
    assert_matches_naive(after, new, fmt, TASKS[:3], sp)
    assert_matches_naive(before, old, fmt, TASKS[:3], sp)


def test_eager_attention_and_float64(fmt):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=fmt.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    sp = SamplingParams(temperature=0, max_turn_tokens=5)
    episodes = HFEngine(model, fmt, dtype=torch.float64).play([CountEnv() for _ in TASKS[:4]], TASKS[:4], sampling=sp)
    assert next(model.parameters()).dtype == torch.float64
    assert_matches_naive(episodes, model, fmt, TASKS[:4], sp)


def test_play_input_errors(fmt, policies):
    engine = HFEngine(policies["qwen-tiny"], fmt)
    sp = SamplingParams()
    assert engine.play([], [], sampling=sp) == []
    with pytest.raises(ValueError, match="tasks"):
        engine.play([CountEnv()], [1, 2], sampling=sp)
    with pytest.raises(ValueError, match="task_ids"):
        engine.play([CountEnv()], [1], sampling=sp, task_ids=["a", "b"])
    with pytest.raises(ValueError, match="baselines"):
        engine.play([CountEnv()], [1], sampling=sp, baselines=[])
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.play([CountEnv()], [1], sampling=dict(temperature=0))


def test_engine_rejects_models_it_cannot_serve(fmt):
    flash = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False, _attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="attn_implementation"):
        HFEngine(flash, fmt)
    seq2seq = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True, _attn_implementation="sdpa"))
    with pytest.raises(ValueError, match="decoder-only"):
        HFEngine(seq2seq, fmt)


# ------------------------------------------------------------------------------------------- environment pool


class JitterEnv(CountEnv):
    """CountEnv whose calls sleep a task- and turn-dependent few milliseconds (so the calls of one batch finish
    out of order in a pool) and record their threads; an episode cut at the budget is graded by its turn count."""

    threads: set

    def reset(self, task):
        time.sleep(0.001 * ((task * 5) % 4))
        self.threads.add(threading.current_thread().name)
        return super().reset(task)

    def step(self, action):
        time.sleep(0.001 * ((self.task * 7 + self.k) % 4))
        self.threads.add(threading.current_thread().name)
        return super().step(action)

    def truncated_reward(self) -> float:
        time.sleep(0.001 * (self.task % 3))
        return self.k / 10


def test_env_pool_width_gives_the_same_episodes(fmt, policies):
    """Width 4 steps the actions that end in one decode step side by side, in whatever order they finish; the
    episodes (tokens, log-probs, masks, turns, rewards) and every environment's calls equal width 1's, exactly."""
    sp = SamplingParams(temperature=1.0, max_turn_tokens=10, max_episode_tokens=50)
    runs = []
    for width in (1, 4):
        envs = [JitterEnv() for _ in TASKS]
        threads = set()
        for env in envs:
            env.threads = threads
        with EnvPool(width) as pool:
            episodes = HFEngine(policies["qwen-tiny"], fmt).play(
                envs, TASKS, sampling=sp, pool=pool, generator=torch.Generator().manual_seed(4)
            )
        runs.append((episodes, [env.received for env in envs], threads))
    (one, received_one, threads_one), (four, received_four, threads_four) = runs
    assert [dataclasses.asdict(e) for e in four] == [dataclasses.asdict(e) for e in one]
    assert received_four == received_one
    # the comparison has teeth: the pool's threads stepped, and episodes ended every way (done, cut and graded)
    assert threads_one == {threading.current_thread().name} and len(threads_four - threads_one) >= 2
    assert {(e.done, e.truncated) for e in one} == {(True, False), (False, True)}
    assert any(e.truncated and e.reward > 0 for e in one)


def test_env_pool_width_gives_the_same_episodes_on_minirepo():
    """The same on a real environment family: a fresh tiny policy plays MiniRepo tasks at widths 1 and 4."""
    from trainer.environments.minirepo import MiniRepoConfig, MiniRepoEnv, MiniRepoTasks
    from trainer.environments.minirepo.expert import sample_texts
    from trainer.policy.load import new_tiny_policy

    config = MiniRepoConfig(max_depth=1, max_turns=5)
    model, mfmt = new_tiny_policy("qwen-tiny", sample_texts(config, n=40), seed=0)
    tasks = MiniRepoTasks(config).tasks("train", 6)
    threads = set()

    class Recorded(MiniRepoEnv):
        def step(self, action):
            threads.add(threading.current_thread().name)
            return super().step(action)

    sp = SamplingParams(temperature=1.0, max_turn_tokens=12, max_episode_tokens=400)
    runs = []
    for width in (1, 4):
        with EnvPool(width) as pool:
            runs.append(
                HFEngine(model, mfmt).play(
                    [Recorded(config) for _ in tasks],
                    tasks,
                    sampling=sp,
                    pool=pool,
                    generator=torch.Generator().manual_seed(1),
                    task_ids=[t.task_id for t in tasks],
                )
            )
    assert [dataclasses.asdict(e) for e in runs[1]] == [dataclasses.asdict(e) for e in runs[0]]
    assert len(threads) >= 3  # the caller's and the pool's
    assert all(e.done and len(e.actions) == 5 for e in runs[0])  # an untrained policy plays to the turn limit


# ------------------------------------------------------------------------------------------- TinyFormat


def test_build_tokenizer_takes_other_special_tokens_first():
    chat = build_tokenizer(TEXTS, vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert [chat.token_to_id(t) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]] == [0, 1, 2]
    assert all(chat.token_to_id(t) is None for t in SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="below the byte alphabet"):
        build_tokenizer(TEXTS, vocab_size=257, special_tokens=["a", "b"])


def test_build_tokenizer_is_deterministic_and_round_trips():
    a, b = build_tokenizer(TEXTS, vocab_size=300), build_tokenizer(list(TEXTS), vocab_size=300)
    assert a.to_str() == b.to_str()
    assert [a.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    c = Tokenizer.from_str(a.to_str())
    text = "task 7: count the apples, then say done. ünïcödé \n tabs\t"
    assert c.encode(text).ids == a.encode(text).ids
    assert c.decode(c.encode(text).ids) == text
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(TEXTS, vocab_size=100)


def test_tiny_format_layout(fmt):
    text = "count the apples"
    body = fmt.encode_text(text)
    assert fmt.prompt_ids(text) == [1, 2, *body, 3]  # <bos> <obs> text <act>
    assert fmt.observation_ids(text) == [2, *body, 3]  # <obs> text <act>
    assert fmt.stop_ids == {4} and fmt.pad_id == 0
    assert fmt.action_ids("say done") == [*fmt.encode_text("say done"), 4]
    assert fmt.decode_action(fmt.action_ids("say done")) == "say done"
    # An environment printing a marker cannot inject it: the text is encoded as bytes and decodes back.
    tricky = "oops <eot> and <obs>"
    assert not set(fmt.encode_text(tricky)) & set(range(5))
    assert fmt.tokenizer.decode(fmt.encode_text(tricky)) == tricky
    with pytest.raises(ValueError, match="special tokens"):
        TinyFormat(_bpe(["<s>"]))


# ------------------------------------------------------------------------------------------- HFChatFormat

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHAT_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def _bpe(specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        TEXTS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return tok


def hf_tokenizer(template: str):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(CHAT_SPECIALS),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token="<|begin_of_text|>",
    )
    tok.chat_template = template
    return tok


CONVERSATION = [
    "task 3: count the apples",
    "open a.py 3",
    "turn 1 got 10 chars pears",
    "say done",
    "turn 2 got 8 chars",
]


def _messages(system, turns):
    msgs = [{"role": "system", "content": system}] if system is not None else []
    return msgs + [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


@pytest.mark.parametrize("template,eot", [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>")])
@pytest.mark.parametrize("system", [None, "You fix repositories."])
def test_hf_chat_format_deltas_equal_the_full_template(template, eot, system):
    tok = hf_tokenizer(template)
    fmt = HFChatFormat(tok, system_prompt=system)
    eot_id = tok.convert_tokens_to_ids(eot)
    assert fmt.end_of_turn_id == eot_id and fmt.stop_ids == {eot_id, tok.eos_token_id}

    def full(turns):
        return tok.encode(
            tok.apply_chat_template(_messages(system, turns), tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )

    assert fmt.prompt_ids(CONVERSATION[0]) == full(CONVERSATION[:1])
    # Actions that ended with the end-of-turn token: the engine appends [action..., eot] then the delta.
    seq = fmt.prompt_ids(CONVERSATION[0])
    for k in (1, 3):
        action = fmt.action_ids(CONVERSATION[k])
        assert action[-1] == eot_id and fmt.decode_action(action) == CONVERSATION[k]
        seq += action + fmt.observation_ids(CONVERSATION[k + 1], last_token=action[-1])
        assert seq == full(CONVERSATION[: k + 2])
    # An action cut by the turn limit (no end-of-turn token sampled): the delta carries the whole tail.
    cut = tok.encode(CONVERSATION[1], add_special_tokens=False)
    seq = fmt.prompt_ids(CONVERSATION[0]) + cut + fmt.observation_ids(CONVERSATION[2], last_token=cut[-1])
    assert seq == full(CONVERSATION[:3])


@pytest.mark.parametrize(
    "template,problem",
    [
        ("{{ messages | length }} messages\n" + CHATML, "not a prefix"),
        (
            CHATML.replace("<|im_start|>{{ m['role'] }}", "<|im_start|>{{ loop.index }} {{ m['role'] }}"),
            "depending on the history",
        ),
        ("", "no chat_template"),
    ],
)
def test_hf_chat_format_rejects_templates_that_are_not_incremental(template, problem):
    with pytest.raises(ValueError, match=problem):
        HFChatFormat(hf_tokenizer(template))


def test_engine_with_hf_chat_format_equals_naive():
    tok = hf_tokenizer(CHATML)
    fmt = HFChatFormat(tok, system_prompt="Count.")
    specials = [tok.convert_tokens_to_ids(t) for t in CHAT_SPECIALS]
    markers = [i for i in specials if i != fmt.end_of_turn_id]
    model = make_policy("qwen-tiny", fmt, markers, fmt.end_of_turn_id)
    sp = SamplingParams(temperature=0, max_turn_tokens=8)
    episodes = HFEngine(model, fmt).play([CountEnv() for _ in TASKS[:5]], TASKS[:5], sampling=sp)
    ends = {e.tokens[t.end - 1] == fmt.end_of_turn_id for e in episodes for t in e.turns}
    assert ends == {True, False}  # both kinds of observation delta were used
    assert_matches_naive(episodes, model, fmt, TASKS[:5], sp)


def test_a_saved_policy_loads_back_with_the_same_weights_and_format(tmp_path):
    """`save_policy` (the warm start, `train --save-policy`) and `load_policy` round-trip both kinds of format: the
    tiny one and a real tokenizer's chat template."""
    from trainer.policy.load import load_policy, policy_meta, save_policy

    tok = hf_tokenizer(CHATML)
    for name, fmt in (("tiny", TinyFormat(build_tokenizer(TEXTS, vocab_size=300))), ("hf", HFChatFormat(tok))):
        model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=fmt.vocab_size), seed=1)
        save_policy(model, fmt, tmp_path / name, extra={"trained": {"update": 3}})
        loaded, loaded_fmt = load_policy(tmp_path / name)
        assert type(loaded_fmt) is type(fmt) and loaded_fmt.stop_ids == fmt.stop_ids
        assert loaded_fmt.prompt_ids("task 3: count") == fmt.prompt_ids("task 3: count")
        assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
        assert policy_meta(tmp_path / name) == {"format": name, "trained": {"update": 3}}
    with pytest.raises(ValueError, match="system prompt"):
        save_policy(model, HFChatFormat(tok, system_prompt="Count."), tmp_path / "no")


def test_a_hybrid_qwen3_5_model_plays_without_a_cache_and_equals_the_cached_path():
    """Qwen3.5's Gated DeltaNet layers have no place in the row cache, so the engine feeds whole sequences. On a
    full-attention model the uncached path must pick the tokens the cached one picks (greedy; logits equal to
    1e-4), and a tiny qwen3_5_text model must play episodes to their end."""
    import copy

    from trainer.environments.minirepo import MiniRepoConfig, MiniRepoEnv, MiniRepoTasks
    from trainer.policy.load import new_tiny_policy
    from trainer.rollout.hf_engine import HFEngine
    from trainer.rollout.sampling import SamplingParams

    config = MiniRepoConfig(max_depth=1, max_turns=4)
    tasks = MiniRepoTasks(config).tasks("train", 3)
    texts = ["ls", "cat a.py", "submit"] * 20
    sampling = SamplingParams(temperature=0.0, max_turn_tokens=8, max_episode_tokens=200)

    def play(engine):
        return engine.play(
            [MiniRepoEnv(config) for _ in tasks], tasks, sampling=sampling, generator=torch.Generator().manual_seed(0)
        )

    model, fmt = new_tiny_policy("qwen-tiny", texts, vocab_size=300)
    cached = HFEngine(copy.deepcopy(model), fmt)
    whole = HFEngine(copy.deepcopy(model), fmt)
    whole.uncached, whole._lean = True, None
    assert not cached.uncached
    for a, b in zip(play(cached), play(whole)):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
        assert max(abs(x - y) for x, y in zip(a.rollout_logp, b.rollout_logp)) < 1e-4

    hybrid, fmt = new_tiny_policy("qwen3.5-tiny", texts, vocab_size=300)
    engine = HFEngine(hybrid, fmt)
    assert engine.uncached
    episodes = play(engine)
    assert all(e.done or e.truncated for e in episodes) and all(e.n_generated > 0 for e in episodes)
