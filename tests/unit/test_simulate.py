"""Tests of trainer/rollout/simulate.py: the virtual clock, the stand-in engine's timing against hand-computed
values, the two loops' schedules against hand-computed batch times, and a reduced paper cell end to end."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest

from trainer.config import ConfigError
from trainer.environments.protocol import StepInfo, StepResult
from trainer.rollout.episode_loop import Dispatch, VersionGate, play_batch
from trainer.rollout.sampling import SamplingParams
from trainer.rollout.simulate import (
    SimInputs,
    SimulatedEngine,
    StandinCalls,
    StandinFormat,
    load_inputs,
    main,
    run_virtual,
    simulate,
)

SAMPLING = SamplingParams(temperature=1.0, max_turn_tokens=64, max_episode_tokens=4096)


def test_the_virtual_clock_jumps_to_the_next_timer():
    async def main_():
        loop = asyncio.get_running_loop()
        order = []

        async def sleeper(name, s):
            await asyncio.sleep(s)
            order.append((name, loop.time()))

        await asyncio.gather(sleeper("b", 3600.0), sleeper("a", 5.0), sleeper("c", 86400.0 * 3))
        return order

    assert run_virtual(main_()) == [("a", 5.0), ("b", 3600.0), ("c", 259200.0)]


def test_a_deadlock_is_an_error_not_a_hang():
    async def main_():
        await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="simulation deadlock"):
        run_virtual(main_())


def engine_inputs(**kw):
    base = dict(
        gpus=2,
        update_gpus=1,
        min_update_gpus=1,
        action_tokens_median=10.0,
        action_tokens_sigma=0.0,
        step_base_s=0.01,
        step_per_seq_s=0.001,
        kv_s_per_token=1e-5,
        prefill_tokens_per_s=1000.0,
        decode_chunk=1,
    )
    return SimInputs(**{**base, **kw})


def test_one_request_costs_its_prefill_and_its_decode_steps():
    """100 prompt tokens, 10 sampled one step at a time: prefill 100/1000 = 0.1 s; step i (context 100 + i) costs
    0.01 + 0.001 + 1e-5 (100 + i): sum over i = 0..9 = 0.11 + 1e-5 x 1045 = 0.12045 s. Total 0.22045 s."""

    async def main_():
        engine = SimulatedEngine(engine_inputs(), np.random.default_rng(0))
        tokens, logps = await engine.generate([1] * 100, sampling=SAMPLING, max_tokens=64, seed=0, key=10)
        engine.close()
        return tokens, asyncio.get_running_loop().time(), engine.busy_s

    tokens, t, busy = run_virtual(main_())
    assert tokens == [1] * 9 + [2]  # ends with the stop token: the drawn length fit the budget
    assert t == pytest.approx(0.22045) and busy == pytest.approx(0.22045)


def test_the_prefix_cache_and_the_budget_cut():
    """A second turn of the same episode prefills only its new tokens; a budget below the drawn length cuts the
    action without a stop token. Two requests of two episodes share decode steps (continuous batching)."""

    async def main_():
        x = engine_inputs(kv_s_per_token=0.0)
        engine = SimulatedEngine(x, np.random.default_rng(0))
        loop = asyncio.get_running_loop()
        await engine.generate([1] * 100, sampling=SAMPLING, max_tokens=64, seed=0, key=10)  # 0.1 + 10 x 0.011
        t1 = loop.time()
        cut, _ = await engine.generate([1] * 130, sampling=SAMPLING, max_tokens=4, seed=0, key=10)
        t2 = loop.time()  # 20 new tokens (130 - 110 cached): 0.02 + 4 x 0.011
        both = await asyncio.gather(
            engine.generate([1] * 10, sampling=SAMPLING, max_tokens=64, seed=0, key=11),
            engine.generate([1] * 10, sampling=SAMPLING, max_tokens=64, seed=0, key=12),
        )
        t3 = loop.time()  # 20 prefill tokens, then 10 steps of two sequences: 0.02 + 10 x 0.012
        engine.close()
        return t1, cut, t2 - t1, t3 - t2, both

    t1, cut, second, together, both = run_virtual(main_())
    assert t1 == pytest.approx(0.21)
    assert cut == [1, 1, 1, 1] and second == pytest.approx(0.064)
    assert together == pytest.approx(0.14) and all(t == [1] * 9 + [2] for t, _ in both)


class FixedEnv:
    """Turn latencies given by hand: `latencies[k]` is the wait of step k; done after the last."""

    def __init__(self, marker, latencies):
        self.marker, self.latencies, self.owed_s, self.k = marker, latencies, 0.0, 0

    def reset(self, task):
        return "4"

    def step(self, action):
        self.owed_s += self.latencies[self.k]
        self.k += 1
        done = self.k == len(self.latencies)
        return StepResult(observation="2", done=done, reward=1.0, info=StepInfo(tool="t"))

    def close(self):
        pass


@pytest.mark.parametrize("lockstep,workers,seconds", [(True, 8, 11.0), (False, 8, 7.0), (False, 1, 13.0)])
def test_lockstep_rounds_wait_for_the_slowest_tool_call(lockstep, workers, seconds):
    """A free engine (no step cost) and two episodes with tool waits A = (5, 1) and B = (1, 5, 1): lock-step turns
    wait for the slowest of each round, 5 + 5 + 1 = 11 s; each episode on its own ends at its own sum, the batch
    at the longer one, max(6, 7) = 7 s; with one container call at a time, every wait in turn, 13 s."""

    async def main_():
        x = engine_inputs(step_base_s=0.0, step_per_seq_s=0.0, kv_s_per_token=0.0, prefill_tokens_per_s=1e12)
        engine = SimulatedEngine(x, np.random.default_rng(0))
        envs = [FixedEnv(0, [5.0, 1.0]), FixedEnv(1, [1.0, 5.0, 1.0])]
        jobs = [Dispatch(0, "a", 0), Dispatch(1, "b", 1)]
        episodes = await play_batch(
            engine,
            VersionGate(),
            StandinCalls(workers),
            StandinFormat(),
            envs,
            jobs,
            sampling=SAMPLING,
            lockstep=lockstep,
        )
        engine.close()
        return asyncio.get_running_loop().time(), episodes

    t, episodes = run_virtual(main_())
    assert t == pytest.approx(seconds)
    assert [len(e.turns) for e in episodes] == [2, 3] and all(e.done for e in episodes)


REDUCED = dict(
    gpus=4,
    min_update_gpus=1,
    batch_size=8,
    turns_min=2,
    turns_max=6,
    prompt_tokens_median=200.0,
    action_tokens_median=40.0,
    observation_tokens_median=40.0,
    max_episode_tokens=4096,
    max_turn_tokens=512,
)


def test_batched_calls_make_a_late_turn_wait_for_the_call_before_it():
    """Two turns 0.05 s apart, 10 tokens each at 0.011 s a step, no prefill cost: continuous batching finishes the
    late one at 0.05 + 0.11 + (steps shared meanwhile); batched calls start it only after the first call's 0.11 s."""

    async def main_(batching):
        x = engine_inputs(kv_s_per_token=0.0, prefill_tokens_per_s=1e12, engine_batching=batching)
        engine = SimulatedEngine(x, np.random.default_rng(0))

        async def late():
            await asyncio.sleep(0.05)
            await engine.generate([1] * 5, sampling=SAMPLING, max_tokens=64, seed=0, key=11)
            return asyncio.get_running_loop().time()

        _, t = await asyncio.gather(engine.generate([1] * 5, sampling=SAMPLING, max_tokens=64, seed=0, key=10), late())
        engine.close()
        return t

    assert run_virtual(main_("calls")) == pytest.approx(0.11 + 10 * 0.011)
    assert run_virtual(main_("continuous")) < 0.05 + 10 * 0.012 + 0.011


