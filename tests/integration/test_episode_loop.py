"""Tests of trainer/rollout/episode_loop.py and the driver's `rollout.loop: episodes`.

References: the lock-step loop (`VLLMEngine.play` over the reference engine, itself tested against `HFEngine` in
test_vllm_engine.py), which must play the same episodes under sync and lagged; hand-scripted engines and
environments for the version gate, the staleness bound and the admission rule.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest
import torch
from builders import TEXTS, IdTask, SleepyTallyEnv

from trainer.policy.chat_format import TinyFormat, build_tokenizer
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rollout.config import RolloutConfig
from trainer.rollout.driver import RolloutDriver, TaskSampler
from trainer.rollout.episode import ENV_TOKEN
from trainer.rollout.episode_loop import Dispatch, EpisodeStream, VersionGate, play_episode
from trainer.rollout.reference_llm import reference_engine
from trainer.rollout.sampling import SamplingParams, turn_seed

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world():
    fmt = TinyFormat(build_tokenizer(TEXTS, vocab_size=300))
    model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=fmt.vocab_size), seed=3).eval()
    return model, fmt


def versions_of(model, n):
    """n state dicts of `model`, each a little further from it (version v: every weight times 1 + 0.05 v)."""
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return [{k: v * (1 + 0.05 * i) if v.is_floating_point() else v for k, v in base.items()} for i in range(n)]


def record(e):
    return (
        e.task_id,
        e.group_id,
        e.tokens,
        e.loss_mask,
        e.rollout_logp,
        e.versions,
        e.turn_index,
        e.reward,
        e.done,
        e.truncated,
        e.actions,
        [(t.start, t.end, t.invalid_action, t.exec_error) for t in e.turns],
    )


def run_driver(world, loop, *, mode, updates, group_size=1, **rollout):
    model, fmt = world
    import copy

    engine = reference_engine(copy.deepcopy(model), fmt)
    cfg = RolloutConfig(loop=loop, mode=mode, batch_size=6, env_workers=3, **rollout)
    sampling = SamplingParams(temperature=1.0, max_turn_tokens=6, max_episode_tokens=60)
    driver = RolloutDriver(
        engine,
        SleepyTallyEnv,
        TaskSampler([IdTask(i) for i in range(8)], seed=1),
        cfg,
        sampling,
        seed=4,
        group_size=group_size,
    )
    weights = versions_of(model, updates + 1)
    batches = []
    try:
        driver.publish(weights[0], 0)
        for v in range(updates):
            batches.append(driver.next_batch(v))
            driver.publish(weights[v + 1], v + 1)
    finally:
        driver.close()
    return batches, driver


@pytest.mark.parametrize("mode,group_size", [("lagged", 1), ("lagged", 2), ("sync", 1)])
def test_episode_loop_plays_the_lock_step_episodes(world, mode, group_size):
    """Under sync and lagged the episode-level loop plays exactly the lock-step loop's episodes (same seeds per
    episode and turn, on an engine whose answer depends only on weights, prompt and seed), with new weights
    pushed between batches: every token, log-prob, version, turn, reward and flag."""
    turns, _ = run_driver(world, "turns", mode=mode, updates=3, group_size=group_size)
    episodes, driver = run_driver(world, "episodes", mode=mode, updates=3, group_size=group_size)
    assert [[record(e) for e in b] for b in turns] == [[record(e) for e in b] for b in episodes]
    assert driver.turns.steps == sum(len(e.turns) for b in episodes for e in b)  # stepped: one turn a step
    versions = {v for b in episodes for e in b for v in e.versions if v != ENV_TOKEN}
    assert versions == ({0, 1, 2} if mode == "sync" else {0, 1})  # the pushes took effect
    assert len({e.rollout_logp[-1] for b in episodes for e in b}) > 1


def test_async_stream_holds_the_staleness_bound(world):
    """Under async the episodes flow across updates: every episode handed over is within `max_staleness` of the
    trainer's version, every turn records one version, and the versions of an episode never go down."""
    batches, driver = run_driver(world, "episodes", mode="async", updates=6, max_staleness=1, max_in_flight=4)
    assert [len(b) for b in batches] == [6] * 6
    for v, batch in enumerate(batches):
        for e in batch:
            assert v - e.oldest_version <= 1
            by_turn = {}
            for t, version in zip(e.turn_index, e.versions):
                if t != ENV_TOKEN:
                    by_turn.setdefault(t, set()).add(version)
            assert all(len(s) == 1 for s in by_turn.values())
            turn_versions = [next(iter(by_turn[t])) for t in sorted(by_turn)]
            assert turn_versions == sorted(turn_versions)
    assert max(e.oldest_version for e in batches[-1]) >= 3  # the weights moved on


# ------------------------------------------------------------------------------------------- scripted pieces


