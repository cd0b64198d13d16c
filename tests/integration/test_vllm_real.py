"""The vLLM engine against real vLLM on CPU (`vllm-cpu`, in the `.venv-vllm` environment that
`envs/vllm-cpu-venv.sh` builds; run with `.venv-vllm/bin/python -m pytest -m vllm`).

The references are the Hugging Face engine and a full-sequence forward of the same weights (both fp32, as the
engine here): greedy episodes are the same token for token, every recorded log-prob is
`log_softmax(logits / T)[token]` within `LOGP_TOL`, and after a weight push the engine plays the new weights.
One engine is started per module (about 10 s eager on 2 cores) and its weights are pushed back after each test
that changes them.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from trainer.environments.protocol import StepInfo, StepResult
from trainer.policy.load import new_tiny_policy, save_policy
from trainer.rollout.hf_engine import HFEngine
from trainer.rollout.sampling import SamplingParams
from trainer.rollout.vllm_engine import VLLMEngine

pytestmark = pytest.mark.vllm  # without vLLM installed, tests/conftest.py skips them with the reason

ROOT = Path(__file__).resolve().parents[2]
LOGP_TOL = 2e-4
"""fp32 on both sides; vLLM's CPU kernels sum in another order than torch's, so log-probs differ in the last
digits (measured: ~1e-5)."""

TEXTS = [f"tally {i}: apples and pears, turn {i % 4} saw {i} chars" for i in range(40)]
TASKS = list(range(6))


class TallyEnv:
    """2-4 turns by task; observations of task- and turn-dependent length; reward on even tasks."""

    max_turns = 4

    def reset(self, task):
        self.task, self.k = task, 0
        return f"tally {task}:" + " apples" * (task % 4)

    def step(self, action):
        self.k += 1
        done = self.k >= 2 + self.task % 3
        obs = f"turn {self.k} saw {len(action)}" + " pears" * ((self.task + 2 * self.k) % 5)
        return StepResult(
            observation=obs, done=done, reward=float(done and self.task % 2 == 0), info=StepInfo(tool="tally")
        )

    def close(self):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(model, format, engine): a tiny Qwen2 policy saved to disk and real vLLM serving it in fp32."""
    model, fmt = new_tiny_policy("qwen2.5-tiny", TEXTS, vocab_size=300, seed=3)
    model.eval()
    path = tmp_path_factory.mktemp("policy")
    save_policy(model, fmt, path)
    engine = VLLMEngine(str(path), fmt, dtype="float32", seed=0, enforce_eager=True, max_model_len=512)
    return model, fmt, engine


def forward_logp(model, episode, temperature=1.0):
    tokens = torch.tensor([episode.tokens])
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=tokens).logits[0, :-1].float() / temperature, -1)
    return logp.gather(-1, tokens[0, 1:, None])[:, 0]


def assert_same_episodes(got, ref):
    for g, r in zip(got, ref, strict=True):
        assert g.tokens == r.tokens
        assert (g.loss_mask, g.versions, g.turn_index, g.turns) == (r.loss_mask, r.versions, r.turn_index, r.turns)
        assert (g.reward, g.done, g.truncated) == (r.reward, r.done, r.truncated)
        assert g.rollout_logp == pytest.approx(r.rollout_logp, abs=LOGP_TOL)


GREEDY = SamplingParams(temperature=0, max_turn_tokens=8, max_episode_tokens=200)


def test_greedy_episodes_equal_the_hf_engine(served):
    model, fmt, engine = served
    got = engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY, policy_version=2)
    ref = HFEngine(model, fmt).play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY, policy_version=2)
    assert_same_episodes(got, ref)
    assert sum(len(e.turns) for e in got) >= 2 * len(TASKS)


