"""The study model: from a study file (config.yaml, configs/*.yaml) to the grid of cells and each cell's trainer
config.

workflow/rules/common.smk loads a study once (`Study.load`) and reads its grid, cells and warm starts from that
object; its parts are pure functions of the study's mapping, so the tests call them directly and Snakemake only
writes their results to disk. Design choices:

- **The grid is a list of blocks**, each "these recipes x these seeds, on this optimizer, for these models".
  `optimizer: recipe` means each recipe's own optimizer (Figure 2: spo_adam on Adam, the rest on Muon); `adam`,
  `muon` or `adam_high_lr` runs every listed recipe on that optimizer (the Adam versions of Figures 4-5, the
  companion's three optimizers). Blocks are
  concatenated and exact duplicates dropped, so a study reads like the papers' figure list.
- **An lr axis** (the stability study): a block's `lrs` adds a learning rate to each of its cells, and the grid
  gets an `lr` column (folders `.../optimizer=O/lr=L/seed=S/`, L written by `lr_label`). Then every block gives
  `lrs`; a study without them keeps the four-key layout.
- **Arms** (the decisive comparisons): a block's `arm` names a variant of the trainer and its `cell` holds that
  variant's trainer keys, deep-merged over the shared `cell` block for the block's cells (an lr by role, AdamW's
  betas, an off-policy rollout, ...). The grid gets an `arm` column (folders `.../optimizer=O/arm=A/seed=S/`),
  so the analysis keys every run by its arm. Then every block names an arm, and blocks that share a label share
  its keys. An arm's `optim.lr` / `optim.matrix_lr` win over the study's `lr:` table (lr by role: `lr` is the
  AdamW-trained rest of a Muon cell, `matrix_lr` its hidden matrices); an arms study has no `lrs` axis.
- **A cell config is the study's shared `cell` block plus the per-cell keys**: `recipe`, `optim.name`,
  `run.seed` and `model.path`, the model's `env_options` over `cell.env.options`, the cell's learning rate
  (`optim_lrs`: the grid's lr, else the study's `lr:` entry for its optimizer) and, when the warm start writes
  SPO's offline statistics, `rl.spo.offline_stats`. The schema forbids those keys (and the recipe-defining keys) in
  the shared block, because an explicit key overrides the recipe in the trainer (`trainer/recipes.py`): a shared
  `loss.tis_cap` would silently turn TIS on for the no-TIS recipes. The shared block's estimator sections
  (`rl.gigpo`, ...) reach only the cells of that estimator, which refuse another's.
- **A study file may name a `base` study** (`resolve_base`): its keys are deep-merged over the base's, so a new
  study holds only its differences.
- **`run.threads` comes from the rule's threads** (`resources.train.threads`), so the trainer uses exactly the
  cores the scheduler gave it.
- **Models**: a `preset` model is warm-started by the workflow and its cells load the warm-started policy; a
  `path` model is a local checkpoint used as is (paper scale). Cross-key rules the JSON schema cannot state
  (preset xor path, the path exists, a task file or game folder exists, a grid block names known models,
  group estimators have groups, band low <= high, the lr keys (`check_lrs`), a horizon study's `horizon`
  labels) are checked by `check_study`, which raises `StudyError` naming the key before any job starts.
- **Tables derived, not copied**: each recipe's optimizer and estimator come from `trainer.recipes`, the optimizer
  names from `trainer.optim.config` (`OptimConfig`), the presets from `trainer.policy.tiny`, the lr folder label
  from `trainer.analysis.cell_logs`. This module and those import no torch: building the DAG needs the trainer
  package but not torch.
"""

from __future__ import annotations

import copy
import os
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from trainer.config import (
    OFFLINE_STATS_FILE,
    ConfigError,
    EnvConfig,
    OptimConfig,
    TrainConfig,
    build_config,
    config_from_dict,
    sft_config_from_dict,
)
from trainer.environments.suite import family_config
from trainer.policy.tiny import TINY_PRESETS
from trainer.recipes import RECIPE_ESTIMATOR, RECIPE_OPTIMIZER, RECIPES
from trainer.rl.config import ESTIMATOR_SECTIONS, GROUP_ESTIMATORS, SECTION_CLASSES, SPO_ESTIMATORS

