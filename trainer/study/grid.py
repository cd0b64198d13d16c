"""The grid of a checked study: its cells as rows (`grid_frame`), the axes it has (arms, an lr), each cell's key and
folder (`CellKey`), which models are warm-started and what the tables call them."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd

from trainer.analysis.cell_logs import lr_label
from trainer.recipes import RECIPE_OPTIMIZER
from trainer.study.schema import GridBlock


def has_arms(study: dict) -> bool:
    """Whether the study's blocks name arms (then the grid has an `arm` column)."""
    return any("arm" in block for block in study["grid"])


def arm_cell(study: dict, arm: str | None) -> dict:
    """The trainer keys of an arm (its block's `cell`); {} for no arm. KeyError for a label no block names."""
    if arm is None:
        return {}
    for block in study["grid"]:
        if block.get("arm") == arm:
            return copy.deepcopy(block.get("cell") or {})
    raise KeyError(f"arm {arm!r} is not named by any grid block")


def has_lr_axis(study: dict) -> bool:
    """Whether a block of the study gives `lrs` (then the grid has an `lr` column)."""
    return any("lrs" in block for block in study["grid"])


def grid_columns(study: dict) -> list[str]:
    """The grid's columns: `CellKey`'s fields in folder order, `arm` and `lr` only where the study has that axis."""
    axes = {"arm": has_arms(study), "lr": has_lr_axis(study)}
    return [name for name in CellKey.FOLDER_ORDER if axes.get(name, True)]


def grid_frame(study: dict) -> pd.DataFrame:
    """One row per cell (model, recipe, optimizer, seed), blocks in order, exact duplicates dropped. With arms,
    also `arm` after the optimizer; with an lr axis, `lr` before `seed`: the folder's spelling (`lr_label`, a
    string; float() reads it back exactly)."""
    with_lr, with_arm = has_lr_axis(study), has_arms(study)
    rows = []
    for block in study["grid"]:
        for model in block.get("models") or list(study["models"]):
            for recipe in block["recipes"]:
                optimizer = block.get("optimizer", GridBlock.optimizer)
                optimizer = RECIPE_OPTIMIZER[recipe] if optimizer == "recipe" else optimizer
                arm_key = (block["arm"],) if with_arm else ()
                for lr in block.get("lrs", [None]):
                    for seed in block["seeds"]:
                        lr_key = (lr_label(lr),) if with_lr else ()
                        rows.append((model, recipe, optimizer, *arm_key, *lr_key, int(seed)))
    return pd.DataFrame(rows, columns=grid_columns(study)).drop_duplicates(ignore_index=True)


def policy_model(study: dict, model: str) -> str:
    """The model whose base policy `model`'s cells load: itself, or the model its `policy` key names."""
    return study["models"][model].get("policy") or model


def warm_started_models(study: dict, grid: pd.DataFrame) -> list[str]:
    """Models whose warm-started policy the grid's cells load (they need the warm-start rule), in grid order."""
    return [
        m
        for m in dict.fromkeys(policy_model(study, m) for m in grid["model"])
        if study["models"][m].get("preset") is not None
    ]


def paper_names(study: dict) -> dict[str, str]:
    """Model name -> the paper's model name (the name itself when none is given), for tables and figures."""
    return {name: entry.get("paper_name") or name for name, entry in study["models"].items()}


def horizons(study: dict) -> dict[str, float]:
    """Model name -> its `horizon` label, for the models that have one (the horizon study's x axis)."""
    return {name: entry["horizon"] for name, entry in study["models"].items() if entry.get("horizon") is not None}


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
