"""Run under `torchrun --nproc-per-node N` (gloo, CPU): the sharded update's gradients equal one process's.

Every rank builds the same tiny model (Qwen3, and Qwen3.5's hybrid of Gated DeltaNet and full attention) and the
same batch: rows of unequal length, policy tokens in some, none in one, so the ranks hold unequal tokens and,
with a small micro-batch budget, unequal numbers of micro-batches (the stand-ins make up the difference). The
reference update runs on an unsharded copy in each rank. The optimizer records the gradients it is handed
instead of stepping. Checked for all four aggregations, without and with activation checkpointing, and with a
chunked LM head (5 positions a chunk) against the unchunked single process: the whole
gradient's relative difference (norm of the difference over the norm) <= 1e-6. A batch of one row (the other ranks get none) must finish too (the caller's timeout).
"""

import copy
import sys

import torch

from trainer.distributed import init_distributed, shard_model
from trainer.rl.config import LossConfig
from trainer.rl.loss import AGGREGATIONS
from trainer.rollout.episode import Episode
from trainer.update import ForwardSettings, pad_episodes, policy_update

ARCHS = {
    "qwen3": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "qwen3_5_text": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    ),
}
VOCAB = 97


class Recorder(torch.optim.Optimizer):
    """Keeps the (full) gradients of each step instead of stepping."""

    def __init__(self, params):
        super().__init__(params, {})
        self.seen = []

    def step(self, closure=None):
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                grads.append(g.full_tensor() if hasattr(g, "full_tensor") else g.clone())
        self.seen.append(grads)


def model_for(arch: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, vocab_size=VOCAB, tie_word_embeddings=False, **ARCHS[arch])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def batch_of(lengths: list[int], empty: set[int]):
    g = torch.Generator().manual_seed(1)
    episodes = []
    for i, n in enumerate(lengths):
        e = Episode(task_id=str(i))
        e.tokens = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        e.loss_mask = [0] * 3 + [0 if i in empty else 1] * (n - 3)
        e.rollout_logp = (-torch.rand(n, generator=g)).tolist()
        e.versions = [0] * n
        episodes.append(e)
    batch = pad_episodes(episodes, pad_id=0)
    advantages = torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask
    return batch, advantages


def grads_of(model, batch, advantages, agg, ctx=None, chunk=None):
    opt = Recorder(model.parameters())
    kwargs = ({} if ctx is None else {"ctx": ctx}) | {"forward": ForwardSettings(chunk_tokens=chunk)}
    policy_update(
        model,
        opt,
        batch,
        advantages,
        LossConfig(agg=agg, tis_cap=2.0),
        micro_batch_tokens=24,
        grad_clip=None,
        **kwargs,
    )
    return opt.seen[0]


def main() -> int:
    ctx = init_distributed("cpu")
    torch.manual_seed(0)
    worst = 0.0
    for arch in ARCHS:
        for checkpointing, chunk in ((False, None), (True, None), (True, 5)):
            base = model_for(arch)
            sharded = shard_model(copy.deepcopy(base), compute_dtype=None, checkpointing=checkpointing)
            for agg in AGGREGATIONS:
                batch, advantages = batch_of([9, 14, 6, 11, 12], empty={2})
                want = grads_of(copy.deepcopy(base), batch, advantages, agg)
                got = grads_of(sharded, batch, advantages, agg, ctx, chunk)
                a, b = torch.cat([g.flatten() for g in got]), torch.cat([g.flatten() for g in want])
                rel = float((a - b).norm() / b.norm())
                worst = max(worst, rel)
                assert rel <= 1e-6, f"{arch} ckpt={checkpointing} chunk={chunk} {agg}: gradient off by {rel:.2e}"
            lonely, lonely_adv = batch_of([10], empty=set())  # one row: every other rank has none
            got = grads_of(sharded, lonely, lonely_adv, "token-mean", ctx)
            want = grads_of(copy.deepcopy(base), lonely, lonely_adv, "token-mean")
            a, b = torch.cat([g.flatten() for g in got]), torch.cat([g.flatten() for g in want])
            assert float((a - b).norm() / b.norm()) <= 1e-6, f"{arch}: a one-row batch's gradient differs"
    if ctx.is_main:
        print(f"fsdp parity OK on {ctx.world_size} ranks (worst relative gradient difference {worst:.1e})")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
