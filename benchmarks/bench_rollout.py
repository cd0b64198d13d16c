"""Rollout throughput: HFEngine (batched, KV cache kept across turns) vs the simple alternative, greedy, equal outputs.

    python benchmarks/bench_rollout.py [--episodes 32] [--presets minicpm-tiny qwen-tiny] [--threads 1]
                                       [--eot-scale 4] [--mask-finished] [--env fake|minirepo] [--json out.json]

The simple alternative is what one writes first: for every turn, `model.generate` on the whole conversation so
far, re-encoded from scratch (generate keeps a cache only *within* the turn). Two versions, both honest:
  * naive_seq:   one episode at a time (no padding at all);
  * naive_batch: all unfinished episodes of a turn together, left-padded, one `generate` call per turn.
Greedy decoding everywhere; every episode's token sequence must equal HFEngine's (checked, and reported per
alternative: left padding can flip a near-tie in a random model, so naive_batch equality is reported, and asserted
only for naive_seq, which sees exactly the engine's unpadded inputs).

Episodes are embedded-default-like: the tiny models of trainer/policy/tiny.py (random init), a byte-level BPE
tokenizer trained on the environment's text, and a fake environment with 6-10 turns of 20-40-token observations
(seeded words), max_turn_tokens 24. A random model never writes <eot>, so every action runs to the cap and
all episodes stay in lockstep: the best case for naive_batch. `--eot-scale 4` makes actions end at varied
lengths (means of 16-21 tokens) as a warm-started policy's do, which is closer to the embedded default.
With `--env minirepo` the episodes are MiniRepo tasks instead (a random policy never submits, so they run to the
environment's 24-turn limit). Throughput counts sampled (policy) tokens per second
of wall time; each method is timed on the same episodes, single-threaded by default, best of `--repeats`.

Measured (one shared CPU thread, torch 2.13, 32 episodes; engine tok/s, then speed-up vs naive_seq / naive_batch;
greedy outputs equal in every case):
    fake env, random model (24-token actions, ~560 tokens)   3.6-3.7k tok/s   8-10x / 2.8x
    fake env, --eot-scale 4 (actions of 16-21 tokens)        2.4-3.1k tok/s   6x    / 2.6-3.0x
    --env minirepo (24 turns, ~1.2k tokens)                  2.7-3.1k tok/s   7-10x / 6-8x
The batched alternative is close on short episodes because its decode steps cost what the engine's do; what it
loses is the re-encoding of the whole history every turn, which grows with the number of turns.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import torch

from trainer.environments.protocol import StepInfo, StepResult
from trainer.policy.chat_format import TinyFormat, build_tokenizer
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rollout.hf_engine import HFEngine, SamplingParams

WORDS = (
    "file",
    "line",
    "open",
    "edit",
    "test",
    "pass",
    "fail",
    "search",
    "error",
    "return",
    "value",
    "def",
    "expected",
    "got",
    "module",
    "call",
    "result",
    "ok",
    "the",
    "a",
    "in",
    "of",
    "to",
    "=",
    "+",
    ":",
)


class ChainEnv:
    """A fake tool environment: `turns` steps (6-10 by task), each observation 20-40 tokens of seeded words."""

    max_turns = 10

    def reset(self, task: int) -> str:
        self.rng = random.Random(task)
        self.turns, self.k = 6 + task % 5, 0
        return "issue : " + self._words(30)

    def _words(self, n: int) -> str:
        return " ".join(
            self.rng.choice(WORDS) + (str(self.rng.randrange(100)) if self.rng.random() < 0.3 else "") for _ in range(n)
        )

    def step(self, action: str) -> StepResult:
        self.k += 1
        done = self.k >= self.turns
        return StepResult(
            observation=self._words(self.rng.randint(13, 27)),
            done=done,
            reward=float(done and len(action) % 2 == 0),
            info=StepInfo(tool="fake"),
        )

    def close(self) -> None:
        pass


def make_env(kind: str):
    if kind == "fake":
        return ChainEnv, list(range(1000))
    from trainer.environments.minirepo import MiniRepoEnv, MiniRepoTasks

    return MiniRepoEnv, list(MiniRepoTasks().tasks("train", 64))


def sample_texts(kind: str) -> list[str]:
    if kind == "fake":
        env = ChainEnv()
        texts = []
        for task in range(50):
            texts.append(env.reset(task))
            texts += [env.step("x").observation for _ in range(env.turns)]
        return texts
    from trainer.environments.minirepo import sample_texts as minirepo_texts

    return list(minirepo_texts())


def naive_episode(model, fmt, env, task, sp: SamplingParams) -> list[int]:
    """One episode, per turn `generate` on the whole re-encoded history (batch of 1, greedy)."""
    tokens = fmt.prompt_ids(env.reset(task))
    stop = sorted(fmt.stop_ids)
    while True:
        budget = min(sp.max_turn_tokens, sp.max_episode_tokens - len(tokens))
        out = model.generate(
            torch.tensor([tokens]),
            attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
            max_new_tokens=budget,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=fmt.pad_id,
        )
        action = out[0, len(tokens) :].tolist()
        tokens = tokens + action
        if action[-1] not in fmt.stop_ids and len(action) < sp.max_turn_tokens:
            return tokens  # cut by the episode budget
        result = env.step(fmt.decode_action(action))
        if result.done:
            return tokens
        obs = fmt.observation_ids(result.observation, last_token=action[-1])
        if len(tokens) + len(obs) + 1 > sp.max_episode_tokens:
            return tokens
        tokens = tokens + obs


def naive_batch(model, fmt, envs, tasks, sp: SamplingParams) -> list[list[int]]:
    """All episodes turn by turn: one left-padded `generate` per turn over every unfinished episode's history."""
    seqs = [fmt.prompt_ids(env.reset(task)) for env, task in zip(envs, tasks)]
    live = list(range(len(envs)))
    stop = sorted(fmt.stop_ids)
    while live:
        width = max(len(seqs[i]) for i in live)
        ids = torch.tensor([[fmt.pad_id] * (width - len(seqs[i])) + seqs[i] for i in live])
        mask = torch.tensor([[0] * (width - len(seqs[i])) + [1] * len(seqs[i]) for i in live])
        budget = min(sp.max_turn_tokens, sp.max_episode_tokens - min(len(seqs[i]) for i in live))
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=budget, do_sample=False, eos_token_id=stop, pad_token_id=fmt.pad_id
        )[:, width:].tolist()
        still = []
        for i, new in zip(live, out):
            action = []
            for t in new:  # generate pads finished rows; cut at the first stop and at this row's own budgets
                action.append(t)
                if (
                    t in fmt.stop_ids
                    or len(action) >= sp.max_turn_tokens
                    or len(seqs[i]) + len(action) >= sp.max_episode_tokens
                ):
                    break
            seqs[i] = seqs[i] + action
            if action[-1] not in fmt.stop_ids and len(action) < sp.max_turn_tokens:
                continue
            result = envs[i].step(fmt.decode_action(action))
            if result.done:
                continue
            obs = fmt.observation_ids(result.observation, last_token=action[-1])
            if len(seqs[i]) + len(obs) + 1 > sp.max_episode_tokens:
                continue
            seqs[i] = seqs[i] + obs
            still.append(i)
        live = still
    return seqs


