"""The grid of a checked study: its cells as rows (`grid_frame`), the axes it has (arms, an lr), each cell's key and
folder (`CellKey`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from trainer.analysis.cell_logs import lr_label
from trainer.recipes import RECIPE_OPTIMIZER
from trainer.study.schema import StudyConfig


@dataclass(frozen=True)
class CellKey:
    """One cell of a study's grid: its grid columns, in the order of its folder's parts (`folder`). `arm` and `lr`
    only in a study with that axis; `lr` as the folder spells it (`lr_label`; float() reads it back exactly)."""

    model: str
    recipe: str
    optimizer: str
    seed: int
    arm: str | None = None
    lr: str | None = None

    FOLDER_ORDER = ("model", "recipe", "optimizer", "arm", "lr", "seed")

    @classmethod
    def of(cls, row) -> CellKey:
        """The key of a grid row (a named tuple) or of a job's Snakemake wildcards (attributes either way)."""
        return cls(
            row.model,
            row.recipe,
            row.optimizer,
            int(row.seed),
            getattr(row, "arm", None),
            getattr(row, "lr", None),
        )

    @property
    def folder(self) -> str:
        """The cell's folder under results/cells, as Snakemake's Paramspace names it (`model=M/.../seed=S`)."""
        parts = ((name, getattr(self, name)) for name in self.FOLDER_ORDER)
        return "/".join(f"{name}={value}" for name, value in parts if value is not None)

    def describe(self) -> str:
        """The key in words, for messages: `m / full / muon / arm a / seed 0`."""
        extra = "".join(f" / {name} {getattr(self, name)}" for name in ("arm", "lr") if getattr(self, name) is not None)
        return f"{self.model} / {self.recipe} / {self.optimizer}{extra} / seed {self.seed}"


def grid_frame(config: StudyConfig) -> pd.DataFrame:
    """One row per cell (model, recipe, optimizer, seed), blocks in order, exact duplicates dropped. With arms,
    also `arm` after the optimizer; with an lr axis, `lr` before `seed`: the folder's spelling (`lr_label`, a
    string; float() reads it back exactly). Only the axes the study has are columns, in `CellKey`'s folder order."""
    with_arm = any(block.arm is not None for block in config.grid)
    with_lr = any(block.lrs is not None for block in config.grid)
    rows = []
    for block in config.grid:
        optimizer = block.optimizer
        for model in block.models or list(config.models):
            for recipe in block.recipes:
                name = RECIPE_OPTIMIZER[recipe] if optimizer == "recipe" else optimizer
                arm_key = (block.arm,) if with_arm else ()
                for lr in block.lrs or [None]:
                    for seed in block.seeds:
                        lr_key = (lr_label(lr),) if with_lr else ()
                        rows.append((model, recipe, name, *arm_key, *lr_key, int(seed)))
    axes = {"arm": with_arm, "lr": with_lr}
    columns = [name for name in CellKey.FOLDER_ORDER if axes.get(name, True)]
    return pd.DataFrame(rows, columns=columns).drop_duplicates(ignore_index=True)