@pytest.mark.parametrize("family", ["qwen3", "minicpm"])
def test_a_family_release_serves_as_the_hf_engine_plays_it(tmp_path, family):
    """tests/vllm_family_check.py in a process of its own (a second in-process vLLM engine, once closed, takes the
    module engine's parallel groups with it): a paper family's release, loaded as configs/paper.yaml loads it and
    saved as a policy, served by vLLM, playing the Hugging Face engine's greedy episodes before and after a push."""
    script = ROOT / "tests" / "vllm_family_check.py"
    r = subprocess.run(
        [sys.executable, str(script), family, str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"{family}: served as played" in r.stdout


@pytest.mark.parametrize("turn,budget", [(1, 30), (3, 41), (6, 57), (8, 90)])
def test_turn_limits_and_token_budgets_end_episodes_as_the_hf_engine_does(served, turn, budget):
    """Actions cut at the turn limit, episodes cut at the token budget mid-action (recorded, not executed) or
    after an observation with no room left: the same episodes as the Hugging Face engine's."""
    model, fmt, engine = served
    sp = SamplingParams(temperature=0, max_turn_tokens=turn, max_episode_tokens=budget)
    got = engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=sp)
    assert_same_episodes(got, HFEngine(model, fmt).play([TallyEnv() for _ in TASKS], TASKS, sampling=sp))
    assert all(e.length <= budget and all(1 <= t.length <= turn for t in e.turns) for e in got)
    if budget < 60:
        assert any(e.truncated for e in got)


class LongTallyEnv(TallyEnv):
    """A first observation longer than a KV block (128 tokens on a CPU), so later turns can reuse cached blocks."""

    def reset(self, task):
        return super().reset(task) + " apples and pears" * 60


def test_later_turns_are_served_from_the_prefix_cache(served):
    model, fmt, engine = served
    sp = SamplingParams(temperature=0, max_turn_tokens=8, max_episode_tokens=500)
    got = engine.play([LongTallyEnv() for _ in TASKS[:2]], TASKS[:2], sampling=sp)
    assert min(len(fmt.prompt_ids(e.observations[0])) for e in got) > 128 and all(len(e.turns) >= 2 for e in got)
    stats = engine.last_stats
    assert 0 < stats["cached_prompt_tokens"] < stats["prompt_tokens"], stats
    assert_same_episodes(got, HFEngine(model, fmt).play([LongTallyEnv() for _ in TASKS[:2]], TASKS[:2], sampling=sp))


@pytest.mark.parametrize("mode_t", [0.7, 1.0])
def test_sampled_logps_equal_the_full_sequence_forward(served, mode_t):
    model, fmt, engine = served
    episodes = engine.play(
        [TallyEnv() for _ in TASKS[:4]],
        TASKS[:4],
        generator=torch.Generator().manual_seed(1),
        sampling=SamplingParams(temperature=mode_t, max_turn_tokens=6, max_episode_tokens=200),
    )
    for ep in episodes:
        ref = forward_logp(model, ep, mode_t)
        mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)
        assert mask.any()
        assert (ref[mask] - torch.tensor(ep.rollout_logp[1:])[mask]).abs().max().item() < LOGP_TOL


