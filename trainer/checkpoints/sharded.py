"""Sharded checkpoints (`run.checkpoint_format: sharded`): torch's DCP, each rank writing its own shards.

Why: a full checkpoint gathers every weight and optimizer state on rank 0 (~48 GB for a 4B model with Muon/AdamW
state); DCP has each rank write what it holds (FSDP2's DTensor shards) and reads them back into any layout, so a
checkpoint written by 8 processes resumes on 8, 3 or 1. The layout, the atomicity and the pruning rules are
`trainer.checkpoints.store`'s (see its docstring); this module adds the collective save and load.

Every function that takes a model is collective when a process group is up (every rank calls it, same order), and
works without one (a single process: DCP then reads and writes alone).
"""

from __future__ import annotations

import os
import secrets
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainer.atomic import TMP_SUFFIX, atomic_path, fsync_dir
from trainer.checkpoints.store import (
    SHARDED_EXTRA,
    SHARDED_FORMAT,
    check_plain,
    check_step_and_keep,
    checkpoint_path,
    prune_checkpoints,
    remove_partial_saves,
    remove_path,
)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


@contextmanager
def _one_process_meant():
    """DCP warns whenever it runs without a process group; here that is meant (one process), not forgotten."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """The DCP state: {"model": ..., "optimizer": ...} as each rank holds them (DTensor shards when sharded),
    Hugging Face names, no gather. The optimizer only when given."""
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    return state


def save_sharded_checkpoint(
    directory: str | os.PathLike,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict | None,
    keep: int = 3,
) -> Path:
    """Write `ckpt-<step>/` (collective; `extra` is rank 0's): every rank's shards into a hidden temp directory,
    then, after a barrier, rank 0 adds `extra.pt`, renames the directory into place and keeps the `keep` newest
    checkpoints. Returns the checkpoint's path.

    An optimizer that has not stepped yet is left out: DCP's state-dict helper would otherwise initialise it with
    a zero-lr step (AdamW's step count would then be one ahead of an uninterrupted run's)."""
    check_step_and_keep(step, keep)
    directory, final = Path(directory), checkpoint_path(directory, step, sharded=True)
    main = _rank() == 0
    payload, box = None, [None]
    if main:
        payload = {"format": SHARDED_FORMAT, "step": step, "optimizer": bool(optimizer.state), "extra": extra}
        check_plain(payload, "checkpoint")  # before any rank writes: a bad entry fails the save, not the resume
        directory.mkdir(parents=True, exist_ok=True)
        remove_partial_saves(directory)
        while True:  # like atomic_path, for a directory
            tmp = directory / f".{final.name}.{secrets.token_hex(4)}{TMP_SUFFIX}"
            try:
                tmp.mkdir()
                break
            except FileExistsError:
                continue
        box = [str(tmp)]
    if _distributed():
        dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    with_optimizer = bool(optimizer.state)  # every rank has stepped alike
    with _one_process_meant():
        dcp.save(_state(model, optimizer if with_optimizer else None), checkpoint_id=tmp, no_dist=not _distributed())
    if _distributed():
        dist.barrier()  # every rank's shards are written (and fsynced by DCP's writer)
    if main:
        with atomic_path(tmp / SHARDED_EXTRA) as f:
            torch.save(payload, f)
        fsync_dir(tmp)
        if final.exists():
            remove_path(final)  # an unreadable checkpoint of this step (resuming skipped it)
        os.replace(tmp, final)
        fsync_dir(directory)
        prune_checkpoints(directory, step, keep)
    return final


def load_sharded_checkpoint(
    path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, *, with_optimizer: bool = True
) -> None:
    """Load a sharded checkpoint's model (and optimizer) state into `model` and `optimizer` as this run holds them
    (collective; DCP reshards from whatever number of processes wrote it). `with_optimizer`: whether the
    checkpoint holds the optimizer's state (`load_latest_checkpoint`'s "optimizer")."""
    state = _state(model, optimizer if with_optimizer else None)
    with _one_process_meant():
        dcp.load(state, checkpoint_id=Path(path), no_dist=not _distributed())
    set_model_state_dict(model, state["model"])
    if with_optimizer:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_sharded_weights(path: str | os.PathLike, model: nn.Module) -> None:
    """Load a sharded checkpoint's weights into a plain single-process `model` (Hugging Face names, in place),
    whatever number of processes wrote it; no process group needed, and the optimizer state is not read."""
    state = {"model": model.state_dict()}
    with _one_process_meant():
        dcp.load(state, checkpoint_id=Path(path), no_dist=True)
    model.load_state_dict(state["model"])