OPTIMIZERS: tuple[str, ...] = typing.get_args(typing.get_type_hints(OptimConfig)["name"])
"""The optim.name values a grid block may name (adam_high_lr: AdamW at Muon's learning rate)."""

GROUP_RECIPES: tuple[str, ...] = tuple(
    name for name, estimator in RECIPE_ESTIMATOR.items() if estimator in GROUP_ESTIMATORS
)
"""Recipes whose estimator compares a task's rollouts with each other: they need cell.rl.group_size >= 2."""

ARM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
"""An arm label as its folder spells it (`arm=LABEL`): no separators, no `=`."""

STUDY_LR_OPTIMIZERS = ("adam", "muon")
"""Keys of a study's `lr:` table. adam_high_lr cells run AdamW at Muon's rate: the table's `muon` entry."""

SFT_ROLLOUT_KEYS = ("max_turn_tokens", "max_episode_tokens", "temperature", "top_p")
"""The rollout settings the warm start uses (it measures its band by sampling as the RL rollouts do); the rest
would only make an unrelated rollout change retrain the base policy."""


class StudyError(ValueError):
    """A study config that passes the schema but breaks a cross-key rule; the message names the key."""


def lr_label(lr: float) -> str:
    """A learning rate as its cell folder spells it (`.../lr=L/`): the shortest scientific form that reads back as
    the same float ("3e-04", "2.5e-04", "1e-02"), so the analysis recovers the exact lr from the folder."""
    lr = float(lr)
    return next(text for text in (f"{lr:.{p}e}" for p in range(17)) if float(text) == lr)


def deep_merge(base: dict, over: dict) -> dict:
    """`over` merged into a copy of `base`: mappings merged key by key, lists and scalars replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_base(study: dict, root: str | Path = ".", source: str | Path | None = None) -> dict:
    """The study with its `base` study (a path relative to the repository root `root`) deep-merged under it,
    bases of bases first; `base` itself dropped. `source` is the study's own file, for messages and to catch a
    study that is its own base. StudyError naming the file when a base does not exist or the chain loops."""
    seen = [os.path.realpath(source)] if source is not None else []

    def resolve(data: dict, where: str) -> dict:
        if "base" not in data:
            return copy.deepcopy(data)
        name = data["base"]
        path = Path(root) / str(name)
        if not isinstance(name, str) or not path.is_file():
            raise StudyError(
                f"{where}: base: {name!r} is not a study file (a path relative to the repository root {str(root)!r})"
            )
        if os.path.realpath(path) in seen:
            raise StudyError(
                f"{where}: base: {name!r} loops back to a study already in the chain "
                f"({' -> '.join(str(s) for s in [source or '(study)', *chain])})"
            )
        seen.append(os.path.realpath(path))
        chain.append(name)
        try:
            base = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, yaml.YAMLError) as e:
            raise StudyError(f"{where}: base: {name!r} is not a readable YAML file: {e}") from None
        if not isinstance(base, dict):
            raise StudyError(
                f"{where}: base: {name!r} is {'empty' if base is None else 'not a mapping'}; a base "
                "study is a mapping of study keys"
            )
        return deep_merge(resolve(base, name), {k: v for k, v in data.items() if k != "base"})

    chain: list[str] = []
    return resolve(study, str(source) if source is not None else "study")


PATH_OPTIONS = ("tasks_file", "data_dir")
"""The `cell.env.options` keys that name local files or folders (besides `models.*.path`)."""


def _key_paths(mapping: dict, prefix: str = "") -> list[str]:
    """The dotted paths of a nested mapping's leaves (`{"loss": {"agg": ...}}` -> ["loss.agg"])."""
    paths = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        paths.extend(_key_paths(value, f"{path}.") if isinstance(value, dict) else [path])
    return paths


