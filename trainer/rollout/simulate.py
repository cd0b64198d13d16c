"""A paper cell's wall time, simulated: the episode loop's own scheduling on a virtual clock, with a stand-in engine,
stand-in containers and a stand-in update.

    python -m trainer simulate [--inputs FILE.yaml] [--gpus 8] [--update-gpus 7] [--loop both] [--updates 6]

What runs is the real code: `play_episode` (trainer/rollout/episode_loop.py) with its version gate, `end_actions`'
token budgets, the `EpisodeStream`'s admission and staleness rules; the lock-step loop is the same episodes met
in rounds (`Rounds`: one generate for every live episode, then every tool call), played batch after batch by a
producer that runs at most `max_staleness` versions ahead, as the driver's batch-level async mode does. What is
stood in, each from `SimInputs` (every field says whether it is measured, and where, or assumed):

* **the engine** (`SimulatedEngine`): `engine_gpus` data-parallel vLLM replicas, each batching continuously; one
  decode step of n sequences holding C context tokens in all takes `step_base_s + step_per_seq_s n +
  kv_s_per_token C`, new prompt tokens (not in the prefix cache: each episode is kept on one replica) cost
  `1 / prefill_tokens_per_s` each; an action's length is drawn (lognormal, capped by the turn and episode budgets).
* **the containers** (`StandinEnv`): a start latency per episode, a latency per tool call and one per grading,
  lognormal (heavy-tailed) and capped by the tool and grading deadlines; observation lengths drawn.
* **the update**: the batch's tokens at `update_tokens_per_s_per_gpu` x update GPUs x `update_scaling`, then a
  weight push of `push_s` during which the engines generate nothing.

The clock is virtual (`VirtualClock`: when nothing is ready it jumps to the next timer), so a 64-episode,
40-turn update takes seconds of CPU. Reported per loop and placement: seconds per update (after the first
`warmup_updates`), the engines' and the update's busy fractions, episode staleness, hours and GPU-hours for the
cell's updates.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import selectors
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from trainer.environments.protocol import StepInfo, StepResult
from trainer.knobs import ConfigError, Section, build_config, knob
from trainer.rollout.episode_loop import Dispatch, EpisodeStream, VersionGate, play_batch
from trainer.rollout.sampling import SamplingParams

# ------------------------------------------------------------------------------------------------ the inputs


@dataclass
class SimInputs(Section):
    """Everything the simulation assumes, one knob each. Defaults: Qwen3-4B's shape on H100/H200-class GPUs, the
    papers' R2E-Gym cell (configs/paper.yaml's batch, budgets and staleness)."""

    gpus: int = knob(8, ge=2)
    """GPUs of the cell (configs/paper.yaml: one node of 8)."""
    update_gpus: int | None = knob(None, ge=1)
    """GPUs holding the sharded update; the rest (`gpus - update_gpus`) each run a vLLM replica. None: every
    placement from `min_update_gpus` up is simulated, and the best one named."""
    min_update_gpus: int = knob(2, ge=1)
    """Fewest GPUs the update fits on: `python -m trainer plan` (4B at 32k tokens: ~47 GiB a GPU on 2 H100s)."""
    updates: int = knob(100, ge=1)
    """Updates in the cell (the papers' ~100), for the hours."""
    batch_size: int = knob(64, ge=1)
    """Episodes per update (configs/paper.yaml)."""
    max_staleness: int = knob(4, ge=0)
    max_in_flight: int | None = knob(128, ge=1)
    """Episodes in flight under the episode loop (None: `batch_size`; configs/paper.yaml's 128)."""
    max_turn_tokens: int = knob(4096, ge=1)
    max_episode_tokens: int = knob(32768, ge=2)
    prompt_tokens_median: float = knob(1500.0, gt=0)
    """Assumed: an R2E-Gym issue statement and the system prompt with its tool descriptions."""
    action_tokens_median: float = knob(300.0, gt=0)
    """Assumed: a reasoning step and one tool call; lognormal with `action_tokens_sigma`."""
    action_tokens_sigma: float = knob(1.0, ge=0)
    observation_tokens_median: float = knob(250.0, gt=0)
    """Assumed: a file view, a search result or a test log, lognormal with `observation_tokens_sigma`."""
    observation_tokens_sigma: float = knob(1.2, ge=0)
    turns_min: int = knob(8, ge=1)
    turns_max: int = knob(40, ge=1)
    """Assumed: an episode submits after a uniform number of turns in [turns_min, turns_max] (R2E-Gym's 40-step
    limit), unless a token budget ends it first."""
    success_rate: float = knob(0.3, ge=0, le=1)
    env_workers: int = knob(64, ge=1)
    """Container calls (start, tool call, grading) running at once; more wait their turn (`rollout.env_workers`,
    configs/paper.yaml's 64)."""
    start_s_median: float = knob(4.0, ge=0)
    """Assumed: a container started from an R2E-Gym image with its repository (lognormal, `start_s_sigma`).
    Measured on the shipped images (`benchmarks/bench_containers.py`, docker on a 2-core Xeon): 3.3 s, sigma 0.45."""
    start_s_sigma: float = knob(0.5, ge=0)
    tool_s_median: float = knob(1.0, ge=0)
    """Assumed: one tool call in the container (a view, a search, an edit, a test run); heavy-tailed
    (`tool_s_sigma`), capped at `tool_timeout_s`. The shipped images' small repositories give a floor: 0.22 s,
    sigma 0.55 (`benchmarks/bench_containers.py`); a real repository's test runs are longer."""
    tool_s_sigma: float = knob(1.3, ge=0)
    tool_timeout_s: float = knob(300.0, gt=0)
    grading_s_median: float = knob(30.0, ge=0)
    """Assumed: the hidden tests in a fresh container (lognormal, `grading_s_sigma`), capped at the tests' deadline
    plus the grading overhead (300 s + 120 s, configs/paper.yaml). The shipped images give a floor: 3.7 s, sigma
    0.22 (`benchmarks/bench_containers.py`); an R2E-Gym repository's hidden tests take longer."""
    grading_s_sigma: float = knob(0.8, ge=0)
    grading_timeout_s: float = knob(420.0, gt=0)
    update_tokens_per_s_per_gpu: float = knob(5460.0, gt=0)
    """Measured: the paper configuration's update of the Qwen3-4B shape, 32k tokens in 6.0 s per micro-batch on one
    H200 (docs/benchmarks.md)."""
    update_scaling: float = knob(0.9, gt=0, le=1)
    """Assumed: FSDP2's efficiency over the update GPUs (its collectives overlap compute within a node)."""
    push_s: float = knob(6.0, ge=0)
    """Assumed: one weight push (the shards cast to bf16 and gathered onto rank 0's GPU, 8 GB for 4B, broadcast to
    each server in turn, which loads them); scaled from the CPU measurement, 2.4 s for 0.99 GB over loopback."""
    step_base_s: float = knob(0.008, ge=0)
    """Assumed: one decode step of a 4B model in bf16 (8 GB of weights read at ~3 TB/s, plus the scheduler's
    overhead); with the per-sequence term, ~12k tokens/s at 256 short sequences, the order of published vLLM
    numbers for 8B on one H100 (third-party benchmarks collected at morphllm.com/vllm-benchmarks, 2026)."""
    step_per_seq_s: float = knob(0.00005, ge=0)
    kv_s_per_token: float = knob(4.4e-8, ge=0)
    """Assumed: reading one context token's KV per decode step: Qwen3-4B's 36 layers x 8 KV heads x 128 x 2 x 2
    bytes (147 KB) at ~3.35 TB/s (Qwen3.5's linear-attention layers hold less: an upper bound there)."""
    prefill_tokens_per_s: float = knob(30000.0, gt=0)
    """Assumed: a 4B model's prefill on one H100-class GPU (compute-bound, ~8 GFLOP a token)."""
    engine_batching: Literal["continuous", "calls"] = "continuous"
    """continuous: a turn joins the running batch at the next step (vLLM stepped in the trainer's process,
    trainer/rollout/continuous.py); calls: the turns pending when a replica is free go out as one generate call and
    later ones wait for it to end (a rollout server's client, `BatchedTurns`)."""
    decode_chunk: int = knob(8, ge=1)
    """Decode steps simulated at once (a turn arriving meanwhile joins after them): resolution, not an input."""
    warmup_updates: int = knob(1, ge=0)
    seed: int = 0

    @property
    def engine_gpus(self) -> int:
        if self.update_gpus is None:
            raise ValueError("SimInputs.update_gpus: a placement is needed here")
        return self.gpus - self.update_gpus

    def validate(self) -> None:
        super().validate()
        if self.update_gpus is not None and not self.update_gpus < self.gpus:
            self.refuse("update_gpus", f"{self.update_gpus} leaves no GPU of {self.gpus} for an engine")
        if self.min_update_gpus >= self.gpus:
            self.refuse("min_update_gpus", f"{self.min_update_gpus} leaves no GPU of {self.gpus} for an engine")
        if self.turns_min > self.turns_max:
            self.refuse("turns_min", f"{self.turns_min} is above turns_max {self.turns_max}")
        if self.prompt_tokens_median * 2 > self.max_episode_tokens:
            self.refuse(
                "prompt_tokens_median",
                f"{self.prompt_tokens_median:g} leaves most episodes no room in max_episode_tokens "
                f"{self.max_episode_tokens} (they would be skipped): give the cell's episode shape",
            )


def lognormal(rng: np.random.Generator, median: float, sigma: float, cap: float = math.inf) -> float:
    return float(min(cap, median * math.exp(sigma * rng.standard_normal()))) if median > 0 else 0.0


# ------------------------------------------------------------------------------------------------ the clock


class _VirtualSelector(selectors.DefaultSelector):
    """Polls without waiting; a wait the event loop asks for advances its clock instead."""

    def __init__(self, clock: VirtualClock):
        super().__init__()
        self._clock = clock

    def select(self, timeout=None):
        events = super().select(0)
        if not events:
            if timeout is None:
                raise RuntimeError("simulation deadlock: nothing is scheduled and nothing is ready")
            self._clock.now += max(0.0, timeout)
        return events


class VirtualClock(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is simulated: when no callback is ready, time jumps to the next timer."""

    def __init__(self):
        self.now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self.now


def run_virtual(coroutine):
    """Run `coroutine` on a fresh `VirtualClock` (time starts at 0)."""
    with asyncio.Runner(loop_factory=VirtualClock) as runner:
        return runner.run(coroutine)


# ------------------------------------------------------------------------------------------------ the stand-ins

STOP = 2
"""The stand-in format's stop token."""


class StandinFormat:
    """Token counts as text: an observation "n" is n tokens."""

    stop_ids = {STOP}

    def prompt_ids(self, obs: str) -> list[int]:
        return [1] * int(obs)

    def observation_ids(self, obs: str, last_token=None) -> list[int]:
        return [1] * int(obs)

    def decode_action(self, ids) -> str:
        return "action"


class StandinEnv:
    """An R2E-Gym episode's shape and waits: start, tool calls and grading cost `owed_s` of (virtual) time."""

    def __init__(self, inputs: SimInputs, rng: np.random.Generator):
        self.x, self.rng, self.owed_s = inputs, rng, 0.0

    def reset(self, task) -> str:
        x = self.x
        self.k = 0
        self.turns = int(self.rng.integers(x.turns_min, x.turns_max + 1))
        self.owed_s += lognormal(self.rng, x.start_s_median, x.start_s_sigma)
        n = max(2, round(lognormal(self.rng, x.prompt_tokens_median, 0.3)))
        return str(n)

    def step(self, action: str) -> StepResult:
        x = self.x
        self.k += 1
        self.owed_s += lognormal(self.rng, x.tool_s_median, x.tool_s_sigma, x.tool_timeout_s)
        n = max(1, round(lognormal(self.rng, x.observation_tokens_median, x.observation_tokens_sigma)))
        if self.k >= self.turns:
            self.owed_s += lognormal(self.rng, x.grading_s_median, x.grading_s_sigma, x.grading_timeout_s)
            reward = float(self.rng.random() < x.success_rate)
            return StepResult(observation=str(n), done=True, reward=reward, info=StepInfo(tool="t"))
        return StepResult(observation=str(n), done=False, reward=0.0, info=StepInfo(tool="t"))

    def truncated_reward(self) -> float:
        x = self.x
        self.owed_s += lognormal(self.rng, x.grading_s_median, x.grading_s_sigma, x.grading_timeout_s)
        return 0.0

    def close(self) -> None:
        pass


class StandinCalls:
    """The simulator's `env_calls`: at most `workers` calls at once, each run at once and then waiting out the
    latency it ran up on its environment (the time a worker thread would be blocked in it)."""

    def __init__(self, workers: int):
        self._slots = asyncio.Semaphore(workers)

    async def __call__(self, env: StandinEnv, fn: Callable, *args, **kwargs):
        async with self._slots:
            result = fn(*args, **kwargs)
            owed, env.owed_s = env.owed_s, 0.0
            if owed > 0:
                await asyncio.sleep(owed)
        return result


@dataclass
class _Request:
    tokens_left: int
    context: int
    prefill: int
    done: asyncio.Future


@dataclass
class _Replica:
    running: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    busy_s: float = 0.0


class SimulatedEngine:
    """`engine_gpus` vLLM replicas batching continuously (see the module docstring); a `TurnEngine`."""

    def __init__(self, inputs: SimInputs, rng: np.random.Generator):
        self.x, self.rng = inputs, rng
        self.replicas = [_Replica() for _ in range(inputs.engine_gpus)]
        self.home: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self.pushing = False
        self._loops = [asyncio.get_running_loop().create_task(self._serve(r)) for r in self.replicas]

    async def generate(self, prompt, *, sampling, max_tokens, seed, key=0):
        x = self.x
        if key not in self.home:
            self.home[key] = min(range(len(self.replicas)), key=lambda i: len(self.replicas[i].running))
        replica = self.replicas[self.home[key]]
        length = max(1, round(lognormal(self.rng, x.action_tokens_median, x.action_tokens_sigma)))
        n = min(length, max_tokens)
        request = _Request(
            tokens_left=n,
            context=len(prompt),
            prefill=len(prompt) - min(self.cached.get(key, 0), len(prompt)),
            done=asyncio.get_running_loop().create_future(),
        )
        replica.waiting.append(request)
        replica.wake.set()
        await request.done
        self.cached[key] = len(prompt) + n
        tokens = [1] * n
        if n == length:
            tokens[-1] = STOP
        return tokens, [-1.0] * n

    async def _serve(self, replica: _Replica) -> None:
        x = self.x
        while True:
            if not replica.running and not replica.waiting:
                replica.wake.clear()
                await replica.wake.wait()
                continue
            if x.engine_batching == "continuous" or not replica.running:
                replica.running += replica.waiting
                replica.waiting = []
            prefill = sum(r.prefill for r in replica.running)
            k = min(x.decode_chunk, min(r.tokens_left for r in replica.running))
            n = len(replica.running)
            context = sum(r.context for r in replica.running) + n * (k - 1) / 2
            dt = k * (x.step_base_s + x.step_per_seq_s * n + x.kv_s_per_token * context)
            dt += prefill / x.prefill_tokens_per_s
            for r in replica.running:
                r.prefill = 0
            await asyncio.sleep(dt)
            replica.busy_s += dt
            still = []
            for r in replica.running:
                r.tokens_left -= k
                r.context += k
                if r.tokens_left <= 0:
                    r.done.set_result(None)
                else:
                    still.append(r)
            replica.running = still

    async def load_weights(self, state_dict, version):
        await asyncio.sleep(self.x.push_s)

    @property
    def busy_s(self) -> float:
        return sum(r.busy_s for r in self.replicas)

    def close(self) -> None:
        for task in self._loops:
            task.cancel()


# ------------------------------------------------------------------------------------------------ the cell


@dataclass
class SimResult:
    loop: str
    update_gpus: int
    engine_gpus: int
    seconds_per_update: float
    engine_busy: float
    update_busy: float
    staleness_mean: float
    staleness_max: int
    cell_hours: float
    gpu_hours: float
    episodes_per_hour: float


async def simulate_cell(x: SimInputs, loop: str, updates: int) -> SimResult:
    """`updates` updates of one cell under `loop` ("turns": lock-step batches, batch-level async; "episodes": the
    episode stream) on the virtual clock."""
    rng = np.random.default_rng(x.seed)
    engine = SimulatedEngine(x, np.random.default_rng(x.seed + 1))
    sampling = SamplingParams(
        temperature=1.0, max_turn_tokens=x.max_turn_tokens, max_episode_tokens=x.max_episode_tokens
    )
    fmt = StandinFormat()
    counter = iter(range(10**9))

    def next_jobs() -> list[Dispatch]:
        i = next(counter)
        return [Dispatch(task=i, task_id=f"t{i}", seed=i)]

    def make_env() -> StandinEnv:
        return StandinEnv(x, np.random.default_rng(rng.integers(2**63)))

    clock = asyncio.get_running_loop()
    gate = VersionGate()
    standin_calls = StandinCalls(x.env_workers)
    stream = producer = None
    if loop == "episodes":
        stream = EpisodeStream(
            engine,
            standin_calls,
            fmt,
            make_env,
            next_jobs,
            sampling=sampling,
            max_in_flight=x.max_in_flight or x.batch_size,
            max_staleness=x.max_staleness,
            gate=gate,
        )
    else:
        ready: asyncio.Queue = asyncio.Queue()
        consumed = [0]
        latest = [0]

        async def produce() -> None:  # the driver's batch-level async mode, on the lock-step loop
            while True:
                while gate.version < latest[0]:
                    await gate.push(lambda: engine.load_weights({}, latest[0]), latest[0])
                if gate.version - consumed[0] > x.max_staleness:
                    await asyncio.sleep(0.1)
                    continue
                jobs = [j for _ in range(x.batch_size) for j in next_jobs()]
                envs = [make_env() for _ in jobs]
                for e in await play_batch(
                    engine, gate, standin_calls, fmt, envs, jobs, sampling=sampling, lockstep=True
                ):
                    ready.put_nowait(e)

        producer = clock.create_task(produce())

    walls, staleness, update_busy, busy_start = [], [], 0.0, None
    start = clock.time()
    for version in range(updates):
        if version == x.warmup_updates:
            busy_start = (clock.time(), engine.busy_s, update_busy)
        t0 = clock.time()
        if stream is not None:
            batch = await stream.take(x.batch_size, version)
        else:
            consumed[0] = version
            batch = []
            while len(batch) < x.batch_size:
                e = await ready.get()
                if version - e.oldest_version <= x.max_staleness:
                    batch.append(e)
        staleness += [version - e.oldest_version for e in batch]
        tokens = sum(e.length for e in batch)
        update_s = tokens / (x.update_tokens_per_s_per_gpu * x.update_gpus * x.update_scaling)
        await asyncio.sleep(update_s)
        update_busy += update_s
        if stream is not None:
            await stream.publish({}, version + 1)
        else:
            latest[0] = version + 1
        walls.append(clock.time() - t0)
    end = clock.time()
    if stream is not None:
        await stream.close()
    if producer is not None:
        producer.cancel()
    engine.close()
    t_busy, e_busy, u_busy = busy_start if busy_start is not None else (start, 0.0, 0.0)
    steady = walls[x.warmup_updates :] or walls
    per_update = float(np.mean(steady))
    hours = per_update * x.updates / 3600
    return SimResult(
        loop=loop,
        update_gpus=x.update_gpus,
        engine_gpus=x.engine_gpus,
        seconds_per_update=per_update,
        engine_busy=(engine.busy_s - e_busy) / ((end - t_busy) * x.engine_gpus),
        update_busy=(update_busy - u_busy) / (end - t_busy),
        staleness_mean=float(np.mean(staleness)),
        staleness_max=int(max(staleness)),
        cell_hours=hours,
        gpu_hours=hours * x.gpus,
        episodes_per_hour=x.batch_size * 3600 / per_update,
    )


def simulate(x: SimInputs, loop: str, updates: int) -> SimResult:
    return run_virtual(simulate_cell(x, loop, updates))


def placements(x: SimInputs, loops: list[str], updates: int) -> list[SimResult]:
    """Every split of the cell's GPUs between the update (at least `min_update_gpus`) and engine replicas."""
    out = []
    for u in range(x.min_update_gpus, x.gpus):
        for loop in loops:
            out.append(simulate(dataclasses.replace(x, update_gpus=u), loop, updates))
    return out


def best(results: list[SimResult], loop: str) -> SimResult:
    """The placement with the fewest seconds per update for `loop` (ties: more update GPUs)."""
    return min((r for r in results if r.loop == loop), key=lambda r: (r.seconds_per_update, -r.update_gpus))


# ------------------------------------------------------------------------------------------------ the command


def load_inputs(path: Path | None, overrides: dict) -> SimInputs:
    raw = {}
    if path is not None:
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping of SimInputs fields")
    try:
        return build_config(SimInputs, {**raw, **{k: v for k, v in overrides.items() if v is not None}}, "")
    except ConfigError as err:
        raise ConfigError(f"{path or 'simulate'}: {err}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inputs", type=Path, help="a YAML mapping of SimInputs fields (the rest keep their defaults)")
    p.add_argument("--gpus", type=int)
    p.add_argument("--update-gpus", type=int, help="one placement only (default: every placement)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--loop", choices=["turns", "episodes", "both"], default="both")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="SimInputs fields (YAML values)")
    p.add_argument("--updates", type=int, default=6, help="updates simulated (the first is warm-up)")
    p.add_argument("--json", type=Path, help="write the results here too")


def run(args: argparse.Namespace) -> int:
    overrides = {"gpus": args.gpus, "batch_size": args.batch_size, "update_gpus": args.update_gpus}
    for pair in args.set:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        overrides[key] = yaml.safe_load(value)
    x = load_inputs(args.inputs, overrides)
    loops = ["turns", "episodes"] if args.loop == "both" else [args.loop]
    if x.update_gpus is not None:
        results = [simulate(x, loop, args.updates) for loop in loops]
    else:
        results = placements(x, loops, args.updates)
    header = f"{'loop':9} {'update':>6} {'engines':>7} {'s/update':>9} {'engines busy':>12} {'update busy':>11} "
    print(header + f"{'staleness':>9} {'cell h':>7} {'GPU h':>7}")
    for r in results:
        print(
            f"{r.loop:9} {r.update_gpus:>6} {r.engine_gpus:>7} {r.seconds_per_update:>9.0f} {r.engine_busy:>12.0%} "
            f"{r.update_busy:>11.0%} {r.staleness_mean:>5.1f}/{r.staleness_max:<3} {r.cell_hours:>7.1f} "
            f"{r.gpu_hours:>7.0f}"
        )
    for loop in loops:
        b = best(results, loop)
        print(
            f"best for {loop}: {b.update_gpus} update GPUs + {b.engine_gpus} engines, {b.seconds_per_update:.0f} s per "
            f"update, {b.cell_hours:.1f} h and {b.gpu_hours:.0f} GPU-hours for {x.updates} updates"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"inputs": dataclasses.asdict(x), "results": [dataclasses.asdict(r) for r in results]}, indent=1)
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer simulate", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
