"""The policy update's achieved FLOP rate against this machine's matmul rate, at the same dtype, one thread.

    python benchmarks/bench_update.py [--preset minicpm-tiny] [--episodes 16] [--length 400]

FLOPs are counted by torch's FlopCounterMode on the real update (old log-probs, forward, backward), not estimated
from the parameter count, so attention and the LM head count as they run. The reference rate is a square matmul of
a size comparable to the model's (d x 4d), measured in the same process, interleaved with the update.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer.optim.hybrid import build_muon_adamw, route_parameters
from trainer.optim.muon import resolve_ns_dtype
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rl.config import LossConfig
from trainer.rollout.episode import Episode
from trainer.update import ForwardSettings, pad_episodes, policy_update


def synthetic_batch(n: int, length: int, vocab: int, seed: int = 0) -> list[Episode]:
    """Episodes shaped like the embedded study's: a prompt, then ~12-token actions and ~25-token observations."""
    rng = random.Random(seed)
    episodes = []
    for _ in range(n):
        e = Episode("bench")
        e.append([rng.randrange(vocab) for _ in range(40)], policy=False)
        turn = 0
        while e.length < length:
            k = rng.randint(6, 16)
            e.append([rng.randrange(vocab) for _ in range(k)], policy=True, logps=[-1.0] * k, version=0, turn=turn)
            e.append([rng.randrange(vocab) for _ in range(rng.randint(10, 40))], policy=False)
            turn += 1
        episodes.append(e)
    return episodes


def matmul_rate(d: int, dtype: torch.dtype, reps: int = 5, square: bool = False) -> float:
    """FLOP/s of a (4d x d) @ (d x 4d) matmul, the update's typical shape; `square`: d x d x d instead."""
    if square:
        a, b = torch.randn(d, d, dtype=dtype), torch.randn(d, d, dtype=dtype)
        a @ b
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        return 2 * d**3 * reps / (time.perf_counter() - t)
    a, b = torch.randn(4 * d, d, dtype=dtype), torch.randn(d, 4 * d, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * (4 * d) * d * (4 * d) * reps / (time.perf_counter() - t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="minicpm-tiny")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--length", type=int, default=400)
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    batch = pad_episodes(synthetic_batch(args.episodes, args.length, args.vocab), pad_id=0)
    adv = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1)) * batch.loss_mask
    print(f"{args.preset}, {args.episodes} episodes x {batch.input_ids.shape[1]} tokens, one thread")
    print("matmul = (4d x d) @ (d x 4d) at the model's width d; peak = a 1024^3 matmul; rates in GFLOP/s")
    print(f"{'dtype':<10}{'update s':>10}{'GFLOP':>8}{'achieved':>10}{'matmul':>9}{'ratio':>7}{'peak':>8}{'ratio':>7}")
    for name, autocast in (("float32", None), ("bfloat16", torch.bfloat16)):
        model = build_tiny_model(TinyModelSpec(args.preset, args.vocab))
        opt = build_muon_adamw(model, ns_dtype=resolve_ns_dtype("auto", next(model.parameters()).device))
        d = model.config.hidden_size
        hidden = [p for _, p in route_parameters(model).muon]
        run = functools.partial(
            policy_update,
            model,
            opt,
            batch,
            adv,
            LossConfig(),
            forward=ForwardSettings(autocast_dtype=autocast),
            stat_matrices=hidden,
        )
        with FlopCounterMode(display=False) as counter:
            run()
        flops = counter.get_total_flops()
        times, rates, peaks = [], [], []
        dtype = torch.float32 if autocast is None else autocast
        for _ in range(args.rounds):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
            rates.append(matmul_rate(max(d, 128), dtype))
            peaks.append(matmul_rate(1024, dtype, reps=3, square=True))
        t_med, r_med, p_med = statistics.median(times), statistics.median(rates), statistics.median(peaks)
        print(
            f"{name:<10}{t_med:>10.3f}{flops / 1e9:>8.1f}{flops / t_med / 1e9:>9.1f}G{r_med / 1e9:>8.1f}G"
            f"{flops / t_med / r_med:>7.2f}{p_med / 1e9:>7.1f}G{flops / t_med / p_med:>7.2f}"
        )


if __name__ == "__main__":
    main()