def test_seeded_sampling_repeats_and_differs_by_seed(served):
    _, _, engine = served
    sp = SamplingParams(temperature=1.0, max_turn_tokens=6, max_episode_tokens=200)

    def run(seed):
        return [
            e.tokens
            for e in engine.play(
                [TallyEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(seed)
            )
        ]

    assert run(5) == run(5)
    assert run(5) != run(6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_batching_plays_the_lock_step_episodes(served, temperature):
    """`rollout.loop: episodes` on vLLM's in-process engine (turns added to the running batch as they come, steps
    finishing them out of order) plays the lock-step loop's episodes, greedy and seeded: every token, turn and
    reward, log-probs within LOGP_TOL (the same requests in other batch compositions)."""
    from builders import IdTask, SleepyTallyEnv

    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.continuous import ContinuousTurns
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    model, fmt, engine = served
    sp = SamplingParams(temperature=temperature, max_turn_tokens=6, max_episode_tokens=200)
    runs = {}
    for loop in ("turns", "episodes"):
        cfg = RolloutConfig(engine="vllm", loop=loop, mode="sync", batch_size=8, env_workers=4)
        driver = RolloutDriver(engine, SleepyTallyEnv, TaskSampler([IdTask(i) for i in range(12)], seed=2), cfg, sp)
        driver.publish(model.state_dict(), 0)
        try:
            runs[loop] = [driver.next_batch(v) for v in range(2)]
            if loop == "episodes":
                assert isinstance(driver.turns, ContinuousTurns) and driver.turns.steps > 0
        finally:
            driver.close()
    for got, ref in zip(runs["episodes"], runs["turns"], strict=True):
        assert_same_episodes(got, ref)


def test_a_weight_push_plays_the_new_weights(served):
    """Long first observations: the old weights' KV of their first blocks sits in the prefix cache when the new
    weights arrive, so a push that left it there would show."""
    model, fmt, engine = served
    sp = SamplingParams(temperature=0, max_turn_tokens=8, max_episode_tokens=500)
    before = engine.play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(1.5).add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    try:
        engine.load_state_dict(changed.state_dict(), version=7)
        got = engine.play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp)
        assert engine.last_stats["cached_prompt_tokens"] > 0  # later turns still hit the cache, of the new weights
        ref = HFEngine(changed, fmt).play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp, policy_version=7)
        assert_same_episodes(got, ref)
        assert [e.tokens for e in got] != [e.tokens for e in before]  # the push changed what is played
    finally:
        engine.load_state_dict(model.state_dict(), version=0)
    assert_same_episodes(engine.play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp), before)


def test_without_the_cache_reset_the_old_weights_kv_would_be_played(served, monkeypatch):
    """Why the push drops the prefix cache: the same push with the reset skipped plays blocks of the old weights'
    KV (every episode differs from the new weights' own)."""
    model, fmt, engine = served
    sp = SamplingParams(temperature=0, max_turn_tokens=8, max_episode_tokens=500)
    engine.play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp)  # the old weights' KV in the cache
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(1.5)
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda *args, **kwargs: True)
    try:
        engine.load_state_dict(changed.state_dict(), version=7)
        got = engine.play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp)
    finally:
        monkeypatch.undo()
        engine.load_state_dict(model.state_dict(), version=0)
    ref = HFEngine(changed, fmt).play([LongTallyEnv() for _ in TASKS], TASKS, sampling=sp, policy_version=7)
    assert all(g.tokens != r.tokens for g, r in zip(got, ref))


def test_a_partial_push_raises_and_keeps_the_version(served):
    model, _, engine = served
    partial = {k: v for k, v in model.state_dict().items() if "mlp" not in k}
    with pytest.raises(RuntimeError, match="not in the state dict"):
        engine.load_state_dict(partial, version=9)
    assert engine.policy_version == 0
    engine.load_state_dict(model.state_dict(), version=0)


def test_an_unservable_head_size_is_refused_before_vllm_starts(tmp_path):
    model, fmt = new_tiny_policy("qwen-tiny", TEXTS, vocab_size=300)
    save_policy(model, fmt, tmp_path)
    with pytest.raises(ValueError, match="head size 40 cannot be served by vLLM on a CPU"):
        VLLMEngine(str(tmp_path), fmt, dtype="float32", enforce_eager=True)


def test_a_model_whose_vllm_class_needs_torchvision_is_refused_before_vllm_starts(tmp_path):
    """Qwen3.5's vLLM class imports torchvision, which envs/vllm-cpu-venv.sh removes (PyPI has only CUDA builds)."""
    model, fmt = new_tiny_policy("qwen3.5-tiny", TEXTS, vocab_size=300)
    save_policy(model, fmt, tmp_path)
    with pytest.raises(ValueError, match="qwen3_5_text model imports torchvision, which is not installed"):
        VLLMEngine(str(tmp_path), fmt, dtype="float32", enforce_eager=True)


