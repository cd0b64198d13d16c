"""Optimizers: batched Muon (`muon.py`, a drop-in for torch.optim.Muon), the Muon/AdamW hybrid for whole models
(`hybrid.py`) and the `optim` config section (`config.py`). Imports nothing, so the config section is read without
torch."""