PER_CELL_KEYS: tuple[str, ...] = (
    "model.preset",
    "model.path",
    "optim.name",
    "run.seed",
    "run.threads",
    "rl.spo.offline_stats",
    *dict.fromkeys(path for recipe in RECIPES.values() for path in _key_paths(recipe)),
)
"""Trainer keys each cell sets itself, refused in the shared `cell` block: the model from `models`, the optimizer
and seed from the grid, the threads from `resources.train.threads`, SPO's offline statistics beside the warm-started
policy, and the keys a recipe defines (a shared `loss.tis_cap` would silently turn TIS on for the no-TIS recipes)."""

WARM_START_SET_KEYS = ("model", "env", "rollout", "threads")
"""SFTConfig keys the workflow sets per model (its preset, the cells' env and token limits, the job's threads)."""


def refuse_per_cell_keys(cell: dict, where: str, what: str) -> None:
    """StudyError naming the first key of `cell` (a shared block or an arm's) that each cell sets itself."""
    if "recipe" in cell:
        raise StudyError(f"{where}.recipe: each cell's recipe comes from the grid; remove it from {what}")
    given = set(_key_paths(cell))
    for path in PER_CELL_KEYS:
        if path in given or any(key.startswith(f"{path}.") for key in given):
            raise StudyError(
                f"{where}.{path}: each cell sets it (from the grid, `models`, `resources` or its recipe); remove it "
                f"from {what}"
            )


def check_blocks(study: dict) -> None:
    """Check the study's trainer blocks with the trainer's own types and ranges (trainer/config.py, the one
    definition of each knob): the shared `cell` block as a TrainConfig, `warm_start` as an SFTConfig, the grid's
    recipes, optimizers and presets against the trainer's tables, `analysis.collapse` as a CollapseCriterion.
    StudyError naming the key."""
    cell = study.get("cell", {})
    refuse_per_cell_keys(cell, "cell", "the shared block")
    try:
        build_config(TrainConfig, cell, "cell")
        warm_start = {k: v for k, v in study.get("warm_start", {}).items() if k != "allow_out_of_band"}
        for key in WARM_START_SET_KEYS:
            if key in warm_start:
                raise StudyError(f"warm_start.{key}: set per model by the workflow; remove it")
        sft_config_from_dict(warm_start, "warm_start")
    except ConfigError as e:
        raise StudyError(str(e)) from None
    for i, block in enumerate(study["grid"]):
        for recipe in block["recipes"]:
            if recipe not in RECIPES:
                raise StudyError(
                    f"grid[{i}].recipes: {recipe!r} is not a recipe of trainer/recipes.py RECIPES ({list(RECIPES)})"
                )
        optimizer = block.get("optimizer", "recipe")
        if optimizer not in ("recipe", *OPTIMIZERS):
            raise StudyError(
                f"grid[{i}].optimizer: {optimizer!r} is not 'recipe' (each recipe's own) or one of {list(OPTIMIZERS)}"
            )
    check_arms(study)
    for name, entry in study["models"].items():
        if entry.get("preset") is not None and entry["preset"] not in TINY_PRESETS:
            raise StudyError(
                f"models.{name}.preset: {entry['preset']!r} is not a tiny preset of "
                f"trainer/policy/tiny.py ({sorted(TINY_PRESETS)})"
            )
    from trainer.analysis.collapse import CollapseCriterion  # not at the top: trainer.analysis imports this module

    try:
        CollapseCriterion.from_dict(study.get("analysis", {}).get("collapse"))
    except (ValueError, TypeError) as e:
        raise StudyError(f"analysis.collapse: {e}") from None


