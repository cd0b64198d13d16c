"""From a study config (config.yaml, configs/*.yaml) to the grid of cells and each cell's trainer config.

Imported by workflow/rules/common.smk (not run as a `script:`): the functions are pure, so the tests call them
directly and Snakemake only writes their results to disk. Design choices:

- **The grid is a list of blocks**, each "these recipes x these seeds, on this optimizer, for these models".
  `optimizer: recipe` means each recipe's own optimizer (Figure 2: spo_adam on Adam, the rest on Muon); `adam`,
  `muon` or `adam_high_lr` runs every listed recipe on that optimizer (the Adam versions of Figures 4-5, the
  companion's three optimizers). Blocks are
  concatenated and exact duplicates dropped, so a study reads like the papers' figure list.
- **A cell config is the study's shared `cell` block plus four per-cell keys**: `recipe`, `optim.name`,
  `run.seed` and `model.path`. The schema forbids those keys (and the recipe-defining `rl` keys) in the shared
  block, because an explicit key overrides the recipe in the trainer (`trainer/config.py`): a shared
  `rl.tis_cap` would silently turn TIS on for the no-TIS recipes.
- **`run.threads` comes from the rule's threads** (`resources.train.threads`), so the trainer uses exactly the
  cores the scheduler gave it.
- **Models**: a `preset` model is warm-started by the workflow and its cells load the warm-started policy; a
  `path` model is a local checkpoint used as is (paper scale). Cross-key rules the JSON schema cannot state
  (preset xor path, the path exists, a task file or game folder exists, a grid block names known models,
  group estimators have groups, band low <= high) are checked by
  `check_study`, which raises `StudyError` naming the key before any job starts.
- **The recipe -> optimizer table** mirrors `trainer.config.RECIPES` (tests compare them), so these helpers
  import nothing of the trainer. The checks that need its rules (`check_cells`, `check_env_options`) import only
  its torch-free parts (the typed config, the environment families' option dataclasses): building the DAG needs
  the trainer package but not torch.
"""
from __future__ import annotations

import ast
import copy
import os
from pathlib import Path

import pandas as pd
import yaml

RECIPE_OPTIMIZER: dict[str, str] = {
    "spo_adam": "adam",
    "spo_muon": "muon",
    "full": "muon",
    "no_length": "muon",
    "no_tool": "muon",
    "no_penalties": "muon",
    "no_length_seqmean": "muon",
    "no_length_seqmean_no_tis": "muon",
    "grpo": "adam",
    "gigpo": "adam",
    "graphgpo": "adam",
}
"""Each recipe's own optimizer: the Figure-2 recipes (DESIGN.md's table, in the paper's order), then the
companion's estimators (AdamW, its baseline)."""

OPTIMIZERS = ("adam", "muon", "adam_high_lr")
"""The trainer's optim.name values a grid block may name (adam_high_lr: AdamW at Muon's learning rate)."""

GROUP_RECIPES = ("grpo", "gigpo", "graphgpo")
"""Recipes whose estimator compares a task's rollouts with each other: they need cell.rl.group_size >= 2."""

GRID_COLUMNS = ["model", "recipe", "optimizer", "seed"]
"""Columns of the grid, in the order of the Hive folders results/cells/model=../recipe=../optimizer=../seed=../."""

SFT_ROLLOUT_KEYS = ("max_turn_tokens", "max_episode_tokens", "temperature", "top_p")
"""The rollout settings the warm start uses (it measures its band by sampling as the RL rollouts do); the rest
would only make an unrelated rollout change retrain the base policy."""


class StudyError(ValueError):
    """A study config that passes the schema but breaks a cross-key rule; the message names the key."""


PATH_OPTIONS = ("tasks_file", "data_dir")
"""The `cell.env.options` keys that name local files or folders (besides `models.*.path`)."""


