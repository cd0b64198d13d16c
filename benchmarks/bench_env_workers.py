"""Parallel sandboxes: one rollout batch on the shipped swe tasks at `rollout.env_workers` 1 and N, side by side.

    python benchmarks/bench_env_workers.py [--backends local docker] [--widths 1 6] [--batch 6] [--repeats 3]

The policy is scripted (the oracle: the gold patch as `file_editor` edits, the visible tests, `finish`), so the
batch's time is the environments' time, and that is what the pool shortens. Everything else is the trainer's own
code path: a `RolloutDriver` (`rollout.env_workers`) makes the batch's
`SWEEnv`s and hands them with its `EnvPool` to the vLLM engine's `play`, whose `LLM` is `ScriptedLLM` below: every
"generate call" returns each live episode's next oracle action, and the engine resets the sandboxes, runs each
round's actions (`end_actions`; `finish` runs the hidden tests), and the driver closes them, all through the
pool, exactly as in training (the HF engine's rounds go through the same `end_actions`). Each repeat plays the
batch at every width in turn (the same tasks each time); the table gives the median wall time per width, the
speed-up over width 1, and whether the episodes (tokens, turns, rewards) equal width 1's. The docker backend
needs a running engine and the shipped images (`bash .ci/docker-setup.sh` as root); without them it is skipped
with the reason.

Measured numbers (a 2-core machine, local and docker): docs/benchmarks.md, "Parallel sandboxes".
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time
from types import SimpleNamespace

import torch

from trainer.environments.swe import SandboxError, SWEConfig, SWEEnv, SWETasks, oracle_actions
from trainer.rollout.config import RolloutConfig
from trainer.rollout.driver import RolloutDriver, TaskSampler
from trainer.rollout.sampling import SamplingParams
from trainer.rollout.vllm_engine import VLLMEngine

BOS, STOP = 0, 1


class TextFormat:
    """A chat format whose tokens are whole texts: token k >= 2 is the k-th distinct text seen (an observation or an
    action), an action is [its text, STOP]. Cheap, so the batch's time is the environments'."""

    def __init__(self):
        self.stop_ids, self.texts, self.ids = {STOP}, ["<bos>", "<stop>"], {}

    def encode(self, text: str) -> int:
        if text not in self.ids:
            self.ids[text] = len(self.texts)
            self.texts.append(text)
        return self.ids[text]

    def prompt_ids(self, first_observation: str) -> list[int]:
        return [BOS, self.encode(first_observation)]

    def observation_ids(self, observation: str, last_token: int | None = None) -> list[int]:
        return [self.encode(observation)]

    def decode_action(self, ids) -> str:
        return self.texts[ids[0]]


class ScriptedLLM:
    """`vllm.LLM.generate`'s signature, answering each episode's next oracle action (the task found by its issue
    in the first observation, the turn by the stop tokens so far). `collective_rpc` / `reset_prefix_cache` accept
    the driver's weight push and do nothing (a scripted policy has no weights)."""

    def __init__(self, fmt: TextFormat, tasks):
        self.fmt, self.tasks = fmt, tasks

    def _action(self, prompt: list[int]) -> int:
        first = self.fmt.texts[prompt[1]]
        task = next(t for t in self.tasks if t.issue in first)
        repo_dir = re.search(r"Repository root: (\S+)", first).group(1)
        return self.fmt.encode(oracle_actions(task, repo_dir)[prompt.count(STOP)])

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
        outputs = []
        for p in prompts:
            prompt = list(p["prompt_token_ids"])
            tokens = [self._action(prompt), STOP]
            outputs.append(
                SimpleNamespace(
                    prompt_token_ids=prompt,
                    outputs=[SimpleNamespace(token_ids=tokens, logprobs=[{t: 0.0} for t in tokens])],
                )
            )
        return outputs

    def collective_rpc(self, method, args=(), kwargs=None):
        return [[]]

    def reset_prefix_cache(self):
        return True


def docker_problem(tasks) -> str | None:
    """Why the docker backend cannot run here (no engine, images not built), or None."""
    from trainer.environments.swe.containers import docker_client

    try:
        client = docker_client(timeout=30)
    except SandboxError as exc:
        return str(exc)
    missing = []
    for task in tasks:
        try:
            client.images.get(task.docker_image)
        except Exception:
            missing.append(task.docker_image)
    return f"images not built: {', '.join(missing)}" if missing else None