def check_axis(study: dict, key: str, kind: str, axis: str, needed: str, instead: str = "") -> list[int]:
    """The indices of the grid blocks that give `key` (an axis: `lrs`, `arm`), checked: every block or none, and
    only, and always, in a `study: kind`. StudyError naming the key (`needed` when the kind lacks it, `instead`
    says what to do in another kind)."""
    blocks, current = study["grid"], study.get("study", "main")
    with_key = [i for i, block in enumerate(blocks) if key in block]
    if with_key and current != kind:
        raise StudyError(
            f"grid[{with_key[0]}].{key}: only a `study: {kind}` has {axis} (the {current} analysis has "
            f"none){'; ' + instead if instead else ''}"
        )
    if current == kind and not with_key:
        raise StudyError(f"grid: {needed}")
    if with_key and len(with_key) < len(blocks):
        i = next(i for i in range(len(blocks)) if i not in with_key)
        raise StudyError(
            f"grid[{i}].{key}: missing; grid[{with_key[0]}] gives `{key}`, so the study has {axis} and "
            f"every block must give its own"
        )
    return with_key


def check_arms(study: dict) -> None:
    """The arm keys: every block names an `arm` or none does; a label is a folder name; a block's `cell` only
    with an arm, holding no per-cell key and only knobs the trainer knows (checked merged over the shared block);
    blocks that share a label share its `cell` (an arms study has no `lrs` axis). StudyError naming the key."""
    blocks = study["grid"]
    for i, block in enumerate(blocks):
        if "cell" in block and "arm" not in block:
            raise StudyError(f"grid[{i}].cell: a block's own trainer keys make it an arm; name it with `arm`")
    with_arm = check_axis(
        study, "arm", "arms", "arms", "a study of arms names one in every block (`arm`, and its trainer keys in `cell`)"
    )
    seen: dict[str, tuple[int, dict]] = {}
    for i in with_arm:
        block = blocks[i]
        label, own = block["arm"], block.get("cell") or {}
        if not isinstance(label, str):
            raise StudyError(
                f"grid[{i}].arm: {label!r} is a {type(label).__name__}, not a label: YAML read it as "
                f'one; quote it (arm: "{label}")'
            )
        if not re.fullmatch(ARM_PATTERN, label):
            raise StudyError(f"grid[{i}].arm: {label!r} is not a folder label (letters, digits, _ . + -)")
        if label in seen and seen[label][1] != own:
            raise StudyError(
                f"grid[{i}].cell: arm {label!r} is also grid[{seen[label][0]}]'s with other keys; "
                f"one label, one trainer variant: rename one of them"
            )
        seen[label] = (i, own)
        refuse_per_cell_keys(own, f"grid[{i}].cell", "the arm")
        try:
            build_config(TrainConfig, deep_merge(study.get("cell", {}), own), f"grid[{i}].cell")
        except ConfigError as e:
            raise StudyError(str(e)) from None


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


