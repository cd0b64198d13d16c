"""The one optimizer builder: an `optim` section (OptimConfig) into the optimizer of a model, for the cells and the
warm start alike, each learning rate going to the parameters its name says (`matrix_lr` to the hidden matrices,
`lr` to the rest)."""

from __future__ import annotations

import torch

from trainer.optim.config import OptimConfig
from trainer.optim.hybrid import build_adamw_by_role, build_muon_adamw
from trainer.optim.muon import resolve_ns_dtype


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """ "muon": Muon on the hidden matrices, AdamW on the rest (`build_muon_adamw`); "adam" and "adam_high_lr":
    AdamW on everything, the hidden matrices in a group of their own where their rate differs."""
    if optim.name in ("adam", "adam_high_lr"):
        return build_adamw_by_role(
            model,
            lr=optim.lr,
            matrix_lr=optim.matrix_lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            foreach=True,
        )
    return build_muon_adamw(
        model,
        matrix_lr=optim.matrix_lr,
        muon_weight_decay=optim.muon_weight_decay,
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        betas=optim.betas,
        eps=optim.eps,
        momentum=optim.momentum,
        nesterov=optim.nesterov,
        ns_coefficients=optim.ns_coefficients,
        adjust_lr_fn=optim.adjust_lr_fn,
        ns_dtype=resolve_ns_dtype(optim.ns_dtype, next(model.parameters()).device),
    )
