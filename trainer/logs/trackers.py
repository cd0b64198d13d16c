"""Experiment trackers beside the Parquet logs, which stay the source of truth: TensorBoard and Weights & Biases.

`python -m trainer train ... --track tensorboard wandb --track-group STUDY --track-name CELL` (a study's
`trackers:` key adds them to every train job). Each update's numeric metrics go to every tracker named, at step =
the update count, with the cell's resolved config attached:

* **TensorBoard** writes event files into `OUT/tensorboard/` (no account, `tensorboard --logdir studies/`). A
  resumed cell writes into the same folder after the update it resumes at (`purge_step`), so the steps logged
  after its checkpoint and before it was killed are dropped, not drawn twice.
* **Weights & Biases** runs offline (`OUT/wandb/offline-run-*`, uploaded later with `wandb sync`) unless
  `WANDB_API_KEY` is set or `WANDB_MODE` says otherwise; project `WANDB_PROJECT` (default "longhorizon-muon"),
  the study as its group, the cell as its name. The run id is derived from the cell's resume key (the workflow's
  `checkpoints/RESUME_KEY`: trainer version, cell config, base policy; by hand, the output folder and config), so
  a resumed cell continues the same run and a changed cell starts a new one.

Both are optional installs (`pip install tensorboard wandb`); asking for one that is missing is an error naming it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

TRACKERS = ("tensorboard", "wandb")
WANDB_PROJECT = "longhorizon-muon"


def run_id(out_dir: Path, config: dict) -> str:
    """A stable id for the cell's tracker runs: from its resume key where the workflow wrote one, else from its
    folder and config (but `run.updates`, which a resumed cell may raise)."""
    key_file = out_dir / "checkpoints" / "RESUME_KEY"
    if key_file.is_file():
        key = key_file.read_text().strip()
    else:
        kept = {**config, "run": {k: v for k, v in (config.get("run") or {}).items() if k != "updates"}}
        key = f"{out_dir.resolve()} {json.dumps(kept, sort_keys=True)}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def numeric(row: dict) -> dict[str, float]:
    """The row's finite numbers (nulls and NaN are not measurements a tracker can draw)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or key == "update":
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class Trackers:
    """The trackers named for one cell; `log` after each update, `close` at the end (also after an error)."""

    def __init__(
        self,
        names: list[str],
        out_dir: str | Path,
        config: dict,
        *,
        group: str | None,
        name: str | None,
        resumed_at: int | None,
    ):
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise ValueError(f"--track: unknown tracker(s) {unknown}; known: {list(TRACKERS)}")
        out = Path(out_dir)
        self.tensorboard = self.wandb = None
        if "tensorboard" in names:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RuntimeError(f"--track tensorboard: {err}; pip install tensorboard") from None
            # the steps a killed run logged after its checkpoint are dropped (steps count updates: the first one
            # the resumed run logs is resumed_at + 1)
            purge = None if resumed_at is None else resumed_at + 1
            self.tensorboard = SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=purge)
            self.tensorboard.add_text(
                "config", f"```\n{json.dumps(config, indent=2)}\n```", global_step=resumed_at or 0
            )
        if "wandb" in names:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError(f"--track wandb: {err}; pip install wandb") from None
            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
                group=group,
                name=name or out.name,
                id=run_id(out, config),
                resume="allow",
                config=config,
                dir=str(out),
                mode=mode,
                settings=wandb.Settings(silent=True, console="off"),
            )

    def log(self, row: dict, step: int) -> None:
        values = numeric(row)
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, global_step=step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