def check_study(study: dict, root: str | Path = ".") -> None:
    """Raise StudyError for what the schema cannot express. Relative paths are relative to `root` (the repository
    root: the study files' paths are written from there, whatever the study's `workdir`)."""
    root = Path(root)
    for name, entry in study["models"].items():
        has_preset, has_path = entry.get("preset") is not None, entry.get("path") is not None
        if has_preset == has_path:
            raise StudyError(f"models.{name}: give exactly one of `preset` (a tiny model the workflow "
                             f"warm-starts) or `path` (a local checkpoint), got {entry!r}")
        if has_path and not (root / entry["path"]).exists():
            raise StudyError(f"models.{name}.path: {entry['path']!r} does not exist "
                             f"(paper scale needs the checkpoint on a local path)")
    for i, block in enumerate(study["grid"]):
        for model in block.get("models", []):
            if model not in study["models"]:
                raise StudyError(f"grid[{i}].models: {model!r} is not a model of this study "
                                 f"(models: {sorted(study['models'])})")
    options = study.get("cell", {}).get("env", {}).get("options", {})
    for key in PATH_OPTIONS:
        if options.get(key) and not (root / options[key]).exists():
            raise StudyError(f"cell.env.options.{key}: {options[key]!r} does not exist (paper-scale tasks and "
                             f"games are read from local files; nothing is downloaded)")
    recipes = {r for block in study["grid"] for r in block["recipes"]}
    if study.get("study") == "companion":
        for key, section in (("eval_every", "run"), ("eval_tasks", "env")):
            if study.get("cell", {}).get(section, {}).get(key, 1) < 1:
                raise StudyError(f"cell.{section}.{key}: the companion study's headline numbers are validation "
                                 f"success, so it must validate (>= 1), got {study['cell'][section][key]}")
        if recipes - set(GROUP_RECIPES):
                raise StudyError(f"grid: the companion study's analysis compares the estimators {list(GROUP_RECIPES)}; "
                             f"recipes {sorted(recipes - set(GROUP_RECIPES))} belong to the main study (study: main)")
    group_size = study.get("cell", {}).get("rl", {}).get("group_size", 1)
    if recipes & set(GROUP_RECIPES) and group_size < 2:
        raise StudyError(f"cell.rl.group_size: recipes {sorted(recipes & set(GROUP_RECIPES))} compare rollouts "
                         f"of one task and need group_size >= 2, got {group_size}")
    band = study.get("warm_start", {}).get("band")
    if band is not None and band[0] > band[1]:
        raise StudyError(f"warm_start.band: low {band[0]} is above high {band[1]}")


def grid_frame(study: dict) -> pd.DataFrame:
    """One row per cell (model, recipe, optimizer, seed), blocks in order, exact duplicates dropped."""
    rows = []
    for block in study["grid"]:
        for model in block.get("models") or list(study["models"]):
            for recipe in block["recipes"]:
                optimizer = block.get("optimizer", "recipe")
                optimizer = RECIPE_OPTIMIZER[recipe] if optimizer == "recipe" else optimizer
                for seed in block["seeds"]:
                    rows.append((model, recipe, optimizer, int(seed)))
    return pd.DataFrame(rows, columns=GRID_COLUMNS).drop_duplicates(ignore_index=True)


def warm_started_models(study: dict, grid: pd.DataFrame) -> list[str]:
    """Models of the grid built from a tiny preset (they need the warm-start rule), in grid order."""
    return [m for m in dict.fromkeys(grid["model"]) if study["models"][m].get("preset") is not None]


def paper_names(study: dict) -> dict[str, str]:
    """Model name -> the paper's model name (the name itself when none is given), for tables and figures."""
    return {name: entry.get("paper_name") or name for name, entry in study["models"].items()}


def cell_config(study: dict, model: str, recipe: str, optimizer: str, seed: int, model_path: str,
                threads: int) -> dict:
    """The trainer config of one cell: the shared `cell` block plus the cell's own keys."""
    shared = copy.deepcopy(study.get("cell", {}))
    cell = {"recipe": recipe}
    cell["model"] = {**shared.pop("model", {}), "path": model_path}
    cell["optim"] = {**shared.pop("optim", {}), "name": optimizer}
    run = {**shared.pop("run", {}), "seed": int(seed), "threads": int(threads)}
    cell.update(shared)  # env, rl, rollout as given
    cell["run"] = run
    return cell


