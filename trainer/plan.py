"""Predicted GPU memory of one update of a cell: `python -m trainer plan --config CELL.yaml --gpus N`.

The model is built on the meta device from its config (no weights, no memory), so the parameter counts are exact
for any architecture transformers knows: P in all, P_M on Muon (the router's hidden 2-D matrices), P_A on AdamW.
The update's peak is the sum of these terms, per GPU:

* **state**: fp32 (or bf16) master weights and their gradients, Muon's fp32 momentum, AdamW's two moments; divided
  by the number of GPUs when the update is sharded (FSDP2).
* **compute copies**: unsharded, bf16 autocast keeps a bf16 copy of every matmul weight for the step; sharded,
  FSDP2's buffers instead: two layers' bf16 parameters (the current one and the prefetched one), one layer's fp32
  gradients before the reduce-scatter (twice: unsharded and reduced), and the root module's embedding in bf16 with
  its fp32 gradient.
* **activations**: per token and layer, every matmul's input and output in bf16, the norms' inputs in fp32 and the
  MLP's activation output (counted from the layer's own modules); all layers of the micro-batch without activation
  checkpointing, else each layer's bf16 input plus one layer recomputed and its backward (twice one layer).
* **LM head**: per token of a chunk, the vocabulary's logits in bf16 and fp32, log-softmax, softmax for the
  entropy and the logits' gradient, about 20 bytes per entry; the chunk is the whole micro-batch unless the head
  is chunked.
* **pushed weights**: with a vLLM rollout server, the policy rank 0 gathered onto its GPU for the push, in the
  servers' precision, held through the update (`pushed_weight_bytes`).

The terms follow the memory arithmetic of FSDP2 training (state sharded, one layer live) as torchtitan and prime-rl
describe it; the head's 20 bytes per entry and the activation count are estimates. Checked against the measured
peaks of one update micro-batch on one H200 (docs/scale.md; `tests/unit/test_plan.py` holds the numbers): within 15%
for the 4B shape at 2k/4k/8k tokens, 25% for the 0.5B shape at 2k-16k, and the two measured out-of-memory points
(4B at 16k, 0.5B at 32k) are predicted not to fit. Those bounds were set after the comparison. Not modelled:
allocator fragmentation (the reserved memory was 20-30% above the allocated peak there), CUDA context, NCCL
buffers, the rollout server's share beyond `--reserve`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

GiB = 1024**3
H200_GIB = 139.8
HEAD_BYTES_PER_ENTRY = 20
"""Logits bf16 (2) and fp32 (4), log-softmax (4), softmax for the entropy (4), the logits' gradient (4 + 2)."""


@dataclass(frozen=True)
class ModelCounts:
    """What the memory terms need from an architecture."""

    params: int
    muon_params: int
    matmul_params: int
    """Parameters of every linear map (the autocast copies), the LM head included."""
    layers: int
    hidden: int
    vocab: int
    layer_params: int
    """Parameters of the largest decoder layer (an FSDP2 unit)."""
    embedding_params: int
    activation_bytes_per_token: int
    """Per token, the bytes one decoder layer keeps for its backward (the largest layer)."""


