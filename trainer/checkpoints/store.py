"""Checkpoint files: what `--resume` needs to continue a run as if it had never stopped (RNG state: `rng`).

A checkpoint comes in one of two formats, side by side in one directory; `step` is the last *completed* update, so
a resumed run starts at step + 1. The trainer puts the advantage estimator's state (SPO trackers),
`rng.capture_rng_state(...)` and anything else it needs into `extra`.

* "full": one file, `ckpt-<step:08d>.pt`, holding {"format", "step", "model_state", "optimizer_state", "extra"}
  (`save_checkpoint`).
* "sharded": a directory, `ckpt-<step:08d>/`, holding torch's DCP checkpoint of the model and optimizer, one
  `__<rank>_0.distcp` file per rank that saved it plus DCP's `.metadata`, and `extra.pt` ({"format", "step",
  "optimizer", "extra"}), written by rank 0 (`trainer.checkpoints.sharded`). No rank gathers the whole model,
  and DCP reshards on load, so it resumes on any number of processes. Unlike the rest, DCP's `.metadata` and its
  non-tensor entries are pickles: load only checkpoints you wrote.

Choices and why:

* **Written atomically** (`atomic.atomic_path`: temp file, fsync, os.replace, fsync the directory; a sharded
  checkpoint is saved into a hidden temp directory that rank 0 renames once every rank's shards are written).
  A SIGKILL mid-save leaves the previous checkpoints untouched plus a hidden ".ckpt-....tmp" file or directory,
  which `load_latest_checkpoint` ignores with a warning and the next save deletes.
* **Plain data only, loaded with `weights_only=True`** (all but DCP's own files). Tensors, numbers, strings,
  dtypes and containers of them; `save_checkpoint` checks this first and raises TypeError naming the offending
  entry. So a checkpoint never needs to unpickle code, and a checkpoint that saved is a checkpoint that loads.
  RNG states are converted to such types (numpy's key arrays become lists).
* **Unreadable means skipped, loudly.** `load_latest_checkpoint` tries checkpoints of both formats newest first
  and warns about each one it cannot read (truncated by a disk failure, written by something else, wrong step
  inside; a sharded one without its metadata or with a shard file shorter than the metadata says), returning the
  newest good one, or None. A sharded checkpoint's shards are read afterwards, by
  `sharded.load_sharded_checkpoint` into the live model, which needs the model.
* **Keep the last `keep`.** After a save, checkpoints with a *higher* step than the one just written are deleted:
  they belong to the timeline abandoned by resuming from an older checkpoint (which happens only when those
  were unreadable). Then all but the `keep` highest steps are deleted, so the new one is always kept.
  A trainer starting a fresh run must not point at a directory that already holds checkpoints.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainer.atomic import atomic_path, stale_temps

FORMAT = "harness.checkpoint/1"
SHARDED_FORMAT = "harness.sharded-checkpoint/1"
SHARDED_EXTRA = "extra.pt"
"""The file of a sharded checkpoint's directory that holds everything but the model and optimizer (rank 0's)."""
_NAME = re.compile(r"ckpt-(\d{8,})(\.pt)?")
_LEAVES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)
"""Exact types (np.float64 subclasses float, an IntEnum int, but neither loads with weights_only=True)."""


def checkpoint_path(directory: str | os.PathLike, step: int, sharded: bool = False) -> Path:
    return Path(directory) / (f"ckpt-{step:08d}" if sharded else f"ckpt-{step:08d}.pt")


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every file or directory named like a checkpoint of either format, by increasing step
    (readable or not)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return sorted(found)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def check_step_and_keep(step: int, keep: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")


def remove_partial_saves(directory: str | os.PathLike) -> None:
    """Delete what killed saves left (temp files and directories of either format): one writer per directory."""
    for leftover in stale_temps(directory, "ckpt-*"):
        remove_path(leftover)


def prune_checkpoints(directory: str | os.PathLike, step: int, keep: int) -> None:
    """After saving `step`: delete checkpoints of higher steps (an abandoned timeline), then keep the `keep`
    highest steps, `step` among them."""
    others = [(s, p) for s, p in list_checkpoints(directory) if s != step]
    doomed = [p for s, p in others if s > step] + [p for s, p in others if s < step][: -(keep - 1) or None]
    for p in doomed:
        remove_path(p)


def check_plain(value: Any, where: str) -> None:
    """Raise TypeError naming the first entry `torch.load(weights_only=True)` could not read back."""
    if type(value) in _LEAVES or isinstance(value, torch.Tensor):
        return
    if type(value) in (dict, OrderedDict):  # a state_dict is an OrderedDict; a defaultdict would not load
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{where}: key {key!r} is a {type(key).__name__}; use str or int keys")
            check_plain(item, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple, torch.Size):  # a namedtuple would not load
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where}: {type(value).__name__} is not plain data (tensors, Python numbers, str, dtypes, "
        f"dicts, lists, tuples); convert it before checkpointing"
    )


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    step: int,
    model_state: Mapping,
    optimizer_state: Mapping,
    extra: dict,
    keep: int = 3,
) -> Path:
    """Write `ckpt-<step>.pt` atomically, then keep only the `keep` newest checkpoints; return its path."""
    check_step_and_keep(step, keep)
    payload = {
        "format": FORMAT,
        "step": step,
        "model_state": model_state,
        "optimizer_state": optimizer_state,
        "extra": extra,
    }
    check_plain(payload, "checkpoint")
    remove_partial_saves(directory)
    path = checkpoint_path(directory, step)
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    prune_checkpoints(directory, step, keep)
    return path


def _load_payload(file: Path, fmt: str, step: int, keys: set[str], map_location: Any) -> dict:
    """A checkpoint file's dict (read with `weights_only=True`), checked: its format, its step, its keys."""
    payload = torch.load(file, map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        raise ValueError(f"not a {fmt} checkpoint")
    if payload.get("step") != step:
        raise ValueError(f"holds step {payload.get('step')!r}, its name says {step}")
    missing = keys - payload.keys()
    if missing:
        raise ValueError(f"missing {sorted(missing)}")
    return payload


def _read_sharded(path: Path, step: int, map_location: Any) -> dict:
    """A sharded checkpoint's `extra.pt`, once its DCP metadata is read and every shard file it names is there
    and long enough (the shards themselves are read into the model by `load_sharded_checkpoint`)."""
    from torch.distributed.checkpoint import FileSystemReader

    payload = _load_payload(path / SHARDED_EXTRA, SHARDED_FORMAT, step, {"optimizer", "extra"}, map_location)
    for info in FileSystemReader(path).read_metadata().storage_data.values():
        shard = path / info.relative_path
        if not shard.is_file() or shard.stat().st_size < info.offset + info.length:
            raise ValueError(f"shard file {info.relative_path} is missing or shorter than the metadata says")
    return payload


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """One checkpoint of either format as {"step", "model_state", "optimizer_state", "extra", "path", "sharded"};
    a sharded one has None states (its shards need a model to load into: `trainer.checkpoints.sharded`) and says in
    "optimizer" whether it holds the optimizer's state. ValueError (or the reader's error) if it is unreadable."""
    path = Path(path)
    match = _NAME.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path}: not named like a checkpoint (ckpt-<step>.pt or ckpt-<step>/)")
    step = int(match.group(1))
    if path.is_dir():
        payload = _read_sharded(path, step, map_location)
        return {
            "step": step,
            "model_state": None,
            "optimizer_state": None,
            "extra": payload["extra"],
            "path": path,
            "sharded": True,
            "optimizer": payload["optimizer"],
        }
    payload = _load_payload(path, FORMAT, step, {"model_state", "optimizer_state", "extra"}, map_location)
    return {
        "step": step,
        "model_state": payload["model_state"],
        "optimizer_state": payload["optimizer_state"],
        "extra": payload["extra"],
        "path": path,
        "sharded": False,
    }


def load_latest_checkpoint(directory: str | os.PathLike, map_location: Any = "cpu") -> dict | None:
    """The newest readable checkpoint of either format (`read_checkpoint`'s dict), or None.

    Unreadable checkpoints and leftover temporary files or directories are skipped with a warning.
    """
    for leftover in stale_temps(directory, "ckpt-*"):
        warnings.warn(f"ignoring partial checkpoint {leftover} (left by an interrupted save)", stacklevel=2)
    for _, path in reversed(list_checkpoints(directory)):
        try:
            return read_checkpoint(path, map_location)
        except Exception as exc:  # any failure to read means "not a usable checkpoint": say so, try the previous
            warnings.warn(f"ignoring unreadable checkpoint {path}: {type(exc).__name__}: {exc}", stacklevel=2)
    return None