# ------------------------------------------------------------------------------------------- the rollout server


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    """The engine in a rollout server of its own (python -m trainer.rollout.server --backend vllm), weights pushed
    over a gloo group of two."""
    from trainer.rollout.server_client import ServerEngine, launch_server

    model, fmt, _ = served
    tmp = tmp_path_factory.mktemp("server")
    save_policy(model, fmt, tmp / "policy")
    client = launch_server(
        tmp / "policy",
        backend="vllm",
        log_path=tmp / "server.log",
        dtype="float32",
        seed=0,
        max_model_len=512,
        enforce_eager=True,
    )
    engine = ServerEngine.connect(client, fmt)
    yield engine
    assert engine.llm.close() == 0


def test_the_server_plays_what_the_colocated_engine_plays(served, server):
    model, fmt, engine = served
    assert server.llm.info["device"] == "cpu" and server.llm.backend == "gloo"
    sampled = SamplingParams(temperature=1.0, max_turn_tokens=8, max_episode_tokens=200)
    for sp in (GREEDY, sampled):
        got = server.play([TallyEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(2))
        ref = engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(2))
        assert_same_episodes(got, ref)


def test_turns_streamed_to_the_server_play_what_the_colocated_engine_plays(served, server):
    """The episode loop's turns streamed to vLLM in the server, which steps its engine for them as they come
    (continuous batching there): the colocated lock-step engine's episodes, greedy and seeded."""
    import asyncio

    from builders import SleepyTallyEnv

    from trainer.rollout.episode_loop import Dispatch, EnvCalls, VersionGate, play_batch
    from trainer.rollout.server_client import StreamingTurns
    from trainer.rollout.vllm_engine import request_seeds

    model, fmt, engine = served
    sampled = SamplingParams(temperature=1.0, max_turn_tokens=8, max_episode_tokens=200)
    for sp in (GREEDY, sampled):
        turns, calls = server.turn_engine(), EnvCalls(4)
        assert isinstance(turns, StreamingTurns)
        seeds = request_seeds(len(TASKS), torch.Generator().manual_seed(2))
        jobs = [Dispatch(t, str(t), s) for t, s in zip(TASKS, seeds)]

        async def main(turns=turns, calls=calls, jobs=jobs, sp=sp):
            return await play_batch(
                turns, VersionGate(), calls, fmt, [SleepyTallyEnv() for _ in TASKS], jobs, sampling=sp
            )

        try:
            got = asyncio.run(main())
        finally:
            calls.close()
            turns.close()
        ref = engine.play(
            [SleepyTallyEnv() for _ in TASKS], TASKS, sampling=sp, generator=torch.Generator().manual_seed(2)
        )
        assert_same_episodes(got, ref)


def test_weights_pushed_to_the_server_are_played_and_a_bad_push_keeps_it_in_step(served, server):
    model, fmt, _ = served
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(-1.0)
    server.load_state_dict(changed.state_dict(), 3)
    got = server.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY)
    assert_same_episodes(
        got, HFEngine(changed, fmt).play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY, policy_version=3)
    )
    with pytest.raises(RuntimeError, match="not in the state dict"):
        server.load_state_dict({k: v for k, v in model.state_dict().items() if "mlp" not in k}, 4)
    assert server.policy_version == 3
    server.load_state_dict(model.state_dict(), 5)  # the broadcast stream is still in step: a whole push lands
    assert_same_episodes(
        server.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY),
        HFEngine(model, fmt).play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY, policy_version=5),
    )


