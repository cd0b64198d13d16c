"""How much of an embedded rollout is spent inside MiniRepo? Target: under 5% of an episode's rollout time.

The scripted expert plays `--episodes` tasks; only `reset` and `step` are timed (the expert stands in for the
policy, so its own thinking is not environment time). The decode cost per generated token is measured, not
assumed: a ~1M-parameter transformer (4 layers of `nn.TransformerEncoderLayer`, d=128, 4 heads, FFN 512, an
embedding and an output head), batch 1, one thread, one new token attending to a 256-token KV cache. The cached
step is computed by hand from the layer's own weights, because `nn.MultiheadAttention` would re-project the
whole context every token; the full 257-token forward without cache is printed for reference only.

Conservative on purpose: an episode's rollout time is taken to be env time plus decode time of the *generated*
tokens only (prompt and observation prefill are left out), and generated tokens are counted word-level
(`len(action.split()) + 1` for the end-of-turn token), fewer than any character-level tokenizer would make.
Both choices make the environment's share look larger than it is.

    python benchmarks/bench_env_step.py [--episodes 500] [--noise 0.1] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from trainer.environments.minirepo import MiniRepoConfig, MiniRepoEnv, MiniRepoTasks, expert_action


def play(episodes: int, noise: float, seed: int):
    """Per episode: env seconds, turns, generated tokens (word-level, char-level); per command: step seconds."""
    config = MiniRepoConfig(seed=seed, n_train=episodes)
    tasks, env, rng = MiniRepoTasks(config).tasks("train", episodes), MiniRepoEnv(config), random.Random(seed)
    rows, per_command, successes = [], defaultdict(list), 0
    for task in tasks:
        t0 = time.perf_counter()
        env.reset(task)
        env_s, words, chars, turns = time.perf_counter() - t0, 0, 0, 0
        while not env.done:
            action = expert_action(env, rng, noise)
            t0 = time.perf_counter()
            result = env.step(action)
            dt = time.perf_counter() - t0
            env_s += dt
            per_command[result.info.tool or "?"].append(dt)
            words, chars, turns = words + len(action.split()) + 1, chars + len(action) + 1, turns + 1
        successes += result.reward > 0.5
        rows.append((env_s, turns, words, chars))
    return rows, per_command, successes


class TinyDecoder(nn.Module):
    """Embedding, 4 encoder layers, output head: about a million parameters at d=128."""

    def __init__(self, vocab: int = 160, d: int = 128, layers: int = 4, heads: int = 4, ffn: int = 512):
        super().__init__()
        self.embed, self.head, self.heads = nn.Embedding(vocab, d), nn.Linear(d, vocab), heads
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, batch_first=True) for _ in range(layers)
        )

    def full_forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the last position, recomputing the whole causal context (no cache)."""
        x = self.embed(ids)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(x[:, -1])

    def cached_step(self, token: torch.Tensor, cache: list) -> torch.Tensor:
        """Logits for one new token given per-layer cached (keys, values) of shape [heads, ctx, d/heads]."""
        x = self.embed(token)  # [1, d]
        for layer, (keys, values) in zip(self.layers, cache):
            attn = layer.self_attn
            q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
            split = lambda t: t.view(1, self.heads, -1).transpose(0, 1)  # noqa: E731  [heads, 1, d/heads]
            k, v = torch.cat([keys, split(k)], 1), torch.cat([values, split(v)], 1)
            out = F.scaled_dot_product_attention(split(q), k, v).transpose(0, 1).reshape(1, -1)
            x = layer.norm1(x + attn.out_proj(out))
            x = layer.norm2(x + layer.linear2(F.relu(layer.linear1(x))))
        return self.head(x)


def decode_cost(context: int = 256, reps: int = 300) -> tuple[float, float, int]:
    """Median seconds per generated token: KV-cached step and full no-cache forward; and the parameter count."""
    torch.manual_seed(0)
    model = TinyDecoder().eval()
    d, heads = 128, model.heads
    cache = [(torch.randn(heads, context, d // heads), torch.randn(heads, context, d // heads)) for _ in model.layers]
    token, ids = torch.tensor([5]), torch.randint(0, 160, (1, context + 1))

    def median_time(fn, n):
        times = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            fn()
            if i >= 20:  # warm-up
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    with torch.inference_mode():
        cached = median_time(lambda: model.cached_step(token, cache), reps)
        full = median_time(lambda: model.full_forward(ids), max(reps // 10, 20))
    return cached, full, sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=500, help="expert episodes to play")
    parser.add_argument("--noise", type=float, default=0.1, help="expert noise (mistakes make more varied steps)")
    parser.add_argument("--seed", type=int, default=0, help="task stream seed and expert rng seed")
    parser.add_argument("--context", type=int, default=256, help="KV-cache length of the decode step")
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows, per_command, successes = play(args.episodes, args.noise, args.seed)
    cached, full, n_params = decode_cost(args.context)
    steps = sum(len(v) for v in per_command.values())
    env_total = sum(r[0] for r in rows)
    print(
        f"MiniRepo env cost: {len(rows)} expert episodes (noise {args.noise}), {steps} steps, "
        f"success {successes / len(rows):.1%}"
    )
    print(f"mean env.step: {env_total / steps * 1e6:.1f} us (reset included in episode totals)\n")
    print(f"{'command':<8} {'steps':>6} {'mean us':>8} {'p99 us':>8}")
    for tool, times in sorted(per_command.items()):
        times = sorted(times)
        print(
            f"{tool:<8} {len(times):>6} {statistics.mean(times) * 1e6:>8.1f} "
            f"{times[min(len(times) - 1, int(0.99 * len(times)))] * 1e6:>8.1f}"
        )
    print(
        f"\ndecode model: {n_params / 1e6:.2f}M params, 1 thread; per generated token: "
        f"{cached * 1e6:.0f} us with a {args.context}-token KV cache "
        f"({full * 1e6:.0f} us for a full {args.context + 1}-token forward, not used below)\n"
    )

    def share(env_s, tokens):
        return env_s / (env_s + tokens * cached)

    print(f"{'per episode':<26} {'mean':>9} {'median':>9} {'p90':>9} {'max':>9}")
    columns = {
        "turns": [r[1] for r in rows],
        "generated tokens (words)": [r[2] for r in rows],
        "generated tokens (chars)": [r[3] for r in rows],
        "env ms": [r[0] * 1e3 for r in rows],
        "decode ms": [r[2] * cached * 1e3 for r in rows],
        "env share % (words)": [100 * share(r[0], r[2]) for r in rows],
        "env share % (chars)": [100 * share(r[0], r[3]) for r in rows],
    }
    for name, values in columns.items():
        values = sorted(values)
        print(
            f"{name:<26} {statistics.mean(values):>9.2f} {statistics.median(values):>9.2f} "
            f"{values[int(0.9 * (len(values) - 1))]:>9.2f} {values[-1]:>9.2f}"
        )
    overall = share(env_total, sum(r[2] for r in rows))
    print(
        f"\nenv share of rollout time, all episodes (word-level tokens): {overall:.2%}  "
        f"target < 5%: {'PASS' if overall < 0.05 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