class ScriptedTurns:
    """Answers every turn with [7, 3] (3: the stop token) after `delay` seconds; records pushes."""

    def __init__(self, delay=0.0, fail_at=None):
        self.delay, self.fail_at, self.pushed, self.calls = delay, fail_at, [], 0

    async def generate(self, prompt, *, sampling, max_tokens, seed, key=0):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("the engine died")
        await asyncio.sleep(self.delay)
        return [7, 3], [-0.5, -0.25]

    async def load_weights(self, state_dict, version):
        self.pushed.append(version)


class HandFormat:
    stop_ids = {3}

    def prompt_ids(self, obs):
        return [1, 2]

    def observation_ids(self, obs, last_token=None):
        return [4, 2]

    def decode_action(self, ids):
        return "act"


class TurnsEnv:
    """Done after `turns` steps, reward 1."""

    def __init__(self, turns=3):
        self.turns = turns

    def reset(self, task):
        self.k = 0
        return "start"

    def step(self, action):
        from trainer.environments.protocol import StepInfo, StepResult

        self.k += 1
        return StepResult(observation="obs", done=self.k >= self.turns, reward=1.0, info=StepInfo(tool="t"))

    def close(self):
        pass


async def direct(env, fn, *args, **kwargs):
    return fn(*args, **kwargs)


SAMPLING = SamplingParams(temperature=1.0, max_turn_tokens=4, max_episode_tokens=64)


def test_version_gate_push_waits_for_turns_in_flight_and_holds_new_ones():
    async def main():
        gate, log = VersionGate(), []
        release = asyncio.Event()

        async def turn(name):
            async with gate.turn() as version:
                log.append((name, "start", version))
                await release.wait()
            log.append((name, "end", version))

        async def load():
            log.append(("push", "load", gate.version))

        first = asyncio.create_task(turn("a"))
        await asyncio.sleep(0)
        push = asyncio.create_task(gate.push(load, 1))
        await asyncio.sleep(0)
        second = asyncio.create_task(turn("b"))  # asked for during the push: waits for it
        await asyncio.sleep(0.01)
        assert log == [("a", "start", 0)] and not push.done()
        release.set()
        await asyncio.gather(first, push, second)
        return log

    assert asyncio.run(main()) == [
        ("a", "start", 0),
        ("a", "end", 0),
        ("push", "load", 0),
        ("b", "start", 1),
        ("b", "end", 1),
    ]


def test_an_episode_spanning_a_push_records_each_turns_version():
    """The push lands while the episode's second tool call runs: turns 0-1 by version 0, turn 2 by version 1."""

    async def main():
        gate, engine = VersionGate(), ScriptedTurns()
        in_tool, resume, steps = asyncio.Event(), asyncio.Event(), []

        async def env_calls(env, fn, *args, **kwargs):
            if fn.__name__ == "finalize_turns":
                steps.append(1)
                if len(steps) == 2:
                    in_tool.set()
                    await resume.wait()
            return fn(*args, **kwargs)

        play = asyncio.create_task(
            play_episode(engine, gate, env_calls, HandFormat(), TurnsEnv(3), Dispatch("x", "x", 5), sampling=SAMPLING)
        )
        await in_tool.wait()
        await gate.push(lambda: engine.load_weights({}, 1), 1)  # no turn is being generated: it goes through
        resume.set()
        return await play

    e = asyncio.run(main())
    policy = [(t, v) for t, v in zip(e.turn_index, e.versions) if v != ENV_TOKEN]
    assert policy == [(0, 0), (0, 0), (1, 0), (1, 0), (2, 1), (2, 1)]
    assert e.oldest_version == 0 and e.done and e.reward == 1.0
    assert e.tokens == [1, 2, 7, 3, 4, 2, 7, 3, 4, 2, 7, 3]


def test_stream_admits_no_episode_beyond_the_staleness_bound():
    """max_staleness 0: once version 1 is loaded and the trainer still holds version 0, no new episode starts;
    taking at version 1 lets them start again."""

    async def main():
        dispatched = []

        def next_jobs():
            dispatched.append(len(dispatched))
            return [Dispatch("x", f"t{len(dispatched)}", len(dispatched))]

        stream = EpisodeStream(
            ScriptedTurns(delay=0.001),
            direct,
            HandFormat(),
            lambda: TurnsEnv(2),
            next_jobs,
            sampling=SAMPLING,
            max_in_flight=2,
            max_staleness=0,
        )
        first = await stream.take(2, 0)
        await stream.publish({}, 1)
        await stream.drain_pushes()
        await asyncio.sleep(0.05)
        frozen = len(dispatched)
        await asyncio.sleep(0.05)
        assert len(dispatched) == frozen  # nothing admitted while version 1 - consumed 0 > 0
        second = await stream.take(2, 1)
        await stream.close()
        return first, second, stream

    first, second, stream = asyncio.run(main())
    assert all(e.oldest_version == 0 for e in first)
    assert all(e.oldest_version == 1 for e in second)  # the version-0 leftovers were dropped as stale
    assert all(e.oldest_version == 0 for e in stream.stale)