def _own_server(served, tmp_path):
    """(client, engine) of a vLLM rollout server of the test's own, for tests that break it."""
    from trainer.rollout.server_client import ServerEngine, launch_server

    model, fmt, _ = served
    save_policy(model, fmt, tmp_path / "policy")
    client = launch_server(
        tmp_path / "policy",
        backend="vllm",
        log_path=tmp_path / "server.log",
        dtype="float32",
        seed=0,
        max_model_len=512,
        enforce_eager=True,
    )
    return client, ServerEngine.connect(client, fmt)


@pytest.mark.slow
def test_a_dead_vllm_server_is_a_clear_error(served, tmp_path):
    client, engine = _own_server(served, tmp_path)
    os.kill(client.info["pid"], signal.SIGKILL)
    client.process.wait()
    with pytest.raises(RuntimeError, match=r"rollout server is gone .*exit code -9.*server\.log"):
        engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY)


@pytest.mark.slow
def test_a_stalled_vllm_server_is_a_clear_error_within_the_deadline(served, tmp_path):
    """A server that stops answering (stopped here with SIGSTOP) fails the request once the client's deadline
    passes, naming the request, and the client refuses further use: its replies would be out of step."""
    client, engine = _own_server(served, tmp_path)
    assert len(engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY)) == len(TASKS)
    client.timeout_s = 3.0
    os.kill(client.info["pid"], signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"no answer to 'generate' in 3 s"):
            engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY)
        assert time.monotonic() - start < 30
        with pytest.raises(RuntimeError, match="unusable"):
            engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY)
    finally:
        os.kill(client.info["pid"], signal.SIGKILL)
        os.kill(client.info["pid"], signal.SIGCONT)
        client.process.wait()


# ------------------------------------------------------------------------------------------- whole cells


def _recall_cell(policy, engine="vllm", **rollout):
    """tests/integration/test_rollout_server.py's recall cell (learns in ~25 updates), 30 updates of 128 episodes."""
    from builders import recall_cell

    cell = recall_cell(policy, engine=engine, **rollout)
    if engine == "vllm":
        cell["rollout"]["vllm_enforce_eager"] = True
    cell["rollout"]["batch_size"] = 128
    cell["run"].update(updates=30, eval_every=30)
    return cell


def _success(tmp_path, cell, nproc=1):
    """(the run's stderr, its training success per update, its training episodes)."""
    from builders import cell_logs, train_cli, word_policy

    policy = word_policy(tmp_path / "policy", preset="qwen2.5-tiny")
    run = train_cli(tmp_path, cell(policy), "cell", nproc)
    metrics, episodes = cell_logs(tmp_path / "cell")
    return run.stderr, metrics["success_rate"].to_numpy(), episodes[episodes["split"] == "train"]


@pytest.fixture(scope="module")
def hf_success(tmp_path_factory):
    """The same cell on the Hugging Face engine, per rollout mode (trained once each): the reference curves."""
    curves = {}

    def success(mode):
        if mode not in curves:
            curves[mode] = _success(
                tmp_path_factory.mktemp(f"hf-{mode}"),
                lambda policy: _recall_cell(policy, "hf", mode=mode, max_staleness=2),
            )[1]
        return curves[mode]

    return success


AUC_TOL = 0.1
"""Largest gap in mean training success over the 30 updates between a vLLM cell and the Hugging Face cell of the
same rollout mode. The two engines sample with different generators, so their episodes differ. Measured (seed 0):
HF lagged 0.72 (seed 1: 0.72), vLLM lagged 0.73; HF async 0.68, vLLM async in the server 0.63 (one of SPO's dips
after all-success batches in its last updates). Chosen after those runs."""


