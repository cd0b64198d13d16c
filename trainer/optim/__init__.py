"""Optimizers: batched Muon (`muon.py`, a drop-in for torch.optim.Muon), the Muon/AdamW hybrid for whole models
(`hybrid.py`), the `optim` config section (`config.py`) and the one builder from it (`build.py`). Imports
nothing, so the config section is read without torch."""
