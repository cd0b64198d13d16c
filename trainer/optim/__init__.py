"""Optimizers: batched Muon (drop-in for torch.optim.Muon) and the Muon/AdamW hybrid for whole models."""

from trainer.optim.hybrid import MuonAdamW, build_muon_adamw, route_parameters
from trainer.optim.muon import Muon, newton_schulz

__all__ = ["Muon", "MuonAdamW", "build_muon_adamw", "newton_schulz", "route_parameters"]