@pytest.mark.slow
@pytest.mark.parametrize(
    "server,mode,nproc", [(False, "lagged", 1), (False, "async", 1), (True, "async", 1), (True, "lagged", 2)]
)
def test_a_vllm_cell_learns_the_recall_game_as_the_hf_cell_does(tmp_path, hf_success, server, mode, nproc):
    """Colocated and in the rollout server, lagged and asynchronous, one trainer process and a sharded two: the
    policy learns the game (it could not if the pushed weights never reached vLLM) about as the Hugging Face
    engine's cell does, and no episode is staler than the mode allows."""
    stderr, success, train = _success(
        tmp_path, lambda policy: _recall_cell(policy, server=server, mode=mode, max_staleness=2), nproc
    )
    curve = " ".join(f"{x:.2f}" for x in success)
    assert ("rollout server pid" in stderr) == server
    assert (train["staleness"] <= (2 if mode == "async" else 1)).all()
    assert success[:3].mean() <= 0.3 and max(success[k : k + 5].mean() for k in range(26)) >= 0.9, curve
    reference = hf_success(mode)
    assert abs(success.mean() - reference.mean()) <= AUC_TOL, (curve, " ".join(f"{x:.2f}" for x in reference))


def test_vllm_in_a_sharded_trainer_is_refused_up_front(tmp_path):
    """In the trainer's rank 0 vLLM would build its process groups on the trainer's, which the other ranks never
    join: the cell hung (measured) until this was refused."""
    from builders import word_policy

    policy = word_policy(tmp_path / "policy", preset="qwen2.5-tiny")
    (tmp_path / "cell.yaml").write_text(yaml.safe_dump(_recall_cell(policy, mode="lagged")))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "trainer",
            "train",
            "--config",
            str(tmp_path / "cell.yaml"),
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode != 0 and "run vLLM in the rollout server (rollout.server: true)" in run.stderr


# ------------------------------------------------------------------------------------------- the GPU check, on CPU


@pytest.mark.slow
@pytest.mark.parametrize("server", [False, True], ids=["colocated", "server"])
def test_the_gpu_check_passes_on_cpu(tmp_path, server):
    """benchmarks/gpu_check_vllm.py, the check kept for a GPU machine, with vllm-cpu: the same episodes, log-prob,
    weight-push and prefix-cache checks (bfloat16 on both sides), eager."""
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check_vllm.py"),
            "--eager",
            "--out",
            str(out),
            *(["--server"] * server),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.is_file(), f"no summary; stderr tail:\n{proc.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    assert proc.returncode == 0 and summary["status"] == "PASS", summary
    assert summary["metrics"].get("weight_channel", "gloo") == "gloo"


def test_a_saved_tiny_policy_is_a_model_vllm_serves_with_its_own_chat_template(tmp_path):
    """A study's tiny policy (minicpm-tiny; qwen-tiny's head size 40 is not one vLLM's CPU attention serves): vLLM
    reads its tokenizer (the model's vocabulary, `<eot>` its EOS) and renders a conversation with the saved chat
    template to the ids the harness's TinyFormat builds. (The qwen2.5-tiny test preset is the exception:
    transformers gives a qwen2 model Qwen2Tokenizer, which rebuilds the BPE with Qwen's own split.)"""
    from vllm import SamplingParams as VLLMSampling

    model, fmt = new_tiny_policy("minicpm-tiny", TEXTS, vocab_size=300, seed=3)
    save_policy(model, fmt, tmp_path / "policy")
    engine = VLLMEngine(str(tmp_path / "policy"), fmt, dtype="float32", seed=0, enforce_eager=True, max_model_len=512)
    tokenizer = engine.llm.get_tokenizer()
    assert len(tokenizer) == model.config.vocab_size and tokenizer.eos_token_id == fmt.eot_id
    messages = [
        {"role": "user", "content": TEXTS[0]},
        {"role": "assistant", "content": TEXTS[1]},
        {"role": "tool", "content": TEXTS[2]},
    ]
    (out,) = engine.llm.chat(messages, VLLMSampling(max_tokens=4, temperature=0), use_tqdm=False)
    want = fmt.prompt_ids(TEXTS[0]) + fmt.action_ids(TEXTS[1]) + fmt.observation_ids(TEXTS[2])
    assert list(out.prompt_token_ids) == want
