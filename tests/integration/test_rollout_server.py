"""The rollout server (trainer/rollout/server.py) on CPU: its reference backend in a process of its own, weights
broadcast over a gloo group of two, episodes played by the trainer's side against it.

The reference for every check is the same generator in the trainer's own process (`rollout.engine: reference`,
`reference_engine`): a server that plays, loads and stays in step exactly as that does is a transparent process
boundary. On a GPU the same protocol carries vLLM over NCCL (benchmarks/gpu_check_vllm.py); that is not run here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from builders import TASKS, TEXTS, IdTask, TallyEnv, async_recall_learns, cell_logs, recall_cell, train_cli, word_policy

from trainer.policy.chat_format import TinyFormat, build_tokenizer
from trainer.policy.load import save_policy
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rollout.reference_llm import reference_engine
from trainer.rollout.sampling import SamplingParams
from trainer.rollout.server_client import ServerEngine, launch_server

torch.set_num_threads(1)  # as the server's (`launch_server(threads=1)`): equal log-probs need equal reductions

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0, max_turn_tokens=8, max_episode_tokens=400)
SAMPLED = SamplingParams(temperature=1.0, max_turn_tokens=8, max_episode_tokens=400)


def _model(fmt, seed):
    return build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=fmt.vocab_size), seed=seed).eval()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model, its format, and a server started from the model's policy directory (its engine)."""
    tmp = tmp_path_factory.mktemp("server")
    fmt = TinyFormat(build_tokenizer(TEXTS, vocab_size=300))
    model = _model(fmt, seed=3)
    save_policy(model, fmt, tmp / "policy")
    client = launch_server(tmp / "policy", backend="reference", log_path=tmp / "server.log", dtype="float32", seed=0)
    engine = ServerEngine.connect(client, fmt)
    yield model, fmt, engine
    assert engine.llm.close() == 0


def _play(engine, sampling, version=None, seed=1):
    return engine.play(
        [TallyEnv() for _ in TASKS],
        TASKS,
        sampling=sampling,
        policy_version=version,
        generator=torch.Generator().manual_seed(seed),
    )


def _same(got, ref):
    return [dataclasses.asdict(e) for e in got] == [dataclasses.asdict(e) for e in ref]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_served_episodes_equal_the_in_process_generators(served, sampling):
    model, fmt, engine = served
    engine.load_state_dict(model.state_dict(), 0)
    assert _same(_play(engine, sampling), _play(reference_engine(model, fmt), sampling))
    stats = engine.last_stats
    assert stats["generate_calls"] >= 2 and stats["generated_tokens"] > 0


def test_pushed_weights_are_the_ones_served(served):
    """After a push the server plays the new weights exactly, as the version pushed; the old and new weights play
    differently, so the comparison would see a push that did not land."""
    model, fmt, engine = served
    new = _model(fmt, seed=4)
    engine.load_state_dict(model.state_dict(), 0)
    before = _play(engine, GREEDY)
    engine.load_state_dict(new.state_dict(), 7)
    after = _play(engine, GREEDY)
    assert not _same(before, after)
    assert _same(after, _play(reference_engine(new, fmt), GREEDY, version=7))
    assert {v for e in after for v in e.versions if v >= 0} == {7}  # -1: tokens no policy wrote


def test_a_bad_push_is_refused_by_name_and_the_server_stays_in_step(served):
    model, fmt, engine = served
    state = model.state_dict()
    missing = dict(list(state.items())[1:])
    with pytest.raises(RuntimeError, match="not in the state dict"):
        engine.load_state_dict(missing, 1)
    with pytest.raises(RuntimeError, match="no parameter 'model.not_a_weight'"):
        engine.load_state_dict({**state, "model.not_a_weight": torch.zeros(3)}, 1)
    huge = torch.empty((10**13,), device="meta")  # its server-side buffer (40 TB) cannot be allocated
    with pytest.raises(RuntimeError, match=r"rollout server: RuntimeError: .*(memory|allocat)"):
        engine.load_state_dict({**state, "model.huge": huge}, 1)  # refused before anything was broadcast
    engine.load_state_dict(state, 2)  # the broadcast stream is still in step: a whole push lands
    assert _same(_play(engine, SAMPLED), _play(reference_engine(model, fmt), SAMPLED, version=2))


