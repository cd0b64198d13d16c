"""Run under `torchrun --nproc-per-node N` (gloo, CPU) with CELL.yaml OUT FULL_CKPT: the trainer resumes the sharded
checkpoint in OUT (written by another number of processes) and its weights and optimizer state, gathered, equal
the full-format checkpoint FULL_CKPT of the same step bit for bit (DCP resharded them).
"""

import sys

import torch

from trainer.checkpoints import read_checkpoint
from trainer.config import load_config
from trainer.distributed import full_optimizer_state, full_weights
from trainer.train import Trainer


def _equal(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def main(cell: str, out: str, full_ckpt: str) -> int:
    trainer = Trainer(load_config(cell), out)
    assert trainer.dist.enabled, "run under torchrun with 2 or more processes"
    assert trainer.resume(), f"no checkpoint in {out}"
    weights = full_weights(trainer.model, trainer.dist)
    optimizer = full_optimizer_state(trainer.model, trainer.optimizer, trainer.dist)
    if trainer.dist.is_main:
        want = read_checkpoint(full_ckpt)
        assert trainer.updates_done == want["step"], (
            f"resumed at {trainer.updates_done}, the full checkpoint is {want['step']}"
        )
        _equal(weights, want["model_state"], "weights")
        _equal(optimizer, want["extra"]["optimizer"], "optimizer")
        print(f"dcp reshard OK on {trainer.dist.world_size} ranks (step {trainer.updates_done})")
    else:
        assert weights == {}, "full_weights gathers the weights into rank 0's memory only"
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
