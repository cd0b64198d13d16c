"""Tests of trainer/rollout/env_pool.py and of the engines' and driver's use of it (`rollout.env_workers`).

The pool alone: results in input order, calls side by side up to the width, the caller's thread at width 1, an
exception raised in the caller (its own type) only after every call of the batch has returned. Through the HF
engine and the rollout driver, with an environment whose calls sleep: at width 4 the batch's resets, steps and
closes overlap and the batch takes a fraction of the sequential time, with the same episodes; an environment that
raises surfaces in the caller, after the other environments' calls returned, and every environment is closed.
The engines' episodes at widths 1 and 4 on a real environment family are compared in test_hf_engine.py and
test_vllm_engine.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from trainer.environments.protocol import StepInfo, StepResult
from trainer.policy.chat_format import TinyFormat, build_tokenizer
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rollout.config import RolloutConfig
from trainer.rollout.driver import RolloutDriver, TaskSampler
from trainer.rollout.env_pool import EnvPool
from trainer.rollout.hf_engine import HFEngine
from trainer.rollout.sampling import SamplingParams

torch.set_num_threads(1)


class Tracker:
    """Counts environment calls in flight (the most at once) and records misuse: an env called by two threads at
    once, or called after it was closed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.threads: set[str] = set()
        self.events: list[tuple[str, int]] = []
        self.misuse: list[str] = []

    def enter(self, env, what: str) -> None:
        with self.lock:
            if env.busy or env.closed:
                self.misuse.append(f"{what} on env {env.task} (busy={env.busy}, closed={env.closed})")
            env.busy = True
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.threads.add(threading.current_thread().name)
            self.events.append((f"{what}>", env.task))

    def leave(self, env, what: str) -> None:
        with self.lock:
            env.busy = False
            self.in_flight -= 1
            self.events.append((f"<{what}", env.task))


class SleepyEnv:
    """3 turns; every reset, step, grading and close sleeps `delay` seconds (a sandbox's wait), a little longer
    for some tasks so the calls of one batch finish out of order; task `fail_on` raises `SandboxDown` at its
    second step. Reward 1 for even tasks; an episode cut at the budget is graded 0.5."""

    max_turns = 3

    def __init__(self, tracker: Tracker, delay: float = 0.05, fail_on: int | None = None):
        self.tracker, self.delay, self.fail_on = tracker, delay, fail_on
        self.task, self.busy, self.closed = None, False, False

    def _call(self, what: str, fn):
        self.tracker.enter(self, what)
        try:
            time.sleep(self.delay * (1 + (self.task * 7 + self.k) % 3 / 4))
            return fn()
        finally:
            self.tracker.leave(self, what)

    def reset(self, task) -> str:
        self.task, self.k = task.n, 0
        return self._call("reset", lambda: f"task {self.task}" + " apples" * (self.task % 3))

    def step(self, action: str) -> StepResult:
        def run():
            self.k += 1
            if self.task == self.fail_on and self.k == 2:
                raise SandboxDown(f"task {self.task}: the sandbox died")
            done = self.k >= self.max_turns
            obs = f"turn {self.k} got {len(action)} chars" + " pears" * ((self.task + self.k) % 4)
            return StepResult(obs, done, float(done and self.task % 2 == 0), StepInfo(tool="t"))

        return self._call("step", run)

    def truncated_reward(self) -> float:
        return self._call("grade", lambda: 0.5)

    def close(self) -> None:
        if self.task is None:
            self.closed = True
            return
        self._call("close", lambda: None)
        self.closed = True


class SandboxDown(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------- the pool alone


def test_results_in_input_order_and_width_one_stays_on_the_callers_thread():
    caller = threading.current_thread().name
    with EnvPool(1) as pool:
        assert pool.map(lambda x: (x * x, threading.current_thread().name), range(5)) == [
            (x * x, caller) for x in range(5)
        ]
    with EnvPool(3) as pool:
        out = pool.map(lambda x: (time.sleep(0.01 * (5 - x)), x * x, threading.current_thread().name)[1:], range(5))
        assert [v for v, _ in out] == [x * x for x in range(5)]  # input order, though they finished in reverse
        assert caller not in {name for _, name in out}
        assert pool.map(lambda x: threading.current_thread().name, [0]) == [caller]  # one item: no thread
        assert pool.map(lambda x: x, []) == []


def test_calls_overlap_up_to_the_width():
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def call(_):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1

    with EnvPool(3) as pool:
        pool.map(call, range(7))
    assert state["most"] == 3


def test_an_exception_surfaces_after_every_call_of_the_batch_returned():
    finished = []

    def call(x):
        if x in (1, 3):
            raise KeyError(x)
        time.sleep(0.05)
        finished.append(x)

    with EnvPool(4) as pool:
        with pytest.raises(KeyError) as err:
            pool.map(call, range(6))
        assert err.value.args == (1,)  # the first failing item's, whichever failed first
        assert sorted(finished) == [0, 2, 4, 5]
        assert pool.map(lambda x: x + 1, [1, 2]) == [2, 3]  # the pool still works


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2"])
def test_a_width_below_one_is_refused(workers):
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        EnvPool(workers)


# ------------------------------------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def policy():
    fmt = TinyFormat(build_tokenizer([f"task {i} apples pears turn {i} got chars" for i in range(30)], vocab_size=300))
    return build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=fmt.vocab_size), seed=2), fmt