def test_stream_raises_an_episodes_error_in_take():
    async def main():
        stream = EpisodeStream(
            ScriptedTurns(fail_at=3),
            direct,
            HandFormat(),
            lambda: TurnsEnv(2),
            lambda: [Dispatch("x", "x", 0)],
            sampling=SAMPLING,
            max_in_flight=2,
            max_staleness=1,
        )
        try:
            await stream.take(4, 0)
        finally:
            await stream.close()

    with pytest.raises(RuntimeError, match="an episode of the rollout stream failed: RuntimeError: the engine died"):
        asyncio.run(main())


def test_turn_seed_is_per_episode_and_turn():
    seeds = {turn_seed(s, t) for s in range(50) for t in range(20)}
    assert len(seeds) == 1000 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert turn_seed(5, 3) == turn_seed(5, 3)


def test_env_calls_run_side_by_side(world):
    """Environment calls of different episodes overlap (the env threads), so one slow tool call does not hold up
    the other episodes."""
    from trainer.rollout.episode_loop import EnvCalls

    calls, active, peak, lock = EnvCalls(3), [0], [0], threading.Lock()

    def slow():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.3)  # long beside a thread's start, even on a loaded machine
        with lock:
            active[0] -= 1

    async def main():
        await asyncio.gather(*(calls(None, slow) for _ in range(3)))

    asyncio.run(main())
    calls.close()
    assert peak[0] == 3


def test_several_servers_need_the_episode_loop():
    from trainer.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="rollout.server_replicas: 2 rollout servers need rollout.server: true"):
        config_from_dict({"rollout": {"engine": "reference", "server": True, "server_replicas": 2}})


def test_hf_engine_refuses_the_episode_loop():
    from trainer.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match="rollout.loop: 'episodes' needs an engine that serves one turn at a time"):
        config_from_dict({"rollout": {"engine": "hf", "loop": "episodes"}})


# ------------------------------------------------------------------------------------------- whole cells


@pytest.mark.slow
def test_a_lagged_cell_is_the_same_on_either_loop(tmp_path):
    """A recall cell on the reference engine, lagged rollouts: the same metrics and episodes bit for bit whether
    its episodes advance in lock-step turns or each in its own loop; the policy learns meanwhile, so every batch
    after the first was played by new weights."""
    import pandas as pd
    from builders import cell_logs, recall_cell, train_cli, word_policy

    policy = word_policy(tmp_path / "policy")
    for loop in ("turns", "episodes"):
        train_cli(tmp_path, recall_cell(policy, mode="lagged", loop=loop, env_workers=4), loop)
    (m_turns, e_turns), (m_eps, e_eps) = cell_logs(tmp_path / "turns"), cell_logs(tmp_path / "episodes")
    pd.testing.assert_frame_equal(m_eps, m_turns)
    pd.testing.assert_frame_equal(e_eps, e_turns)
    assert m_turns["success_rate"].nunique() > 1


@pytest.mark.slow
def test_a_served_lagged_cell_on_the_episode_loop_equals_the_in_process_lock_step_cell(tmp_path):
    """The episode loop through one rollout server, and through two (turns batched into their generate calls,
    episodes spread over them, weights pushed to each) plays the in-process lock-step cell's episodes bit for
    bit."""
    import pandas as pd
    from builders import cell_logs, recall_cell, train_cli, word_policy

    policy = word_policy(tmp_path / "policy")
    train_cli(tmp_path, recall_cell(policy, mode="lagged"), "here")
    for replicas in (1, 2):
        cell = recall_cell(policy, mode="lagged", server=True, server_replicas=replicas, loop="episodes", env_workers=4)
        run = train_cli(tmp_path, cell, f"served{replicas}")
        assert (
            run.stderr.count("rollout server pid") == replicas and f"replica {replicas - 1} of {replicas}" in run.stderr
        )
        (m_here, e_here), (m_served, e_served) = cell_logs(tmp_path / "here"), cell_logs(tmp_path / f"served{replicas}")
        pd.testing.assert_frame_equal(m_served, m_here)
        pd.testing.assert_frame_equal(e_served, e_here)
    logs = sorted(p.name for p in (tmp_path / "served2" / "rollout-server").glob("*.log"))
    assert logs == ["server-1.log", "server.log"]


