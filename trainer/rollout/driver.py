"""Single-stream rollouts: which tasks to play, by which policy version, delivered in what order.

Three modes, one interface (`next_batch(trainer_version)` and `publish(weights, version)`):

* `sync`: every batch is played by the trainer's current policy (classic on-policy; staleness 0).
* `lagged`: every batch is played by the policy exactly `lag` updates old. This is what an asynchronous pipeline
  with a fixed one-batch-ahead rollout worker produces, made deterministic: same seed, same run, bit for bit.
* `async`: a rollout thread plays batches continuously with the newest published weights while the trainer
  trains; the trainer takes finished episodes in arrival order. Episodes older than `max_staleness` versions are
  dropped (and counted) and the producer never runs more than `max_staleness` versions ahead of what was consumed.

A batch's environments are reset, stepped, graded and closed in the driver's `EnvPool` (`env_workers` wide; the
engine's `play` takes it), so environments that wait on sandboxes wait side by side; the episodes are the same
for every width.

Two loops (`rollout.loop`): `turns`, the engine's own `play` (lock-step turns); `episodes`, each episode its own
loop of turns and tool calls (trainer/rollout/episode_loop.py) on an event loop in a thread of the driver's, the
environment calls on `env_workers` threads. Under sync and lagged it plays the same episodes as `turns` (on an
engine whose answer depends only on weights, prompt and seed); under async the episodes flow across updates
(`EpisodeStream`, at most `max_in_flight` at once) and weights are pushed between turns, not between batches.

Tasks: one rollout per task (single stream), or `group_size` rollouts per task for the group estimators, drawn
from the training pool by the estimator's `sample_tasks` (SPO's prioritised weights) or uniformly. When a task is
handed out, the estimator's `dispatch_baseline` is snapshotted onto its episodes (`Episode.baseline`: SPO++'s
stream-aligned baseline). The driver knows nothing else of the estimator.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable

import torch

from trainer.rollout.config import RolloutConfig
from trainer.rollout.env_pool import EnvPool, close_envs
from trainer.rollout.episode import Episode
from trainer.rollout.episode_loop import BatchedTurns, Dispatch, EnvCalls, EpisodeStream, VersionGate, play_batch
from trainer.rollout.vllm_engine import request_seeds


class TaskSampler:
    """Draws the tasks of one batch; deterministic in its generator.

    `choose(ids, k, generator)` picks k task ids (SPO's prioritised sampling); None draws uniformly, without
    replacement unless k exceeds the pool."""

    def __init__(
        self, tasks: list, choose: Callable[[list[str], int, torch.Generator], list[str]] | None = None, seed: int = 0
    ):
        self.tasks = list(tasks)
        self.by_id = {t.task_id: t for t in self.tasks}
        if len(self.by_id) != len(self.tasks):
            raise ValueError("task ids in the training pool are not unique")
        self.choose = choose
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, k: int) -> list:
        ids = list(self.by_id)
        if self.choose is not None:
            chosen = self.choose(ids, k, self.generator)
        else:
            replace = k > len(ids)
            idx = (
                torch.randint(len(ids), (k,), generator=self.generator)
                if replace
                else torch.randperm(len(ids), generator=self.generator)[:k]
            )
            chosen = [ids[i] for i in idx.tolist()]
        return [self.by_id[i] for i in chosen]

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class RolloutDriver:
    """Plays batches of episodes with `engine` on environments made by `make_env`."""

    def __init__(
        self,
        engine,
        make_env: Callable,
        sampler: TaskSampler,
        cfg: RolloutConfig,
        sampling,
        dispatch_baseline: Callable[[str], float | None] | None = None,
        seed: int = 0,
        group_size: int = 1,
    ):
        """`cfg`: the cell's `rollout` section (mode, lag, staleness, batch size, environment workers, weight
        precision); `group_size` rollouts per task (`rl.group_size`). `dispatch_baseline(task_id)` is read once per
        task when it is handed out and stored on its episodes."""
        self.group_size = group_size
        self.engine, self.make_env, self.sampler, self.cfg, self.sampling = engine, make_env, sampler, cfg, sampling
        self.dispatch_baseline = dispatch_baseline
        self.generator = torch.Generator().manual_seed(seed + 7919)
        self.snapshots: deque[tuple[int, dict]] = deque()
        self.dropped_stale = 0
        self.skipped_episodes = 0
        """Episodes left out of their batch: a prompt that does not fit `max_episode_tokens`
        (`skip_if_prompt_too_long`), or a failure outside the policy (`mark_failed`)."""
        self.dispatched_episodes = 0
        self.failures: list[str] = []
        """Why each failed episode failed (a container that did not start, a grading that failed)."""
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._latest: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._consumed_version = 0
        self.pool = EnvPool(cfg.env_workers)
        self._episodes_loop: asyncio.AbstractEventLoop | None = None
        self._stream: EpisodeStream | None = None
        self._pending_jobs: deque[Dispatch] = deque()
        if cfg.loop == "episodes":
            self._start_episode_loop()

    # -- the episode-level loop ---------------------------------------------------------------------------------
    def _start_episode_loop(self) -> None:
        """The event loop the episodes run on (a daemon thread), the engine's turn interface, the env threads."""
        self.turns = self.engine.turn_engine() if hasattr(self.engine, "turn_engine") else BatchedTurns(self.engine)
        self.env_calls = EnvCalls(self.cfg.env_workers)
        self._episodes_loop = asyncio.new_event_loop()
        threading.Thread(target=self._episodes_loop.run_forever, name="episodes", daemon=True).start()
        self.gate = VersionGate()  # its asyncio primitives bind to the episodes' loop at their first use

    def _on_loop(self, coroutine):
        """Run `coroutine` on the episodes' event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._episodes_loop).result()

    def _jobs(self, tasks, ids, groups, baselines) -> list[Dispatch]:
        seeds = request_seeds(len(tasks), self.generator)
        return [Dispatch(t, i, s, g, b) for t, i, s, g, b in zip(tasks, ids, seeds, groups, baselines)]

    async def _play_episodes(self, version: int, weights: dict | None) -> list[Episode]:
        if weights is not None:
            await self.gate.push(functools.partial(self.turns.load_weights, weights, version), version)
        jobs = self._jobs(*self._dispatch())
        envs = [self.make_env() for _ in jobs]
        try:
            return await play_batch(
                self.turns, self.gate, self.env_calls, self.engine.fmt, envs, jobs, sampling=self.sampling
            )
        finally:
            await asyncio.gather(*(self.env_calls(env, env.close) for env in envs))

    def _next_jobs(self) -> list[Dispatch]:
        """One group of episodes for the stream (a whole task's group), from batches dispatched as `_play` would."""
        if not self._pending_jobs:
            self._pending_jobs.extend(self._jobs(*self._dispatch()))
        return [self._pending_jobs.popleft() for _ in range(self.group_size)]

    async def _stream_take(self, trainer_version: int) -> list[Episode]:
        if self._stream is None:
            self._stream = EpisodeStream(
                self.turns,
                self.env_calls,
                self.engine.fmt,
                self.make_env,
                self._next_jobs,
                sampling=self.sampling,
                max_in_flight=self.cfg.max_in_flight or self.cfg.batch_size,
                max_staleness=self.cfg.max_staleness,
                gate=self.gate,
            )
            if self._latest is not None:  # the weights published before the first batch
                version, weights = self._latest
                await self._stream.publish(weights, version)
        batch = await self._stream.take(self.cfg.batch_size, trainer_version)
        stream = self._stream
        self.dropped_stale += len(stream.stale)
        self._account(batch + stream.left_out + stream.stale)
        stream.stale, stream.left_out = [], []
        return batch

    # -- weights -------------------------------------------------------------------------------------------
    def publish(self, state_dict: dict, version: int, *, owned: bool = False) -> None:
        """Make the trainer's weights after `version` updates available to rollouts, rounded to bf16 under
        `weight_dtype: bfloat16`; copied unless `owned` (tensors the caller made for this and never touches again,
        as the trainer's gathered weights: a second copy of a 4B model on its GPU would cost 8 GB)."""
        rounded = self.cfg.weight_dtype == "bfloat16"

        def handed(v: torch.Tensor) -> torch.Tensor:
            if rounded and v.is_floating_point() and v.dtype != torch.bfloat16:
                return v.detach().to(torch.bfloat16).to(v.dtype)
            return v.detach() if owned else v.detach().clone()

        weights = {k: handed(v) for k, v in state_dict.items()}
        if self.cfg.mode == "lagged":
            self.snapshots.append((version, weights))
            while len(self.snapshots) > self.cfg.lag + 1:
                self.snapshots.popleft()
        else:
            with self._lock:
                self._latest = (version, weights)
            if self._stream is not None:  # pushed between turns, as soon as the turns in flight allow
                self._on_loop(self._stream.publish(weights, version))

    # -- one batch -------------------------------------------------------------------------------------------
    def _dispatch(self) -> tuple[list, list[str], list[str | None], list[float | None]]:
        n_tasks = self.cfg.batch_size // self.group_size
        tasks = self.sampler.sample(n_tasks)
        out_tasks, ids, groups, baselines = [], [], [], []
        for j, task in enumerate(tasks):
            base = self.dispatch_baseline(task.task_id) if self.dispatch_baseline is not None else None
            for _ in range(self.group_size):
                out_tasks.append(task)
                ids.append(task.task_id)
                groups.append(f"{task.task_id}#{j}" if self.group_size > 1 else None)
                baselines.append(base)
        return out_tasks, ids, groups, baselines

    def _play(self, version: int, weights: dict | None) -> list[Episode]:
        if self._episodes_loop is not None:
            return self._account(self._on_loop(self._play_episodes(version, weights)))
        if weights is not None:
            self.engine.load_state_dict(weights, version)
        tasks, ids, groups, baselines = self._dispatch()
        envs = [self.make_env() for _ in tasks]
        try:
            episodes = self.engine.play(
                envs,
                tasks,
                sampling=self.sampling,
                policy_version=version,
                generator=self.generator,
                task_ids=ids,
                baselines=baselines,
                pool=self.pool,
            )
        finally:
            close_envs(envs, self.pool)
        for e, g in zip(episodes, groups):
            e.group_id = g
        return self._account(episodes)

    def _account(self, episodes: list[Episode]) -> list[Episode]:
        """Count what was dispatched, say which episodes were left out and why, stop past `max_failed_share`; the
        episodes that go into a batch."""
        skipped = [e for e in episodes if "skipped" in e.extra]
        for e in skipped:
            print(
                f"[rollout] task {e.task_id!r} left out of the batch: {e.extra['skipped']}", file=sys.stderr, flush=True
            )
        self.skipped_episodes += len(skipped)
        self.dispatched_episodes += len(episodes)
        self.failures += [e.extra["failed"] for e in episodes if "failed" in e.extra]
        self._check_failures()
        return [e for e in episodes if "skipped" not in e.extra]

    def _check_failures(self) -> None:
        """Stop the cell once failures outside the policy pass `rollout.max_failed_share` of what was dispatched."""
        share = len(self.failures) / max(1, self.dispatched_episodes)
        if self.failures and share > self.cfg.max_failed_share:
            first = "; ".join(dict.fromkeys(self.failures[:3]))
            raise RuntimeError(
                f"rollout: {len(self.failures)} of {self.dispatched_episodes} episodes failed for reasons outside "
                f"the policy ({share:.0%} > rollout.max_failed_share {self.cfg.max_failed_share:.0%}); first: {first}"
            )

    def next_batch(self, trainer_version: int) -> list[Episode]:
        """The episodes for the trainer's next update (the trainer holds `trainer_version` updates)."""
        for _ in range(self.MAX_EMPTY_BATCHES):
            episodes = self._next_batch(trainer_version)
            if episodes:
                return episodes
        raise ValueError(
            f"{self.MAX_EMPTY_BATCHES} batches in a row had every task left out (their prompts do "
            "not fit rollout.max_episode_tokens): raise it, or leave those tasks out of the pool"
        )

    MAX_EMPTY_BATCHES = 10

    def _next_batch(self, trainer_version: int) -> list[Episode]:
        if self.cfg.mode == "sync":
            with self._lock:
                version, weights = self._latest
            return self._play(version, weights)
        if self.cfg.mode == "lagged":
            wanted = max(0, trainer_version - self.cfg.lag)
            for version, weights in self.snapshots:
                if version == wanted:
                    return self._play(version, weights)
            raise RuntimeError(
                f"lagged rollouts need the policy of version {wanted}, which was not published "
                f"(have {[v for v, _ in self.snapshots]})"
            )
        return self._next_async(trainer_version)

    # -- asynchronous mode -----------------------------------------------------------------------------------
    def _producer(self) -> None:
        """The rollout thread; an error in it (a dead rollout server, a failed environment) is kept for the
        trainer's thread, which raises it instead of waiting for episodes that will never come."""
        try:
            self._produce()
        except BaseException as err:
            self._error = err

    def _produce(self) -> None:
        last_version = None
        while not self._stop.is_set():
            with self._lock:
                version, weights = self._latest
            if version - self._consumed_version > self.cfg.max_staleness:
                self._stop.wait(0.01)
                continue
            episodes = self._play(version, weights if version != last_version else None)
            last_version = version
            for e in episodes:
                while not self._stop.is_set():
                    try:
                        self._queue.put(e, timeout=0.1)
                        break
                    except queue.Full:
                        continue

    def _next_async(self, trainer_version: int) -> list[Episode]:
        if self._episodes_loop is not None:
            return self._on_loop(self._stream_take(trainer_version))
        self._consumed_version = trainer_version
        if self._thread is None:
            self._queue = queue.Queue(maxsize=2 * self.cfg.batch_size)
            self._thread = threading.Thread(target=self._producer, name="rollouts", daemon=True)
            self._thread.start()
        batch: list[Episode] = []
        while len(batch) < self.cfg.batch_size:
            try:
                e = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError(
                        f"the rollout thread failed: {type(self._error).__name__}: {self._error}"
                    ) from self._error
                continue
            if trainer_version - e.oldest_version > self.cfg.max_staleness:
                self.dropped_stale += 1
                continue
            batch.append(e)
        return batch

    def close(self) -> None:
        if self._episodes_loop is not None:
            if self._stream is not None:
                self._on_loop(self._stream.close())
            self._episodes_loop.call_soon_threadsafe(self._episodes_loop.stop)
            self.env_calls.close()
            if hasattr(self.turns, "close"):
                self.turns.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            stuck, self._thread = self._thread.is_alive(), None
            if stuck:  # still inside an environment call: its pool stays open
                return
        self.pool.close()

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "generator": self.generator.get_state(),
            "sampler": self.sampler.state_dict(),
            "snapshots": [(v, copy.copy(w)) for v, w in self.snapshots],
            "latest": self._latest,
            "dropped_stale": self.dropped_stale,
        }

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.sampler.load_state_dict(state["sampler"])
        self.snapshots = deque(state["snapshots"])
        self._latest = state["latest"]
        self.dropped_stale = state["dropped_stale"]