def warm_start_config(study: dict, model: str, threads: int) -> dict:
    """The `python -m trainer sft` config of one model family: its preset, the cells' env and token limits."""
    shared = study.get("cell", {})
    options = {k: v for k, v in study.get("warm_start", {}).items() if k != "allow_out_of_band"}
    model_keys = {k: v for k, v in shared.get("model", {}).items() if k in ("dtype", "init_seed")}
    rollout = {k: v for k, v in shared.get("rollout", {}).items() if k in SFT_ROLLOUT_KEYS}
    return {"model": {"preset": study["models"][model]["preset"], **model_keys},
            "env": copy.deepcopy(shared.get("env", {})), "rollout": rollout, **options, "threads": int(threads)}


def _import_from_trainer(root: str | Path):
    """The trainer package at `root` on sys.path (its config and environment configs import no torch)."""
    import sys
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def check_cells(study: dict, grid: pd.DataFrame, root: str | Path, threads: int = 1) -> None:
    """Raise StudyError for a cell the trainer would refuse (its cross-key rules: batch size a multiple of the
    group size, vLLM with a checkpoint, ...), naming the cell, before any job starts. The model path is checked
    by `check_study`; here it stands in as ".", since a warm-started policy does not exist yet."""
    _import_from_trainer(root)
    from trainer.config import ConfigError, config_from_dict

    for row in grid.itertuples(index=False):
        cell = cell_config(study, row.model, row.recipe, row.optimizer, int(row.seed), ".", threads=threads)
        try:
            config_from_dict(cell)
        except ConfigError as e:
            raise StudyError(f"cell (as {row.model} / {row.recipe} / {row.optimizer} / seed {row.seed} trains "
                             f"it): {e}") from None


def check_env_options(study: dict, root: str | Path) -> None:
    """Raise StudyError for an unknown `cell.env.options` key or a value its environment family rejects.

    The schema leaves that block free-form (each family owns its keys), so the family's own config dataclass
    checks it, imported from the trainer at `root`: torch-free, so the DAG still needs no torch."""
    _import_from_trainer(root)
    from trainer.environments.suite import family_config

    env = study.get("cell", {}).get("env", {})
    name = env.get("name", "minirepo")  # trainer.config.EnvConfig's default
    try:
        family_config(name, env.get("options", {}))
    except (ValueError, TypeError) as e:
        message = str(e)
        raise StudyError(f"cell.{message}" if message.startswith("env.") else f"cell.env.options: {message}") from None


def paths_from_workdir(study: dict, root: str | Path, workdir: str | Path) -> dict:
    """The study with its relative local paths (`models.*.path`, `cell.env.options.tasks_file` / `data_dir`)
    rewritten from the repository root to the study's workdir, where its jobs run: `checkpoints/M` becomes
    `../../checkpoints/M` under `workdir: studies/x`. Still relative, so a moved checkout keeps its cells; taken
    between real paths, because a job's working directory is the workdir's real path (`studies/` is often a
    link to scratch storage on a cluster, and `..` climbs from where the link points)."""
    out = copy.deepcopy(study)

    def rebase(path):
        if os.path.isabs(path):
            return path
        return os.path.relpath(os.path.realpath(os.path.join(root, path)), os.path.realpath(workdir))

    for entry in out["models"].values():
        if entry.get("path") is not None:
            entry["path"] = rebase(entry["path"])
    options = out.get("cell", {}).get("env", {}).get("options", {})
    for key in PATH_OPTIONS:
        if options.get(key):
            options[key] = rebase(options[key])
    return out


def yaml_text(data: dict, header: str = "") -> str:
    """`data` as YAML (keys in insertion order) with an optional comment header."""
    return "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(data, sort_keys=False)


def write_yaml(data: dict, path: str | Path, header: str = "") -> None:
    """Write `yaml_text(data, header)` to `path`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml_text(data, header))


def read_trainer_version(init_file: str | Path) -> str:
    """`TRAINER_VERSION` from trainer/__init__.py, read without importing the package (no torch needed)."""
    tree = ast.parse(Path(init_file).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TRAINER_VERSION" for t in node.targets):
            value = ast.literal_eval(node.value)
            if isinstance(value, str) and value:
                return value
    raise StudyError(f"{init_file}: no TRAINER_VERSION = \"...\" string found")