def check_study(study: dict, root: str | Path = ".") -> None:
    """Raise StudyError for what the schema does not check: the trainer blocks (`check_blocks`) and the rules
    across keys. Relative paths are relative to `root` (the repository
    root: the study files' paths are written from there, whatever the study's `workdir`)."""
    root = Path(root)
    workdir = str(study.get("workdir", "."))
    # judged on the path as written: a folder of the checkout that is a symlink to another disk (often studies/)
    # is the user's choice, not an escape
    outside = os.path.isabs(workdir) or os.path.normpath(workdir).split(os.sep)[0] == ".."
    if not study.get("external_workdir", False) and outside:
        raise StudyError(
            f"workdir: {workdir!r} is outside the repository {str(root)!r}; a study's results "
            "stay in the checkout unless the study says `external_workdir: true`"
        )
    check_blocks(study)
    for name, entry in study["models"].items():
        kinds = [key for key in ("preset", "path", "policy") if entry.get(key) is not None]
        if len(kinds) != 1:
            raise StudyError(
                f"models.{name}: give exactly one of `preset` (a tiny model the workflow "
                f"warm-starts), `path` (a local checkpoint) or `policy` (another model's warm-started "
                f"policy), got {entry!r}"
            )
        shared = entry.get("policy")
        if shared is not None and study["models"].get(shared, {}).get("preset") is None:
            raise StudyError(
                f"models.{name}.policy: {shared!r} is not a model of this study with a `preset` "
                f"(a warm-started policy to share)"
            )
        if entry.get("warm_start_seed") is not None and entry.get("preset") is None:
            raise StudyError(
                f"models.{name}.warm_start_seed: only a model with a `preset` is warm-started "
                f"(this one has {kinds[0]!r})"
            )
        if entry.get("path") is not None and not (root / entry["path"]).exists():
            raise StudyError(
                f"models.{name}.path: {entry['path']!r} does not exist "
                f"(paper scale needs the checkpoint on a local path)"
            )
    for i, block in enumerate(study["grid"]):
        for model in block.get("models", []):
            if model not in study["models"]:
                raise StudyError(
                    f"grid[{i}].models: {model!r} is not a model of this study (models: {sorted(study['models'])})"
                )
    options = study.get("cell", {}).get("env", {}).get("options", {})
    for key in PATH_OPTIONS:
        if options.get(key) and not (root / options[key]).exists():
            raise StudyError(
                f"cell.env.options.{key}: {options[key]!r} does not exist (paper-scale tasks and "
                f"games are read from local files; nothing is downloaded)"
            )
    rollout = study.get("cell", {}).get("rollout", {})
    train = study.get("resources", {}).get("train", {})
    if rollout.get("server") and rollout.get("engine") == "vllm":
        gpus, procs = train.get("gpu", 0), train.get("processes", 1)
        if gpus < procs + 1:
            raise StudyError(
                f"resources.train.gpu: {gpus} GPUs for {procs} trainer process(es) and a vLLM rollout "
                f"server (cell.rollout.server), which takes a GPU of its own: ask for {procs + 1}"
            )
    recipes = {r for block in study["grid"] for r in block["recipes"]}
    if study.get("study") == "companion":
        for key, section in (("eval_every", "run"), ("eval_tasks", "env")):
            if study.get("cell", {}).get(section, {}).get(key, 1) < 1:
                raise StudyError(
                    f"cell.{section}.{key}: the companion study's headline numbers are validation "
                    f"success, so it must validate (>= 1), got {study['cell'][section][key]}"
                )
        if recipes - set(GROUP_RECIPES):
            raise StudyError(
                f"grid: the companion study's analysis compares the estimators {list(GROUP_RECIPES)}; "
                f"recipes {sorted(recipes - set(GROUP_RECIPES))} belong to the main study (study: main)"
            )
    check_lrs(study)
    grid_models = list(dict.fromkeys(m for block in study["grid"] for m in block.get("models") or study["models"]))
    for model in grid_models:
        options = model_env_options(study, model)
        for key in PATH_OPTIONS:
            if key in study["models"][model].get("env_options", {}) and not (root / options[key]).exists():
                raise StudyError(f"models.{model}.env_options.{key}: {options[key]!r} does not exist")
    if study.get("study") == "horizon":
        families: dict[tuple, str] = {}
        for model in grid_models:
            horizon = study["models"][model].get("horizon")
            if horizon is None:
                raise StudyError(
                    f"models.{model}.horizon: a horizon study labels every model of its grid with "
                    f"its horizon (a number, e.g. the task's bug count)"
                )
            family = (paper_names(study)[model], horizon)
            if family in families:
                raise StudyError(
                    f"models.{model}.horizon: {families[family]} has the same paper_name and horizon "
                    f"{horizon}; the horizon figure joins a family's models into one line"
                )
            families[family] = model