def test_a_reduced_cell_the_episode_loop_is_faster_and_holds_the_bound():
    x = SimInputs(**REDUCED, update_gpus=2, max_staleness=1)
    turns, episodes = simulate(x, "turns", 5), simulate(x, "episodes", 5)
    assert episodes.seconds_per_update < turns.seconds_per_update
    assert episodes.staleness_max <= 1 and turns.staleness_max <= 1
    assert 0 < episodes.engine_busy <= 1 and 0 < episodes.update_busy <= 1
    assert episodes.cell_hours == pytest.approx(episodes.seconds_per_update * x.updates / 3600)
    assert simulate(x, "episodes", 5) == episodes  # deterministic in its seed


def test_the_command_prints_every_placement_and_the_best(tmp_path, capsys):
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text(json.dumps(REDUCED))
    out = tmp_path / "sim.json"
    assert main(["--inputs", str(inputs), "--updates", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best for turns:" in text and "best for episodes:" in text
    results = json.loads(out.read_text())["results"]
    assert sorted({(r["update_gpus"], r["engine_gpus"]) for r in results}) == [(1, 3), (2, 2), (3, 1)]
    args = [
        "--inputs",
        str(inputs),
        "--updates",
        "3",
        "--loop",
        "episodes",
        "--set",
        "update_gpus=2",
        "--json",
        str(out),
    ]
    assert main(args) == 0
    assert [(r["loop"], r["update_gpus"]) for r in json.loads(out.read_text())["results"]] == [("episodes", 2)]
    with pytest.raises(ConfigError, match="--set expects KEY=VALUE"):
        main(["--inputs", str(inputs), "--set", "update_gpus"])


def test_bad_inputs_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: 4\nupdate_gpus: 4\n")
    with pytest.raises(ConfigError, match="bad.yaml: update_gpus: 4 leaves no GPU of 4 for an engine"):
        load_inputs(bad, {})
    bad.write_text("gpu: 4\n")
    with pytest.raises(ConfigError, match="unknown config key.*'gpu'"):
        load_inputs(bad, {})
    with pytest.raises(ConfigError, match="turns_min"):
        dataclasses.replace(SimInputs(), turns_min=50)
