"""Checkpoints for `--resume`: one-file checkpoints and their naming, pruning and reading (`store`), RNG state as
plain data (`rng`), and the sharded (DCP) format that several processes write together (`sharded`, imported where
used: it loads torch.distributed.checkpoint, about a second).
"""

from trainer.checkpoints.rng import capture_rng_state, restore_rng_state
from trainer.checkpoints.store import (
    checkpoint_path,
    list_checkpoints,
    load_latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    remove_partial_saves,
    save_checkpoint,
)

__all__ = [
    "capture_rng_state",
    "checkpoint_path",
    "list_checkpoints",
    "load_latest_checkpoint",
    "prune_checkpoints",
    "read_checkpoint",
    "remove_partial_saves",
    "restore_rng_state",
    "save_checkpoint",
]
