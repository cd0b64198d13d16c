"""The named recipes: presets over a cell's `optim`, `rl`, `shaping` and `loss` sections, applied before the cell's
own keys (a cell may name a recipe and still override any field).

The paper's Figure-2 recipes, then the companion study's three group estimators (AdamW is its baseline; no shaping
penalties and no TIS, as in verl-agent's ALFWorld recipe). The optimizer is part of a recipe but any recipe runs
with any optimizer (a grid block sets `optim.name`), as the paper's Adam versions of the ablations do.
"""

from __future__ import annotations

from typing import Any

from trainer.rl.config import GROUP_ESTIMATORS


def _recipe(
    optimizer: str, estimator: str, *, length: bool, tool: bool, agg: str = "token-mean", tis: bool = True
) -> dict[str, dict[str, Any]]:
    return {
        "optim": {"name": optimizer},
        "rl": {"estimator": estimator},
        "shaping": {"length_penalty": length, "tool_penalty": tool},
        "loss": {"agg": agg, "tis_cap": 2.0 if tis else None},
    }


RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "spo_adam": _recipe("adam", "spo", length=False, tool=False, tis=False),
    "spo_muon": _recipe("muon", "spo", length=False, tool=False, tis=False),
    "full": _recipe("muon", "spo++", length=True, tool=True),
    "no_length": _recipe("muon", "spo++", length=False, tool=True),
    "no_tool": _recipe("muon", "spo++", length=True, tool=False),
    "no_penalties": _recipe("muon", "spo++", length=False, tool=False),
    "no_length_seqmean": _recipe("muon", "spo++", length=False, tool=True, agg="seq-mean-token-mean"),
    "no_length_seqmean_no_tis": _recipe("muon", "spo++", length=False, tool=True, agg="seq-mean-token-mean", tis=False),
    **{estimator: _recipe("adam", estimator, length=False, tool=False, tis=False) for estimator in GROUP_ESTIMATORS},
}
FIGURE2_RECIPES: tuple[str, ...] = (
    "spo_adam",
    "spo_muon",
    "full",
    "no_length",
    "no_tool",
    "no_penalties",
    "no_length_seqmean",
    "no_length_seqmean_no_tis",
)
"""The main paper's recipes in its Figure-2 order: the main study's tables and figures draw these."""
RECIPE_OPTIMIZER: dict[str, str] = {name: recipe["optim"]["name"] for name, recipe in RECIPES.items()}
"""Each recipe's own optimizer (`optimizer: recipe` in a grid block)."""
RECIPE_ESTIMATOR: dict[str, str] = {name: recipe["rl"]["estimator"] for name, recipe in RECIPES.items()}
"""Each recipe's advantage estimator."""