@pytest.mark.slow
def test_an_asynchronous_episode_stream_cell_learns_with_bounded_staleness(tmp_path):
    """Async rollouts at episode level: episodes flow across updates, none older than max_staleness is trained on,
    and the policy learns the recall game (settings of test_rollout_server's asynchronous served cell)."""
    from builders import async_recall_learns

    async_recall_learns(tmp_path, loop="episodes", env_workers=4)


# ------------------------------------------------------------------------------------------- continuous batching


class SteppedReferenceLLM:
    """A reference LLM with vLLM's `llm_engine` stepping API: each `step()` finishes the most recently added pending
    request (so requests finish out of arrival order) and returns it with its `request_id`."""

    def __init__(self, model):
        from trainer.rollout.reference_llm import ReferenceLLM

        self.reference = ReferenceLLM(model)
        self.pending, self.steps, self.most_pending = [], 0, 0
        self.llm_engine = self

    def generate(self, *args, **kwargs):
        return self.reference.generate(*args, **kwargs)

    def collective_rpc(self, *args, **kwargs):
        return self.reference.collective_rpc(*args, **kwargs)

    def reset_prefix_cache(self):
        return True

    def add_request(self, request_id, prompt, params):
        self.pending.append((request_id, prompt, params))
        self.most_pending = max(self.most_pending, len(self.pending))

    def has_unfinished_requests(self):
        return bool(self.pending)

    def step(self):
        request_id, prompt, params = self.pending.pop()
        (output,) = self.reference.generate([prompt], [params])
        output.request_id, output.finished = request_id, True
        self.steps += 1
        return [output]


class CallsOnlyLLM:
    """A reference LLM that can only be called (no `llm_engine`, as a rollout server's client): records how many
    requests each generate call carried."""

    def __init__(self, model):
        from trainer.rollout.reference_llm import ReferenceLLM

        self.reference, self.sizes = ReferenceLLM(model), []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        self.sizes.append(len(prompts))
        return self.reference.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def collective_rpc(self, *args, **kwargs):
        return self.reference.collective_rpc(*args, **kwargs)

    def reset_prefix_cache(self):
        return True


def test_batched_calls_play_the_lock_step_episodes(world, monkeypatch):
    """Where the engine cannot be stepped, the turns pending at each call go out together (BatchedTurns): the same
    episodes as lock-step, in fewer calls than turns, some calls carrying several turns."""
    import copy

    from trainer.rollout.episode_loop import BatchedTurns
    from trainer.rollout.reference_llm import ReferenceSamplingParams
    from trainer.rollout.vllm_engine import VLLMEngine

    made = []

    def calls_only_engine(model, fmt):
        llm = CallsOnlyLLM(copy.deepcopy(model))
        made.append(llm)
        return VLLMEngine.from_llm(llm, fmt, sampling_params_cls=ReferenceSamplingParams)

    turns, _ = run_driver(world, "turns", mode="lagged", updates=3)
    monkeypatch.setattr(sys.modules[__name__], "reference_engine", calls_only_engine)
    episodes, driver = run_driver(world, "episodes", mode="lagged", updates=3)
    assert isinstance(driver.turns, BatchedTurns)
    assert [[record(e) for e in b] for b in turns] == [[record(e) for e in b] for b in episodes]
    n_turns = sum(len(e.turns) for b in episodes for e in b)
    assert sum(made[0].sizes) == n_turns and len(made[0].sizes) < n_turns and max(made[0].sizes) > 1


@pytest.mark.parametrize("mode", ["lagged", "async"])
def test_continuous_batching_plays_the_lock_step_episodes(world, mode, monkeypatch):
    """Turns submitted to the stepped engine as they come, finished out of order: under lagged the lock-step
    loop's episodes exactly; under async the bound holds. The stepper saw several requests pending at once."""
    import copy

    from trainer.rollout.continuous import ContinuousTurns
    from trainer.rollout.reference_llm import ReferenceSamplingParams
    from trainer.rollout.vllm_engine import VLLMEngine

    model, fmt = world
    made = []

    def stepped_engine(model, fmt):
        llm = SteppedReferenceLLM(copy.deepcopy(model))
        made.append(llm)
        return VLLMEngine.from_llm(llm, fmt, sampling_params_cls=ReferenceSamplingParams)

    monkeypatch.setattr(sys.modules[__name__], "reference_engine", stepped_engine)
    episodes, driver = run_driver(world, "episodes", mode=mode, updates=3)
    assert isinstance(driver.turns, ContinuousTurns) and driver.turns.steps > 0
    assert made[0].most_pending > 1
    if mode == "lagged":
        monkeypatch.undo()
        turns, _ = run_driver(world, "turns", mode=mode, updates=3)
        assert [[record(e) for e in b] for b in turns] == [[record(e) for e in b] for b in episodes]
    else:
        assert all(v - e.oldest_version <= driver.cfg.max_staleness for v, b in enumerate(episodes) for e in b)