def model_counts(config, trust_remote_code: bool = False) -> ModelCounts:
    """Count a transformers config's model on the meta device (its own code's, with `trust_remote_code`)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    from trainer.optim.hybrid import route_parameters

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    route = route_parameters(model)
    layers = list(model.model.layers)
    hidden = int(config.hidden_size)

    def layer_bytes(layer: nn.Module) -> int:
        total = 0
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                total += 2 * (module.in_features + module.out_features)
            elif "norm" in type(module).__name__.lower() and getattr(module, "weight", None) is not None:
                total += 4 * module.weight.numel()
            elif isinstance(module, nn.Conv1d):
                total += 2 * 2 * module.in_channels
        mlp = getattr(layer, "mlp", None)
        intermediate = getattr(getattr(mlp, "down_proj", None), "in_features", 0)
        return total + 2 * intermediate  # the activation function's output

    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    embedding = model.get_input_embeddings().weight.numel()
    return ModelCounts(
        params=sum(p.numel() for p in model.parameters()),
        muon_params=sum(p.numel() for _, p in route.muon),
        matmul_params=linears,
        layers=len(layers),
        hidden=hidden,
        vocab=int(config.vocab_size),
        layer_params=max(sum(p.numel() for p in layer.parameters()) for layer in layers),
        embedding_params=embedding,
        activation_bytes_per_token=max(layer_bytes(layer) for layer in layers),
    )


@dataclass(frozen=True)
class MemoryPlan:
    terms: dict[str, float]
    """Term name -> GiB per GPU."""
    capacity_gib: float
    reserve_gib: float

    @property
    def total_gib(self) -> float:
        return sum(self.terms.values())

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib - self.reserve_gib

    def table(self) -> str:
        rows = [f"  {name:<18} {gib:8.1f} GiB" for name, gib in self.terms.items()]
        verdict = "fits" if self.fits else "does NOT fit"
        return "\n".join(
            rows
            + [
                f"  {'total':<18} {self.total_gib:8.1f} GiB of {self.capacity_gib:.1f} GiB"
                + (f" less {self.reserve_gib:.1f} GiB reserved" if self.reserve_gib else "")
                + f": {verdict}"
            ]
        )


def plan_memory(
    counts: ModelCounts,
    tokens: int,
    gpus: int = 1,
    *,
    sharded: bool | None = None,
    checkpointing: bool = True,
    head_chunk_tokens: int | None = 2048,
    adam_only: bool = False,
    master_bytes: int = 4,
    capacity_gib: float = H200_GIB,
    reserve_gib: float = 0.0,
    pushed_bytes: int = 0,
) -> MemoryPlan:
    """The per-GPU peak of one update micro-batch of `tokens` tokens (see the module docstring). `sharded`
    defaults to gpus > 1; `head_chunk_tokens` None means the head sees the whole micro-batch at once;
    `pushed_bytes` per parameter: the weights a rollout server is pushed from, held on the first GPU through the
    update (the highest-loaded GPU is the one planned)."""
    if tokens < 1 or gpus < 1:
        raise ValueError(f"tokens and gpus must be >= 1, got {tokens} and {gpus}")
    sharded = gpus > 1 if sharded is None else sharded
    muon = 0 if adam_only else counts.muon_params
    adam = counts.params - muon
    state = master_bytes * counts.params + 4 * counts.params + 4 * muon + 8 * adam
    terms = {"state": state / (gpus if sharded else 1)}
    if sharded:
        terms["fsdp buffers"] = (
            2 * 2 * counts.layer_params + 2 * 4 * counts.layer_params + (2 + 4) * counts.embedding_params
        )
    else:
        terms["autocast copies"] = 2 * counts.matmul_params
    per_layer = tokens * counts.activation_bytes_per_token
    if checkpointing:
        terms["activations"] = counts.layers * tokens * counts.hidden * 2 + 2 * per_layer
    else:
        terms["activations"] = counts.layers * per_layer
    chunk = tokens if head_chunk_tokens is None else min(tokens, head_chunk_tokens)
    terms["lm head"] = chunk * counts.vocab * HEAD_BYTES_PER_ENTRY
    if pushed_bytes:
        terms["pushed weights"] = pushed_bytes * counts.params
    return MemoryPlan({name: value / GiB for name, value in terms.items()}, capacity_gib, reserve_gib)


def cell_model_config(cfg):
    """The transformers config of a cell's model: `model.path`'s config.json, else the tiny preset's."""
    from transformers import AutoConfig

    if cfg.model.path:
        return AutoConfig.from_pretrained(
            cfg.model.path, local_files_only=True, trust_remote_code=cfg.model.trust_remote_code
        )
    from trainer.policy.tiny import TINY_PRESETS

    kwargs = dict(TINY_PRESETS[cfg.model.preset])
    return AutoConfig.for_model(kwargs.pop("model_type"), vocab_size=512, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `plan` subcommand's options."""
    parser.add_argument("--config", required=True, help="cell config (YAML)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the update is sharded over (default 1)")
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="tokens of one micro-batch (default: the cell's rollout.max_episode_tokens)",
    )
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    parser.add_argument("--head-chunk", type=int, default=2048, help="LM-head chunk in tokens; 0: unchunked")
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory of one of the cell's GPUs (default: the first visible GPU's; required where none is visible)",
    )
    parser.add_argument(
        "--reserve-gib", type=float, default=0.0, help="memory kept for other uses (a colocated rollout server's share)"
    )
    parser.add_argument(
        "--wall-time",
        action="store_true",
        help="also the cell's predicted hours and GPU-hours (`python -m trainer simulate` with the cell's rollout "
        "settings), at its placement and at the best split of its GPUs",
    )
    parser.add_argument("--sim-inputs", type=Path, default=None, help="with --wall-time: SimInputs rates (YAML)")


