"""Run under `torchrun --nproc-per-node N` (gloo, CPU): `full_weights` gathers a sharded model's weights onto rank 0
alone, tensor by tensor, as torch's own `get_model_state_dict(full_state_dict=True)` does.

Checked on tiny Qwen3 models with untied and tied embeddings, FSDP2 over each layer and the root: the same names,
shapes and values as torch's gather (bit for bit in fp32; in bf16, torch's values rounded to bf16, so casting the
shards before the gather is the cast after it), integer buffers untouched, and nothing on the other ranks.
"""

import sys

import torch
from fsdp_parity import ARCHS, VOCAB  # the tiny shapes of the other checks (this script's folder is on the path)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.distributed import full_weights, init_distributed, shard_model


def model_for(tied: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3", vocab_size=VOCAB, tie_word_embeddings=tied, **ARCHS["qwen3"])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def main() -> int:
    ctx = init_distributed("cpu")
    for tied in (False, True):
        model = shard_model(model_for(tied), compute_dtype=None, checkpointing=False)
        reference = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        for dtype in (None, torch.bfloat16):
            got = full_weights(model, ctx, device=torch.device("cpu"), dtype=dtype)
            if not ctx.is_main:
                assert got == {}, f"rank {ctx.rank} received {len(got)} tensors"
                continue
            assert list(got) == list(reference), (sorted(set(got) ^ set(reference)), tied)
            for name, want in reference.items():
                if dtype is not None and want.is_floating_point():
                    want = want.to(dtype)
                have = got[name]
                assert have.device.type == "cpu" and have.dtype == want.dtype, (name, have.dtype, want.dtype)
                assert torch.equal(have, want), (name, dtype, tied)
        default = full_weights(model, ctx)  # the checkpoint's call: on the CPU, as trained
        if ctx.is_main:
            assert all(torch.equal(default[k], reference[k]) for k in reference)
    if ctx.is_main:
        print(f"weight gather OK on {ctx.world_size} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