@pytest.mark.slow
def test_the_server_exits_when_its_trainer_is_killed(tmp_path, served):
    model, fmt, _ = served
    save_policy(model, fmt, tmp_path / "policy")
    trainer = textwrap.dedent(f"""
        import sys, time
        from trainer.rollout.server_client import launch_server
        client = launch_server({str(tmp_path / "policy")!r}, backend="reference", log_path={str(tmp_path / "log")!r},
                               dtype="float32", seed=0)
        print(client.info["pid"], flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    server_pid = int(proc.stdout.readline())
    os.kill(server_pid, 0)  # alive
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(f"/proc/{server_pid}/stat") as f:  # a zombie (exited, parent gone) counts as exited
                if f.read().split()[2] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(server_pid, signal.SIGKILL)
        pytest.fail("the rollout server outlived its trainer by 30 s")


def _own_server(tmp_path, model, fmt):
    """A server of the test's own (one it may kill), started from `model`."""
    save_policy(model, fmt, tmp_path / "policy")
    return launch_server(
        tmp_path / "policy", backend="reference", log_path=tmp_path / "server.log", dtype="float32", seed=0
    )


@pytest.mark.slow
def test_a_dead_server_is_a_clear_error(tmp_path, served):
    model, fmt, _ = served
    client = _own_server(tmp_path, model, fmt)
    engine = ServerEngine.connect(client, fmt)
    os.kill(client.info["pid"], signal.SIGKILL)
    client.process.wait()
    with pytest.raises(RuntimeError, match=r"rollout server is gone .*exit code -9.*server\.log"):
        _play(engine, GREEDY)


def _stream(engine, fmt, sampling, seed=1):
    """The episode loop's batch over `engine.turn_engine()` with the seeds `_play` draws."""
    from trainer.rollout.episode_loop import Dispatch, EnvCalls, VersionGate, play_batch
    from trainer.rollout.vllm_engine import request_seeds

    turns = engine.turn_engine()
    seeds = request_seeds(len(TASKS), torch.Generator().manual_seed(seed))
    jobs = [Dispatch(t, str(t), s) for t, s in zip(TASKS, seeds)]
    calls = EnvCalls(4)
    gate = None

    async def main():
        nonlocal gate
        gate = VersionGate(engine.policy_version)
        return await play_batch(turns, gate, calls, fmt, [TallyEnv() for _ in TASKS], jobs, sampling=sampling)

    try:
        return turns, asyncio.run(main())
    finally:
        calls.close()
        turns.close()


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_streamed_turns_play_the_lock_step_episodes(served, sampling):
    """The episode loop's turns streamed to the server, which steps its engine for them as they come: the episodes
    the lock-step loop plays through the control channel, field by field."""
    from trainer.rollout.server_client import StreamingTurns

    model, fmt, engine = served
    engine.load_state_dict(model.state_dict(), 0)
    turns, got = _stream(engine, fmt, sampling)
    assert isinstance(turns, StreamingTurns) and engine.llm.info["turns"] is True
    assert _same(got, _play(engine, sampling))


def test_a_dead_server_fails_the_streamed_turns_waiting(tmp_path, served):
    """Killed with its turns channel open: the turn waiting, and any later one, fail with the exit code and log."""
    model, fmt, _ = served
    client = _own_server(tmp_path, model, fmt)
    engine = ServerEngine.connect(client, fmt)
    turns = engine.turn_engine()

    async def turn():
        return await turns.generate([1, 2, 3], sampling=GREEDY, max_tokens=4, seed=None)

    os.kill(client.info["pid"], signal.SIGKILL)
    client.process.wait()
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"rollout server is gone .*exit code -9.*server\.log"):
            asyncio.run(asyncio.wait_for(turn(), 30))
    turns.close()


@pytest.mark.slow
def test_a_server_dying_under_asynchronous_rollouts_fails_the_batch(tmp_path, served):
    """The rollout thread's error reaches the trainer's thread (before: it waited for episodes forever)."""
    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    model, fmt, _ = served
    client = _own_server(tmp_path, model, fmt)
    driver = RolloutDriver(
        ServerEngine.connect(client, fmt),
        TallyEnv,
        TaskSampler([IdTask(t) for t in TASKS]),
        RolloutConfig(mode="async", batch_size=4, max_staleness=1),
        GREEDY,
    )
    driver.publish(model.state_dict(), 0)
    assert len(driver.next_batch(0)) == 4
    os.kill(client.info["pid"], signal.SIGKILL)
    started = time.time()
    with pytest.raises(RuntimeError, match=r"rollout thread failed: RuntimeError: the rollout server is gone"):
        for version in range(1, 100):  # the queue may still hold a batch played before the kill
            driver.next_batch(version)
    assert time.time() - started < 60
    driver.close()


def test_a_server_that_cannot_start_says_why(tmp_path):
    with pytest.raises(RuntimeError, match=r"did not start \(exit code 1\)(.|\n)*no-such-policy"):
        launch_server(
            tmp_path / "no-such-policy", backend="reference", log_path=tmp_path / "server.log", dtype="float32", seed=0
        )


# ------------------------------------------------------------------------------------------- cells


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_served_cell_equals_the_in_process_cell_bit_for_bit(tmp_path, nproc):
    """Lagged rollouts (deterministic): the same metrics and episodes whether the generator runs in the trainer or
    in a server fed by weight pushes, for a one-process trainer and a sharded two-process one. The policy learns
    meanwhile (its success moves), so every push carried new weights."""
    policy = word_policy(tmp_path / "policy")
    here = train_cli(tmp_path, recall_cell(policy, mode="lagged"), "here", nproc)
    served = train_cli(tmp_path, recall_cell(policy, mode="lagged", server=True), "served", nproc)
    assert "rollout server pid" in served.stderr and "rollout server" not in here.stderr
    (m_here, e_here), (m_served, e_served) = cell_logs(tmp_path / "here"), cell_logs(tmp_path / "served")
    pd.testing.assert_frame_equal(m_served, m_here)
    pd.testing.assert_frame_equal(e_served, e_here)
    assert m_here["success_rate"].nunique() > 1 and (m_here["loss"] != 0).any()
    assert (tmp_path / "served" / "rollout-server" / "server.log").is_file()


@pytest.mark.slow
def test_an_asynchronous_served_cell_learns_with_bounded_staleness(tmp_path):
    """Single-stream asynchronous RL with generation in its own process: the rollout thread pushes each newer
    policy as it appears, no episode older than max_staleness is trained on, and the policy learns the recall game
    (it could not with weights that never reached the server); settings and bounds in `async_recall_learns`."""
    train = async_recall_learns(tmp_path, server=True)
    assert train["staleness"].max() >= 1  # generation really ran ahead of the update