TASKS = [SimpleNamespace(task_id=f"t{n}", n=n) for n in range(4)]


def play_batch(
    policy,
    width: int,
    fail_on: int | None = None,
    budget: int = 400,
    tracker: Tracker | None = None,
    envs: list | None = None,
):
    """One driver batch of the 4 tasks at `width`: (episodes, tracker, the envs, seconds)."""
    model, fmt = policy
    tracker = Tracker() if tracker is None else tracker
    envs = [] if envs is None else envs

    def make_env():
        envs.append(SleepyEnv(tracker, fail_on=fail_on))
        return envs[-1]

    sampler = TaskSampler(TASKS, choose=lambda ids, k, g: ids[:k])
    driver = RolloutDriver(
        HFEngine(model, fmt),
        make_env,
        sampler,
        RolloutConfig(mode="lagged", lag=0, batch_size=4, env_workers=width),
        SamplingParams(temperature=1.0, max_turn_tokens=6, max_episode_tokens=budget),
        seed=0,
    )
    driver.publish(model.state_dict(), 0)
    start = time.perf_counter()
    try:
        episodes = driver.next_batch(trainer_version=0)
    finally:
        seconds = time.perf_counter() - start
        driver.close()
    return episodes, tracker, envs, seconds


@pytest.mark.parametrize("budget", [400, 24])  # 24: every episode is cut at the budget (mid-action, or with an
# observation that does not fit) and graded
def test_width_four_overlaps_the_environment_calls_with_the_same_episodes(policy, budget):
    one, seq, _, seq_s = play_batch(policy, 1, budget=budget)
    four, par, envs, par_s = play_batch(policy, 4, budget=budget)
    assert [dataclasses.asdict(e) for e in four] == [dataclasses.asdict(e) for e in one]
    assert seq.most == 1 and seq.threads == {threading.current_thread().name}
    # all four envs' calls in flight at once, on the pool's threads (a call that is alone in its batch, as when one
    # row ends an action in a step, stays on the caller's thread)
    assert par.most == 4 and len(par.threads - seq.threads) == 4
    assert not seq.misuse and not par.misuse and all(env.closed for env in envs)
    # every environment saw the same calls in the same order at both widths
    assert [[w for w, t in seq.events if t == n] for n in range(4)] == [
        [w for w, t in par.events if t == n] for n in range(4)
    ]
    if budget == 400:
        assert all(e.done and not e.truncated for e in one)
    else:  # both cuts happened: an action not executed (as many observations as actions), an observation not fed
        assert {len(e.observations) - len(e.actions) for e in one} == {0, 1}
        assert all(e.truncated and e.reward == 0.5 for e in one)
    assert par_s < 0.6 * seq_s, (par_s, seq_s)  # 4 sleeps side by side: about a quarter of the time


@pytest.mark.parametrize("width", [1, 4])
def test_an_environment_error_surfaces_in_the_caller_and_every_env_is_closed(policy, width):
    tracker, envs = Tracker(), []
    with pytest.raises(SandboxDown, match="task 2: the sandbox died"):
        play_batch(policy, width, fail_on=2, tracker=tracker, envs=envs)
    assert len(envs) == 4 and all(env.closed for env in envs) and not tracker.misuse
    # the driver closed the environments only after every step it had started returned
    first_close = next(i for i, (w, _) in enumerate(tracker.events) if w == "close>")
    started = [t for w, t in tracker.events[:first_close] if w == "step>"]
    assert sorted(started) == sorted(t for w, t in tracker.events[:first_close] if w == "<step")
    assert started.count(2) == 2


# ------------------------------------------------------------------------------------------- the trainer


def test_a_cell_with_env_workers_trains_and_logs_what_width_one_logs(tmp_path):
    """`rollout.env_workers: 4` is a valid cell key; the run's logged numbers equal width 1's (timings aside)."""
    from trainer.config import config_from_dict
    from trainer.logs.parquet_log import read_log
    from trainer.train import train

    cell = {
        "recipe": "full",
        "env": {
            "name": "minirepo",
            "options": {"max_depth": 1, "max_turns": 4},
            "eval_tasks": 3,
            "probe_tasks": 0,
            "train_tasks": 8,
        },
        "shaping": {"length_threshold": 12},
        "rollout": {"mode": "lagged", "lag": 1, "batch_size": 4, "max_turn_tokens": 10, "max_episode_tokens": 200},
        "run": {"updates": 1, "eval_every": 1, "checkpoint_every": 0, "seed": 1, "skip_no_signal": False},
    }
    logs = {}
    for width in (1, 4):
        cfg = config_from_dict({**cell, "rollout": {**cell["rollout"], "env_workers": width}})
        assert cfg.rollout.env_workers == width
        train(cfg, tmp_path / f"w{width}", progress=False)
        metrics = read_log(tmp_path / f"w{width}" / "metrics.parquet")[0].drop(
            columns=["rollout_s", "train_s", "wall_s"]
        )
        logs[width] = metrics, read_log(tmp_path / f"w{width}" / "episodes.parquet")[0]
    assert logs[4][0].equals(logs[1][0]) and logs[4][1].equals(logs[1][1])
    assert (logs[4][1]["split"] == "eval").sum() == 3