def play_batch(backend: str, width: int, batch: int, seed: int):
    """One driver batch of `batch` oracle episodes at pool width `width`: (seconds, episodes)."""
    tasks = SWETasks().all
    fmt = TextFormat()
    engine = VLLMEngine.from_llm(ScriptedLLM(fmt, tasks), fmt, sampling_params_cls=lambda **kw: kw)
    driver = RolloutDriver(
        engine,
        lambda: SWEEnv(SWEConfig(backend=backend)),
        TaskSampler(tasks, seed=seed),
        RolloutConfig(mode="sync", batch_size=batch, env_workers=width),
        SamplingParams(temperature=0, max_turn_tokens=2, max_episode_tokens=4096),
    )
    driver.publish({"scripted": torch.zeros(1)}, 0)  # the driver pushes weights before a batch; ScriptedLLM takes them
    try:
        start = time.perf_counter()
        episodes = driver.next_batch(trainer_version=0)
        return time.perf_counter() - start, episodes
    finally:
        driver.close()


def fingerprint(episodes) -> list:
    """What must not depend on the width: per episode its task, actions, observations, turns, masks and reward (the
    token ids are per-run text indices here, so the texts stand in for them), with what differs between any two
    runs masked: the sandbox's path (local backend: a fresh temporary directory) and pytest's timings."""
    out = []
    for e in episodes:
        root = re.search(r"Repository root: (\S+)", e.observations[0]).group(1)

        def mask(text: str) -> str:
            return re.sub(r"\d+\.\d+s", "<t>s", text.replace(root, "<repo>"))  # noqa: B023

        out.append(
            (
                e.task_id,
                [mask(a) for a in e.actions],
                [mask(o) for o in e.observations],
                [(t.start, t.end, mask(t.state), t.invalid_action, t.exec_error) for t in e.turns],
                e.reward,
                e.done,
                e.truncated,
                e.loss_mask,
                e.turn_index,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["local", "docker"], choices=["local", "docker"])
    parser.add_argument("--widths", nargs="+", type=int, default=[1, 6], help="pool widths; the first is the base")
    parser.add_argument("--batch", type=int, default=6, help="episodes per batch (the 6 shipped tasks; more repeat)")
    parser.add_argument("--repeats", type=int, default=3, help="batches per width (median reported)")
    parser.add_argument("--seed", type=int, default=0, help="task sampler seed")
    args = parser.parse_args()
    tasks = SWETasks().all
    print(
        f"# env_workers on the shipped swe tasks: batch {args.batch}, oracle policy, {args.repeats} repeats; "
        f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}"
    )
    print(
        f"{'backend':<8} {'width':>5} {'median s':>9} {'min s':>7} {'max s':>7} {'speed-up':>9} {'success':>8} "
        f"{'same episodes':>13}"
    )
    for backend in args.backends:
        if backend == "docker":
            problem = docker_problem(tasks)
            if problem:
                print(
                    f"{backend:<8} skipped: {problem} (`bash .ci/docker-setup.sh` as root starts Docker and "
                    "builds the images)"
                )
                continue
        times = {w: [] for w in args.widths}
        reference, same, success = None, {w: True for w in args.widths}, {}
        for _ in range(args.repeats):
            for width in args.widths:
                seconds, episodes = play_batch(backend, width, args.batch, args.seed)
                times[width].append(seconds)
                success[width] = sum(e.reward > 0.5 for e in episodes) / len(episodes)
                reference = reference or fingerprint(episodes)
                same[width] &= fingerprint(episodes) == reference
        base = statistics.median(times[args.widths[0]])
        for width in args.widths:
            median = statistics.median(times[width])
            print(
                f"{backend:<8} {width:>5} {median:>9.2f} {min(times[width]):>7.2f} {max(times[width]):>7.2f} "
                f"{base / median:>8.2f}x {success[width]:>8.0%} {'yes' if same[width] else 'NO':>13}"
            )


if __name__ == "__main__":
    main()