def check_lrs(study: dict) -> None:
    """The learning-rate keys: `lrs` positive, on every block or none, only in a stability study, never on
    adam_high_lr; the `lr:` table names adam or muon; a shared `cell.optim.matrix_lr` cannot stand beside them."""
    blocks = study["grid"]
    table = study.get("lr") or {}
    for name, value in table.items():
        if name not in STUDY_LR_OPTIMIZERS:
            raise StudyError(
                f"lr.{name}: the lr table names {list(STUDY_LR_OPTIMIZERS)} (adam_high_lr cells run "
                f"at the `muon` entry)"
            )
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise StudyError(f"lr.{name}: a learning rate must be a number > 0, got {value!r}")
    with_lrs = [i for i, block in enumerate(blocks) if "lrs" in block]
    for i in with_lrs:
        for value in blocks[i]["lrs"]:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise StudyError(f"grid[{i}].lrs: learning rates must be numbers > 0, got {value!r}")
        if blocks[i].get("optimizer") == "adam_high_lr":
            raise StudyError(
                f"grid[{i}].lrs: adam_high_lr runs AdamW at Muon's learning rate; an lr sweep of "
                f"AdamW is `optimizer: adam`"
            )
    for i, block in enumerate(blocks):
        own_optim = (block.get("cell") or {}).get("optim") or {}
        if block.get("optimizer") == "adam_high_lr" and "muon" not in table and "lr" not in own_optim:
            raise StudyError(
                f"grid[{i}].optimizer: adam_high_lr runs AdamW at the Muon cells' learning rate; give that rate "
                f"in the study's `lr.muon`"
            )
    check_axis(
        study,
        "lrs",
        "stability",
        "an lr axis",
        "a stability study sweeps learning rates: give `lrs` in every block",
        "set one lr per optimizer with the top-level `lr:` table",
    )
    sets_muon = "muon" in table or any(
        block.get("optimizer") == "muon"
        or (
            block.get("optimizer", "recipe") == "recipe"
            and any(RECIPE_OPTIMIZER[r] == "muon" for r in block["recipes"])
        )
        for block in (blocks[i] for i in with_lrs)
    )
    if sets_muon and study.get("cell", {}).get("optim", {}).get("matrix_lr") is not None:
        raise StudyError(
            "cell.optim.matrix_lr: the study sets the lr of its Muon cells (`lrs` or `lr.muon`), which "
            "is the lr of Muon's hidden matrices too (match_rms_adamw); a shared matrix_lr would override "
            "it: remove it or set it to null"
        )


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
                optimizer = block.get("optimizer", "recipe")
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


def optim_lrs(study: dict, optimizer: str, lr: float | None = None) -> dict:
    """The optim keys a cell's learning rate sets: `lr` = the grid's lr, else the study's `lr:` entry for the
    optimizer (Muon's covers its hidden matrices and the AdamW rest: trainer optim.matrix_lr defaults to optim.lr);
    an adam_high_lr cell (AdamW at Muon's lr) gets the `lr.muon` entry. {} if neither."""
    table = study.get("lr") or {}
    if optimizer == "adam_high_lr":
        return {"lr": float(table["muon"])} if "muon" in table else {}
    value = lr if lr is not None else table.get(optimizer)
    return {} if value is None else {"lr": float(value)}


def model_env_options(study: dict, model: str) -> dict:
    """`cell.env.options` with the model's own `env_options` merged over it (key by key)."""
    shared = study.get("cell", {}).get("env", {}).get("options", {})
    return copy.deepcopy({**shared, **study["models"][model].get("env_options", {})})


def model_env(study: dict, model: str) -> dict:
    """The `env` section of the model's cells and warm start: the shared one with `model_env_options`."""
    env = copy.deepcopy(study.get("cell", {}).get("env", {}))
    options = model_env_options(study, model)
    return {**env, "options": options} if options or "options" in env else env


def offline_stats_path(study: dict, model: str, model_path: str) -> str | None:
    """Where a cell of `model` reads SPO's offline statistics: beside its warm-started policy when the warm start
    writes them (`warm_start.offline_samples > 0`), relative as `model_path` is; None otherwise, and for a model that
    shares another's policy (`policy`): that offline pass played the other model's tasks."""
    if study.get("warm_start", {}).get("offline_samples", 0) > 0 and study["models"][model].get("preset"):
        return f"{model_path}/{OFFLINE_STATS_FILE}"
    return None