def gpu_memory_gib(given: float | None) -> tuple[float, str]:
    """(GiB, where it came from): `--gpu-memory-gib`, else the first visible GPU's memory. The planner runs where
    the user is, often a login node without GPUs: there it asks instead of assuming a card."""
    from trainer.config import ConfigError

    if given is not None:
        if given <= 0:
            raise ConfigError(f"--gpu-memory-gib must be > 0, got {given}")
        return given, "--gpu-memory-gib"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory / GiB, f"visible GPU 0, {props.name}"
    raise ConfigError(
        "plan: no GPU is visible here; give one GPU's memory of the nodes the cell runs on with --gpu-memory-gib "
        f"(an H200: {H200_GIB}, an H100 80GB: ~79.1)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the plan of `args.config`; 0 when it fits, 1 when it does not."""
    from trainer.config import ConfigError, load_config

    if args.gpus < 1 or (args.tokens is not None and args.tokens < 1) or args.head_chunk < 0:
        raise ConfigError(
            f"--gpus and --tokens must be >= 1 and --head-chunk >= 0, got {args.gpus}, {args.tokens}, {args.head_chunk}"
        )
    capacity, source = gpu_memory_gib(args.gpu_memory_gib)
    cfg = load_config(args.config)
    counts = model_counts(cell_model_config(cfg), trust_remote_code=cfg.model.trust_remote_code)
    tokens = args.tokens or cfg.rollout.max_episode_tokens
    plan = cell_plan(cfg, args, counts, tokens, args.gpus, capacity)
    print(
        f"{args.config}: {counts.params / 1e9:.2f}B parameters ({counts.muon_params / 1e9:.2f}B on Muon), "
        f"{tokens:,} tokens per micro-batch, {args.gpus} GPU(s){', sharded' if args.gpus > 1 else ''}, "
        f"activation checkpointing {'off' if args.no_checkpointing else 'on'}, head chunk {args.head_chunk or 'none'}, "
        f"{capacity:.1f} GiB per GPU ({source})"
    )
    print(plan.table())
    if args.wall_time:
        print_wall_time(cfg, args, counts, tokens, capacity)
    return 0 if plan.fits else 1


def cell_plan(
    cfg, args: argparse.Namespace, counts: ModelCounts, tokens: int, gpus: int, capacity: float
) -> MemoryPlan:
    """The memory plan of the cell's update on `gpus` GPUs, with the command's checkpointing, head chunk and reserve."""
    return plan_memory(
        counts,
        tokens,
        gpus,
        checkpointing=not args.no_checkpointing,
        head_chunk_tokens=args.head_chunk or None,
        adam_only=cfg.optim.name != "muon",
        master_bytes=4 if cfg.model.dtype == "float32" else 2,
        capacity_gib=capacity,
        reserve_gib=args.reserve_gib,
        pushed_bytes=pushed_weight_bytes(cfg),
    )


def pushed_weight_bytes(cfg) -> int:
    """Bytes per parameter that rank 0 keeps on its GPU for pushes to rollout servers (`Trainer._publish` gathers
    them there in the servers' precision, the compute dtype): the latest policy, or the `lag` + 1 the lagged mode
    keeps; 0 without a vLLM server (an engine in the trainer's process takes the weights from host memory, the
    reference server is on the CPU)."""
    r = cfg.rollout
    if not r.server or r.engine != "vllm":
        return 0
    copies = r.lag + 1 if r.mode == "lagged" else 1
    return copies * (2 if cfg.run.compute_dtype == "bfloat16" else 4)


def print_wall_time(cfg, args: argparse.Namespace, counts: ModelCounts, tokens: int, capacity: float) -> None:
    """The simulated seconds per update, hours and GPU-hours of the cell (trainer/rollout/simulate.py): its GPUs
    are `--gpus` for the update plus one per rollout server (one engine when it has no server), the rates are
    `--sim-inputs`' (else the simulator's stated defaults), the episode shape, batch, staleness and workers the
    cell's. The best split keeps at least the fewest update GPUs the memory plan fits on."""
    from trainer.rollout.simulate import best, load_inputs, placements, simulate

    r = cfg.rollout
    engines = r.server_replicas if r.server else 1
    fits = [g for g in range(1, args.gpus + engines) if cell_plan(cfg, args, counts, tokens, g, capacity).fits]
    x = load_inputs(
        args.sim_inputs,
        dict(
            gpus=args.gpus + engines,
            update_gpus=args.gpus,
            min_update_gpus=fits[0] if fits else args.gpus,
            batch_size=r.batch_size,
            max_staleness=r.max_staleness,
            max_in_flight=r.max_in_flight or r.batch_size,
            max_turn_tokens=r.max_turn_tokens,
            max_episode_tokens=r.max_episode_tokens,
            env_workers=r.env_workers,
            updates=cfg.run.updates,
        ),
    )
    here = simulate(x, r.loop, 4)
    top = best(placements(x, [r.loop], 4), r.loop)
    print(
        f"wall time (simulated, loop {r.loop}; rates assumed unless measured: docs/scale.md): {here.seconds_per_update:.0f} s "
        f"per update at {x.update_gpus} update GPU(s) + {engines} rollout GPU(s), {here.cell_hours:.1f} h and "
        f"{here.gpu_hours:.0f} GPU-hours for {x.updates} updates; engines {here.engine_busy:.0%} busy, update "
        f"{here.update_busy:.0%}"
    )
    print(
        f"best split of the {x.gpus} GPUs: {top.update_gpus} update + {top.engine_gpus} rollout, "
        f"{top.seconds_per_update:.0f} s per update, {top.cell_hours:.1f} h and {top.gpu_hours:.0f} GPU-hours"
    )
