"""One optimizer for a whole model: Muon on hidden matrices, AdamW on everything else.

Why route by module rather than by shape: the embedding and the LM head are matrices too, but Muon's
orthogonalised update suits linear maps between hidden activations, not lookup tables or the logit layer
(Keller Jordan's and Moonlight's advice; the companion paper keeps them on AdamW). A square tied embedding would
pass any shape test, so the head is found as the model's output-embedding module (or named explicitly) and the
embeddings as `nn.Embedding` modules. Norm gains, biases and scalars (fewer than 2 dims) go to AdamW, and so do
tensors of more than 2 dims (the 3-D conv1d kernels of Qwen3.5's Gated DeltaNet layers): the paper applies Muon
to hidden weight matrices, and a depthwise convolution kernel is not a linear map between hidden states.

`MuonAdamW` is a single `torch.optim.Optimizer`: each param group carries `use_muon`, `step()` runs batched Muon
on the Muon groups and torch's own AdamW kernel (foreach) on the others, and `state_dict()` round-trips both.
An LR scheduler sees ordinary param groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.adam import adam as adam_functional

from trainer.optim.muon import (
    ADJUST_LR_FNS,
    JORDAN_COEFFICIENTS,
    check_muon_param,
    muon_group_step,
    ns_dtype_name,
    resolve_coefficients,
)


@dataclass
class ParamRoute:
    muon: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    adamw: list[tuple[str, nn.Parameter]] = field(default_factory=list)


def route_parameters(model: nn.Module, head: nn.Module | None = None) -> ParamRoute:
    """Split trainable parameters into Muon (hidden 2-D matrices) and AdamW (embeddings, head, norms, biases,
    scalars, convolution kernels).

    `head` defaults to `model.get_output_embeddings()` for Hugging Face models. A parameter shared between
    modules (tied embeddings) is listed once, on AdamW if any owner is an embedding or the head.
    """
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    excluded: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding) or (head is not None and module is head):
            excluded.update(id(p) for p in module.parameters(recurse=False))
    route, seen = ParamRoute(), set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in excluded or p.dim() != 2:
            route.adamw.append((name, p))
        else:
            route.muon.append((name, p))
    return route


class MuonAdamW(Optimizer):
    """Muon for groups with `use_muon=True`, AdamW (decoupled weight decay) for the rest; one state."""

    def __init__(self, param_groups: list[dict], *, track_stats: bool = False):
        groups = []
        for g in param_groups:
            g = dict(g)
            g["params"] = list(g["params"])
            if "use_muon" not in g:
                raise ValueError("each param group needs 'use_muon': True or False")
            if g["use_muon"]:
                g.setdefault("lr", 0.02)
                g.setdefault("weight_decay", 0.1)
                g.setdefault("momentum", 0.95)
                g.setdefault("nesterov", True)
                g.setdefault("ns_coefficients", JORDAN_COEFFICIENTS)
                g.setdefault("eps", 1e-7)
                g.setdefault("ns_steps", 5)
                g.setdefault("adjust_lr_fn", None)
                g["ns_dtype"] = ns_dtype_name(g.get("ns_dtype", "bfloat16"))
                if g["adjust_lr_fn"] not in (None, *ADJUST_LR_FNS):
                    raise ValueError(f"adjust_lr_fn {g['adjust_lr_fn']!r} is not one of {ADJUST_LR_FNS}")
                resolve_coefficients(g["ns_coefficients"], g["ns_steps"])
                names = g.get("names") or [""] * len(g["params"])
                for p, name in zip(g["params"], names):
                    check_muon_param(p, name=name)
            else:
                g.setdefault("lr", 3e-4)
                g.setdefault("betas", (0.9, 0.999))
                g.setdefault("eps", 1e-8)
                g.setdefault("weight_decay", 0.01)
            if not g["lr"] >= 0:
                raise ValueError(f"lr must be >= 0, got {g['lr']}")
            groups.append(g)
        super().__init__(groups, {})
        self.track_stats = track_stats
        self.last_stats: list[dict[str, float]] = []

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_stats = []
        for group in self.param_groups:
            if group["use_muon"]:
                self.last_stats.append(muon_group_step(group, self.state, track_stats=self.track_stats))
            else:
                self._adamw_group_step(group)
                self.last_stats.append({})
        return loss

    def _adamw_group_step(self, group: dict) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            st = self.state[p]
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(st["exp_avg"])
            exp_avg_sqs.append(st["exp_avg_sq"])
            steps.append(st["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adam_functional(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            foreach=params[0].device.type != "mps",
            decoupled_weight_decay=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )


def build_muon_adamw(
    model: nn.Module,
    *,
    matrix_lr: float = 0.02,
    muon_weight_decay: float = 0.1,
    lr: float = 3e-4,
    weight_decay: float = 0.0,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    head: nn.Module | None = None,
    track_stats: bool = False,
    **muon_options,
) -> MuonAdamW:
    """The hybrid for `model`: routed by `route_parameters`, the hidden matrices at `matrix_lr` with Muon, the rest
    at `lr` with AdamW (OptimConfig's names); `muon_options` go to the Muon group, which also gets the AdamW half's
    betas and eps (the AdamW step `adjust_lr_fn="match_spectral_adamw"` matches)."""
    route = route_parameters(model, head=head)
    groups = []
    if route.muon:
        groups.append(
            dict(
                params=[p for _, p in route.muon],
                names=[n for n, _ in route.muon],
                use_muon=True,
                lr=matrix_lr,
                weight_decay=muon_weight_decay,
                **{"adamw_betas": betas, "adamw_eps": eps, **muon_options},
            )
        )
    if route.adamw:
        groups.append(
            dict(
                params=[p for _, p in route.adamw],
                names=[n for n, _ in route.adamw],
                use_muon=False,
                lr=lr,
                weight_decay=weight_decay,
                betas=betas,
                eps=eps,
            )
        )
    return MuonAdamW(groups, track_stats=track_stats)


def build_adamw_by_role(model: nn.Module, *, lr: float, matrix_lr: float | None = None, **adamw_options) -> Optimizer:
    """torch's AdamW with the learning rates named by role, as a Muon cell names them: the hidden matrices (Muon's
    under the hybrid, `route_parameters`) at `matrix_lr`, everything else at `lr`. Equal rates (or `matrix_lr`
    None): one group, the plain AdamW every earlier cell ran, its state laid out as theirs. The counterpart of
    Muon's arm that moves the hidden matrices faster than the AdamW-trained rest, with AdamW's update rule instead
    of Muon's."""
    if matrix_lr is None or matrix_lr == lr:
        return torch.optim.AdamW(model.parameters(), lr=lr, **adamw_options)
    route = route_parameters(model)
    groups = [
        {"params": [p for _, p in params], "lr": group_lr}
        for params, group_lr in ((route.muon, matrix_lr), (route.adamw, lr))
        if params
    ]
    return torch.optim.AdamW(groups, lr=lr, **adamw_options)