def cell_config(
    study: dict,
    model: str,
    recipe: str,
    optimizer: str,
    seed: int,
    model_path: str,
    threads: int,
    lr: float | None = None,
    arm: str | None = None,
) -> dict:
    """The trainer config of one cell: the shared `cell` block with its arm's keys merged over it, plus the cell's
    own keys (`lr`: its grid lr; an arm's own optim.lr / matrix_lr win over the study's `lr:` table)."""
    own = arm_cell(study, arm)
    shared = deep_merge(study.get("cell", {}), own)
    own_lrs = {k: v for k, v in (own.get("optim") or {}).items() if k in ("lr", "matrix_lr")}
    cell = {"recipe": recipe}
    cell["model"] = {**shared.pop("model", {}), "path": model_path}
    cell["optim"] = {**shared.pop("optim", {}), "name": optimizer, **optim_lrs(study, optimizer, lr), **own_lrs}
    run = {**shared.pop("run", {}), "seed": int(seed), "threads": int(threads)}
    if "env" in shared or study["models"][model].get("env_options"):
        shared["env"] = model_env(study, model)  # in place: a cell.yaml without env_options reads as before
    estimator = RECIPE_ESTIMATOR[recipe]
    if "rl" in shared:  # the study's settings of the other estimators are not this cell's
        others = set(SECTION_CLASSES) - set(ESTIMATOR_SECTIONS[estimator])
        shared["rl"] = {k: v for k, v in shared["rl"].items() if k not in others}
    offline = offline_stats_path(study, model, model_path)
    if offline is not None and estimator in SPO_ESTIMATORS:
        rl = shared.setdefault("rl", {})
        rl["spo"] = {**rl.get("spo", {}), "offline_stats": offline}
    cell.update(shared)  # env, rl, rollout, ... as given
    cell["run"] = run
    return cell


def warm_start_config(study: dict, model: str, threads: int) -> dict:
    """The `python -m trainer sft` config of one model family: its preset, the cells' env (with the model's
    env_options) and token limits; the model's `warm_start_seed`, where it has one, seeds both the warm start
    (demonstrations, their order, evaluations) and the tiny model's initialisation."""
    shared = study.get("cell", {})
    options = {k: v for k, v in study.get("warm_start", {}).items() if k != "allow_out_of_band"}
    model_keys = {k: v for k, v in shared.get("model", {}).items() if k in ("dtype", "init_seed")}
    seed = study["models"][model].get("warm_start_seed")
    if seed is not None:
        options["seed"], model_keys["init_seed"] = seed, seed
    rollout = {k: v for k, v in shared.get("rollout", {}).items() if k in SFT_ROLLOUT_KEYS}
    return {
        "model": {"preset": study["models"][model]["preset"], **model_keys},
        "env": model_env(study, model),
        "rollout": rollout,
        **options,
        "threads": int(threads),
    }


def check_env_options(study: dict, root: str | Path) -> None:
    """Raise StudyError for an unknown `cell.env.options` key or a value its environment family rejects, as
    merged with each model's `env_options`.

    The schema leaves that block free-form (each family owns its keys), so the family's own config dataclass
    checks it, imported from the trainer at `root`: torch-free, so the DAG still needs no torch."""
    env = study.get("cell", {}).get("env", {})
    name = env.get("name", EnvConfig.name)
    for model, entry in study["models"].items():
        try:
            family_config(name, model_env_options(study, model))
        except (ValueError, TypeError) as e:
            where = "cell.env.options" + (f" with models.{model}.env_options" if entry.get("env_options") else "")
            raise StudyError(f"{where}: {e}") from None


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
    for options in [
        out.get("cell", {}).get("env", {}).get("options", {}),
        *(entry.get("env_options", {}) for entry in out["models"].values()),
    ]:
        for key in PATH_OPTIONS:
            if options.get(key):
                options[key] = rebase(options[key])
    return out


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


@dataclass(frozen=True)
class Cell:
    """One cell of a study: its key, its folder under results/cells and its trainer config (cell.yaml)."""

    key: CellKey
    folder: str
    config: dict