def bench_preset(preset: str, args, fmt, env_cls, tasks) -> dict:
    model = build_tiny_model(TinyModelSpec(preset, vocab_size=fmt.vocab_size), seed=0)
    model.eval()
    if args.eot_scale != 1.0:  # untie the output layer, then make <eot> the argmax more often
        with torch.no_grad():
            model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
            model.lm_head.weight[fmt.eot_id] *= args.eot_scale
    sp = SamplingParams(
        temperature=0.0, max_turn_tokens=args.max_turn_tokens, max_episode_tokens=args.max_episode_tokens
    )
    tasks = tasks[: args.episodes]
    engine = HFEngine(model, fmt, free_finished=not args.mask_finished)
    engine.play([env_cls() for _ in tasks[:2]], tasks[:2], sampling=sp)  # warm-up
    n_seq = min(args.naive_seq_episodes, len(tasks))
    times = {"engine": [], "naive_seq": [], "naive_batch": []}
    for _repeat in range(args.repeats):  # interleaved; the minimum is the least disturbed by other processes
        t0 = time.perf_counter()
        episodes = engine.play([env_cls() for _ in tasks], tasks, sampling=sp)
        times["engine"].append(time.perf_counter() - t0)
        with torch.inference_mode():
            t0 = time.perf_counter()
            seq = [naive_episode(model, fmt, env_cls(), task, sp) for task in tasks[:n_seq]]
            times["naive_seq"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            batch = naive_batch(model, fmt, [env_cls() for _ in tasks], tasks, sp)
            times["naive_batch"].append(time.perf_counter() - t0)
    generated = sum(e.n_generated for e in episodes)
    seq_generated = sum(e.n_generated for e in episodes[:n_seq])
    mismatches = [i for i in range(n_seq) if seq[i] != episodes[i].tokens]
    best = {k: min(v) for k, v in times.items()}
    result = {
        "episodes": len(tasks),
        "generated_tokens": generated,
        "total_tokens": sum(e.length for e in episodes),
        "turns_mean": sum(len(e.turns) for e in episodes) / len(episodes),
        "action_len_mean": generated / sum(len(e.turns) for e in episodes),
        "length_max": max(e.length for e in episodes),
        "times_s": times,
        "engine_tok_s": generated / best["engine"],
        "engine_stats": engine.last_stats,
        "naive_seq_episodes": n_seq,
        "naive_seq_tok_s": seq_generated / best["naive_seq"],
        "naive_seq_mismatches": len(mismatches),
        "naive_batch_tok_s": generated / best["naive_batch"],
        "naive_batch_mismatches": sum(b != e.tokens for b, e in zip(batch, episodes)),
    }
    result["speedup_vs_seq"] = result["engine_tok_s"] / result["naive_seq_tok_s"]
    result["speedup_vs_batch"] = result["engine_tok_s"] / result["naive_batch_tok_s"]
    if mismatches:
        raise AssertionError(f"{preset}: engine and naive_seq disagree on episodes {mismatches}")
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32, help="episodes per batch")
    ap.add_argument("--repeats", type=int, default=3, help="timing rounds; the fastest round counts")
    ap.add_argument(
        "--naive-seq-episodes",
        type=int,
        default=8,
        help="time one-at-a-time generate on the first N episodes only (it is slow)",
    )
    ap.add_argument("--presets", nargs="*", default=["minicpm-tiny", "qwen-tiny"])
    ap.add_argument("--max-turn-tokens", type=int, default=24)
    ap.add_argument("--max-episode-tokens", type=int, default=2048)
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--env", choices=["fake", "minirepo"], default="fake")
    ap.add_argument(
        "--eot-scale",
        type=float,
        default=1.0,
        help="scale <eot>'s output row (untied) so actions end at varied lengths, as a warm-started "
        "policy's do; 1 = the random model as built (it never stops before max_turn_tokens)",
    )
    ap.add_argument("--mask-finished", action="store_true", help="keep finished episodes as masked rows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    fmt = TinyFormat(build_tokenizer(sample_texts(args.env), vocab_size=args.vocab_size))
    env_cls, tasks = make_env(args.env)
    results = {
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "env": args.env,
        "vocab_size": fmt.vocab_size,
        "free_finished": not args.mask_finished,
        "eot_scale": args.eot_scale,
        "max_turn_tokens": args.max_turn_tokens,
        "presets": {},
    }
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), env {args.env}, vocab {fmt.vocab_size}, "
        f"{args.episodes} episodes, greedy, max_turn_tokens {args.max_turn_tokens}, eot scale {args.eot_scale}"
    )
    print(
        f"{'preset':<14}{'gen tok':>8}{'turns':>6}{'act len':>8}{'maxlen':>7}{'engine':>9}{'seq':>8}{'batch':>8}"
        f"{'x seq':>7}{'x batch':>8}{'diff seq/batch':>15}   (tok/s)"
    )
    for preset in args.presets:
        r = bench_preset(preset, args, fmt, env_cls, tasks)
        results["presets"][preset] = r
        print(
            f"{preset:<14}{r['generated_tokens']:>8}{r['turns_mean']:>6.1f}{r['action_len_mean']:>8.1f}"
            f"{r['length_max']:>7}"
            f"{r['engine_tok_s']:>9.0f}{r['naive_seq_tok_s']:>8.0f}{r['naive_batch_tok_s']:>8.0f}"
            f"{r['speedup_vs_seq']:>7.1f}{r['speedup_vs_batch']:>8.1f}"
            f"{r['naive_seq_mismatches']:>8}/{r['naive_batch_mismatches']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