class Study:
    """A study file loaded once (`Study.load`): its keys resolved, checked, rebased to its workdir, its grid built,
    every cell checked as the trainer will read it. The workflow (workflow/rules/common.smk) reads everything from
    this object; the functions above are its parts and take the study's mapping."""

    def __init__(self, data: dict, root: str | Path = "."):
        self.data = data
        """The study's mapping (base merged, schema defaults set, paths from its workdir)."""
        self.root = Path(root)
        self.grid = grid_frame(data)
        self.keys = [CellKey.of(row) for row in self.grid.itertuples(index=False)]
        self.warm_started = warm_started_models(data, self.grid)
        """Models whose warm-started policy the grid's cells load (the warm-start rule's models)."""

    @classmethod
    def load(
        cls,
        data: dict,
        root: str | Path = ".",
        source: str | Path | None = None,
        validate: Callable[[dict], None] | None = None,
    ) -> Study:
        """The study of a study file's mapping: `base` merged (`resolve_base`), `validate` (the schema's check,
        which sets its defaults), the rules across keys (`check_study`, `check_env_options`), the paths rebased
        from `root` to the study's workdir, then every cell checked (`check_cells`). StudyError naming the key."""
        study = resolve_base(data, root=root, source=source)
        if validate is not None:
            validate(study)
        check_study(study, root=root)
        check_env_options(study, root=root)
        workdir = os.path.join(root, study.get("workdir", "."))
        loaded = cls(paths_from_workdir(study, root, workdir), root)
        loaded.check_cells()
        return loaded

    @property
    def threads(self) -> int:
        """Threads of a train job (`resources.train.threads`), which each cell's trainer uses."""
        return int(self.data.get("resources", {}).get("train", {}).get("threads", 1))

    def model_path(self, model: str) -> str:
        """Where a cell of `model` loads its base policy: the warm-started policy (its own, or the one its `policy`
        key names), or the study's checkpoint path."""
        entry = self.data["models"][model]
        if entry.get("path") is not None:
            return entry["path"]
        return f"results/policies/{policy_model(self.data, model)}"

    def cell_config(self, key: CellKey, model_path: str | None = None) -> dict:
        """The trainer config of one cell (its cell.yaml), loading its model from `model_path` (default: its own)."""
        return cell_config(
            self.data,
            key.model,
            key.recipe,
            key.optimizer,
            key.seed,
            self.model_path(key.model) if model_path is None else model_path,
            self.threads,
            lr=None if key.lr is None else float(key.lr),
            arm=key.arm,
        )

    def cells(self) -> Iterator[Cell]:
        """Every cell of the grid, in grid order."""
        for key in self.keys:
            yield Cell(key, key.folder, self.cell_config(key))

    def warm_start_config(self, model: str) -> dict:
        """The `python -m trainer sft` config of a warm-started model."""
        return warm_start_config(
            self.data, model, threads=self.data.get("resources", {}).get("warm_start", {}).get("threads", 1)
        )

    def check_cells(self) -> None:
        """Raise StudyError for a cell the trainer would refuse (its cross-key rules: batch size a multiple of the
        group size, vLLM with a checkpoint, ...), naming the cell, before any job starts. The model path is
        checked by `check_study`; here it stands in as ".", since a warm-started policy does not exist yet, and so
        the offline statistics the warm start will write beside it are left out."""
        for key in self.keys:
            cell = self.cell_config(key, model_path=".")
            cell.get("rl", {}).get("spo", {}).pop("offline_stats", None)
            try:
                config_from_dict(cell)
            except ConfigError as e:
                raise StudyError(f"cell (as {key.describe()} trains it): {e}") from None


def yaml_text(data: dict, header: str = "") -> str:
    """`data` as YAML (keys in insertion order) with an optional comment header."""
    return "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(data, sort_keys=False)


def write_yaml(data: dict, path: str | Path, header: str = "") -> None:
    """Write `yaml_text(data, header)` to `path`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml_text(data, header))
