"""The study file: its `base` merged under it, its keys as typed sections (`StudyConfig` and the sections it
composes, each with its default, range and rules) and `check_study`, which refuses a bad file naming the key."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer.analysis.config import AnalysisConfig
from trainer.analysis.kinds import STUDY_KINDS
from trainer.analysis.registration import Preregistration
from trainer.config import (
    ConfigError,
    EnvConfig,
    OptimConfig,
    TrainConfig,
    WarmStartConfig,
    build_config,
)
from trainer.environments.suite import family_config
from trainer.knobs import Section, knob
from trainer.policy.templates import find_chat_template
from trainer.policy.tiny import TINY_PRESETS
from trainer.recipes import RECIPE_ESTIMATOR, RECIPE_OPTIMIZER, RECIPES
from trainer.rl.config import GROUP_ESTIMATORS

OPTIMIZERS: tuple[str, ...] = typing.get_args(typing.get_type_hints(OptimConfig)["name"])
"""The optim.name values a grid block may name (adam_high_lr: AdamW at Muon's learning rate)."""

GROUP_RECIPES: tuple[str, ...] = tuple(
    name for name, estimator in RECIPE_ESTIMATOR.items() if estimator in GROUP_ESTIMATORS
)
"""Recipes whose estimator compares a task's rollouts with each other: they need cell.rl.group_size >= 2."""

ARM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
"""An arm label as its folder spells it (`arm=LABEL`): no separators, no `=`."""

MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A model name as its folder spells it (`model=NAME`)."""

WARM_START_ROLLOUT_KEYS = ("max_turn_tokens", "max_episode_tokens", "temperature", "top_p")
"""The rollout settings the warm start uses (it measures its band by sampling as the RL rollouts do); the rest
would only make an unrelated rollout change retrain the base policy."""


class StudyError(ValueError):
    """A study file the harness refuses before any job starts (a key, type, range or rule across keys); the message
    names the key."""


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
    "recipe",
    "model.preset",
    "model.path",
    "optim.name",
    "run.seed",
    "run.threads",
    "rl.spo.offline_stats",
    *dict.fromkeys(path for recipe in RECIPES.values() for path in _key_paths(recipe)),
)
"""Trainer keys each cell sets itself, refused in the shared `cell` block: its recipe, the model from `models`, the optimizer
and seed from the grid, the threads from `resources.train.threads`, SPO's offline statistics beside the warm-started
policy, and the keys a recipe defines (a shared `loss.tis_cap` would silently turn TIS on for the no-TIS recipes)."""

WARM_START_SET_KEYS = ("model", "env", "rollout", "threads")
"""WarmStartConfig keys the workflow sets per model (its preset, the cells' env and token limits, the job's threads)."""


def per_cell_key(cell: dict) -> tuple[str, str] | None:
    """The first key of `cell` (a shared block or an arm's) that each cell sets itself (`PER_CELL_KEYS`) and where
    a cell takes it from, or None."""
    given = set(_key_paths(cell))
    for path in PER_CELL_KEYS:
        if path in given or any(key.startswith(f"{path}.") for key in given):
            source = "the grid" if path == "recipe" else "the grid, `models`, `resources` or its recipe"
            return path, f"each cell sets it (from {source})"
    return None


@dataclass
class ModelEntry(Section):
    """One entry of `models:` (by the name used in results folders, model=NAME). Exactly one of `preset` (embedded
    scale: a tiny architecture that the workflow warm-starts), `path` (paper scale: a local checkpoint) or
    `policy` (another model's warm-started policy)."""

    blank_is_absent = True

    paper_name: str | None = None
    """The paper's name of this family (MiniCPM5-2B, Qwen3.5-4B); tables and figures use it."""
    preset: str | None = None
    """A tiny architecture preset of trainer/policy/tiny.py TINY_PRESETS."""
    path: str | None = None
    """A local Hugging Face checkpoint directory (relative to the repository root or absolute)."""
    policy: str | None = None
    """Another model of the study (one with a `preset`) whose warm-started policy this model's cells start from, on
    this model's own environment (`env_options`): the same base policy on other tasks, e.g. the horizon study's
    longer tasks. Its cells get no offline statistics (that pass played the other model's tasks)."""
    env_options: dict | None = None
    """Environment options of this model's cells and warm start, merged key by key over cell.env.options (checked
    by the environment family as merged): e.g. {min_bugs: 4, max_bugs: 4} for a family that trains on longer
    tasks. Two entries with the same preset and different env_options are two warm-started families."""
    model_options: dict | None = None
    """Keys of trainer/config.py's `model` section for this model's cells, over cell.model: how its checkpoint
    loads (`trust_remote_code`, `chat_template`, `template_options`), which differ between families. Not
    `preset` or `path`, which this entry gives."""
    warm_start: dict | None = None
    """Keys of the `warm_start` section for this model's warm start, merged key by key over the study's: e.g.
    {optim: {name: adam, matrix_lr: 3.0e-3}} for an AdamW-trained base policy beside Muon-trained ones, so that
    the warm start's optimizer is a factor of the study (a `preset` model only; not the keys the workflow sets)."""
    warm_start_seed: int | None = knob(None, ge=0)
    """Seed of this model's warm start and of its tiny model's initialisation (a `preset` model only; default:
    warm_start.seed and cell.model.init_seed): several models with one preset and different seeds are several
    base policies of one family, for a study of how far a result depends on the base policy."""
    horizon: int | float | None = knob(None, gt=0)
    """The task length this model's cells train on (a `study: horizon` needs it on every model of its grid; the
    horizon figure's x axis, log2). Models with the same paper_name form one family across horizons."""

    def validate(self) -> None:
        super().validate()
        kinds = [key for key in ("preset", "path", "policy") if getattr(self, key) is not None]
        if len(kinds) != 1:
            given = {k: getattr(self, k) for k in ("preset", "path", "policy") if getattr(self, k) is not None}
            self.refuse(
                None,
                "give exactly one of `preset` (a tiny model the workflow warm-starts), `path` (a local checkpoint) "
                f"or `policy` (another model's warm-started policy), got {given or 'none'}",
            )
        if self.preset is not None and self.preset not in TINY_PRESETS:
            self.refuse(
                "preset", f"{self.preset!r} is not a tiny preset of trainer/policy/tiny.py ({sorted(TINY_PRESETS)})"
            )
        for key in ("preset", "path"):
            if key in (self.model_options or {}):
                self.refuse(f"model_options.{key}", f"give the model's {key} as the entry's own `{key}`")
        for key in ("warm_start_seed", "warm_start"):
            if getattr(self, key) is not None and self.preset is None:
                self.refuse(key, f"only a model with a `preset` is warm-started (this one has {kinds[0]!r})")
        for key in set(self.warm_start or {}) & {*WARM_START_SET_KEYS, "seed", "allow_out_of_band"}:
            self.refuse(f"warm_start.{key}", "set for the whole study or by the workflow, not per model")


@dataclass
class GridBlock(Section):
    """One block of `grid:`: these recipes x these seeds, on this optimizer, for these models (and, in a stability
    study, these lrs; in an arms study, this arm). The grid is the blocks' concatenation without duplicates."""

    blank_is_absent = True

    recipes: tuple[str, ...]
    """Recipes of trainer/recipes.py RECIPES: the paper's Figure-2 recipes, or the companion's advantage
    estimators grpo, gigpo, graphgpo (they need cell.rl.group_size >= 2)."""
    seeds: tuple[int, ...] = knob(ge=0)
    """Training seeds (run.seed); each is one cell."""
    name: str | None = None
    """What the block is for (documentation only)."""
    models: tuple[str, ...] | None = None
    """Models of this block (default: every model of the study)."""
    optimizer: str = "recipe"
    """`recipe`: each recipe's own optimizer; `adam`, `muon` or `adam_high_lr` (AdamW at Muon's learning rate, the
    companion's control): every recipe on that one."""
    lrs: tuple[float, ...] | None = knob(None, gt=0)
    """Learning rates (optim.lr; for Muon cells also its hidden matrices'), each one cell per seed: the stability
    study's lr axis. When a block gives `lrs`, every block must, and the cells live in
    results/cells/model=M/recipe=R/optimizer=O/lr=L/seed=S/ (L as 3e-04); only `study: stability`, and not on
    adam_high_lr."""
    arm: str | None = None
    """A label for the trainer variant this block runs (the decisive comparisons' arms): its cells live in
    results/cells/model=M/recipe=R/optimizer=O/arm=A/seed=S/ and the analysis keys every run by it. When a block
    names an arm, every block must; blocks sharing a label share its `cell`."""
    cell: dict | None = None
    """The arm's own trainer keys, deep-merged over the shared `cell` block for this block's cells: an lr by role
    (optim.lr for a Muon cell's AdamW-trained embeddings, head and norms, optim.matrix_lr for its hidden matrices;
    they win over the study's `lr`), AdamW's betas, an off-policy rollout, ... Only with `arm`; the per-cell keys
    are refused here as in `cell`."""

    def validate(self) -> None:
        super().validate()
        for key in ("recipes", "seeds", "models", "lrs"):
            if getattr(self, key) is not None and not getattr(self, key):
                self.refuse(key, "an empty list; give at least one")
        for recipe in self.recipes:
            if recipe not in RECIPES:
                self.refuse("recipes", f"{recipe!r} is not a recipe of trainer/recipes.py RECIPES ({list(RECIPES)})")
        if self.optimizer not in ("recipe", *OPTIMIZERS):
            self.refuse(
                "optimizer", f"{self.optimizer!r} is not 'recipe' (each recipe's own) or one of {list(OPTIMIZERS)}"
            )
        if self.lrs is not None and self.optimizer == "adam_high_lr":
            self.refuse(
                "lrs", "adam_high_lr runs AdamW at Muon's learning rate; an lr sweep of AdamW is `optimizer: adam`"
            )
        if self.cell is not None and self.arm is None:
            self.refuse("cell", "a block's own trainer keys make it an arm; name it with `arm`")
        if self.arm is not None and not re.fullmatch(ARM_PATTERN, self.arm):
            self.refuse("arm", f"{self.arm!r} is not a folder label (letters, digits, _ . + -)")
        per_cell = per_cell_key(self.cell or {})
        if per_cell is not None:
            self.refuse(f"cell.{per_cell[0]}", f"{per_cell[1]}; remove it from the arm")


@dataclass
class LrTable(Section):
    """The study's `lr:` table, the learning rate of each optimizer's cells (optim.lr): the lrs a stability study
    selected. `muon` is the rate of Muon's hidden matrices and of the AdamW rest alike (optim.matrix_lr defaults to
    optim.lr; under match_rms_adamw one lr is one update RMS); adam_high_lr cells (AdamW at Muon's lr) run at the
    `muon` entry. A grid block's `lrs` and an arm's own rates win over this table."""

    blank_is_absent = True

    adam: float | None = knob(None, gt=0)
    muon: float | None = knob(None, gt=0)


@dataclass
class JobResources(Section):
    """Scheduler resources of one compute rule (SLURM --cpus-per-task, --mem, --time, --gpus)."""

    blank_is_absent = True

    threads: int = knob(1, ge=1)
    """Cores of one job (also the trainer's torch threads)."""
    mem_mb: int = knob(4000, ge=100)
    """Memory of one job in MB."""
    runtime: int = knob(120, ge=1)
    """Wall-clock limit of one job in minutes."""
    gpu: int = knob(0, ge=0)
    """GPUs of one job on one node (0 on CPU); with nodes > 1, GPUs per node."""
    processes: int = knob(1, ge=1)
    """Trainer processes per node (torchrun's --nproc-per-node; one per GPU): above 1, or with nodes above 1, the
    cell's update is sharded with FSDP2 over all of them (trainer/distributed.py). Each uses `threads` cores."""
    nodes: int = knob(1, ge=1)
    """Nodes of one job: above 1, torchrun runs on each node under `srun` and the processes meet at the first node
    (c10d rendezvous). Train jobs only."""
    exclusive: bool = False
    """Whole nodes for one job (SLURM --exclusive): no other job shares their CPUs, memory or network. Train jobs
    only."""


@dataclass
class Resources(Section):
    """`resources:` of the two compute rules."""

    blank_is_absent = True

    train: JobResources = field(default_factory=JobResources)
    warm_start: JobResources = field(default_factory=JobResources)


@dataclass
class PreflightConfig(Section):
    """`preflight:` of a study whose cells play R2E-Gym-style tasks in Docker (env `swe`, `backend: docker`): every
    cell waits for `snakemake preflight` (trainer/environments/swe/preflight.py), a CPU job that pulls the task file's
    images and grades the first rows of each repository, their own fix and no change, through the real sandbox
    and grader with the cells' settings; the study stops there when too few fixes grade 1."""

    blank_is_absent = True

    min_gold_share: float = knob(0.9, ge=0, le=1)
    """The study starts only when at least this share of the sampled rows grade their own fix 1."""
    rows_per_repository: int = knob(2, ge=1)
    """Rows graded per repository (the first ones of the task file)."""
    workers: int = knob(4, ge=1)
    """Rows graded (and images pulled) side by side: the job's threads."""
    mem_mb: int = knob(8000, ge=100)
    runtime: int = knob(120, ge=1)
    """Minutes (SLURM's runtime)."""


@dataclass
class KeepConfig(Section):
    """`keep:` what a finished cell leaves beside its logs; its working checkpoints are removed either way."""

    blank_is_absent = True

    policy: bool = True
    """The final policy as a Hugging Face model directory (weights, tokenizer, chat template): CELL/policy/, which
    `python -m trainer eval`, `model.path` and vLLM load as it is. A few MB for a tiny model, ~16 GB for a 4B
    model in float32."""
    checkpoint: bool = False
    """The run's state after its last update (weights and optimizer state, as `run.checkpoint_format` writes it):
    CELL/last_checkpoint/, which `python -m trainer export` reads; about three times the policy with AdamW."""


@dataclass
class TrackersConfig(Section):
    """`trackers:` where each cell's metrics also go, beside its Parquet logs (trainer/logs/trackers.py): the study
    file's name is the runs' group, the cell's folder their name. Turning one on changes the train jobs' command,
    which Snakemake's default rerun triggers count: set it before a study runs, or add `--rerun-triggers mtime`."""

    blank_is_absent = True

    tensorboard: bool = False
    """Event files in CELL/tensorboard/ (`tensorboard --logdir <workdir>/results/cells`)."""
    wandb: bool = False
    """A Weights & Biases run, offline (CELL/wandb/, `wandb sync` uploads it) unless WANDB_API_KEY is set."""


@dataclass
class StudyConfig(Section):
    """A study file's keys (its `base` merged first): which models, which cells, the trainer settings shared by
    every cell, the warm start, job resources and analysis settings. Built by `check_study` before any job starts;
    each section checks its own keys, this class the rules across them. The trainer's blocks (`cell`, a grid
    block's `cell`, `warm_start`) are checked by the trainer's own sections (trainer/config.py), which define their
    keys: this class does not repeat them."""

    blank_is_absent = True

    models: dict[str, ModelEntry]
    """Model families by the name used in results folders (model=NAME)."""
    grid: tuple[GridBlock, ...]
    """Blocks of cells; the grid is their concatenation without duplicates."""
    workdir: str = "."
    """Folder that holds this study's results/ and figures/, relative to the repository root (the default study:
    the root itself). Studies in different folders never overwrite each other's warm starts, cells or figures."""
    external_workdir: bool = False
    """Allow a `workdir` outside the repository (absolute, or leading out of it with '..')."""
    study: str = "main"
    """Which analysis the study gets: one of trainer/analysis/kinds.py STUDY_KINDS (`main`: the main paper's
    figures; `companion`: the companion's validation curves and bars; `stability`: an lr sweep, every block gives
    `lrs`; `horizon`: one model per task length, each with a `horizon`; `arms`: the decisive comparisons, every
    block names an `arm`)."""
    lr: LrTable | None = None
    """The learning rate of each optimizer's cells (`LrTable`)."""
    cell: dict = field(default_factory=dict)
    """Trainer settings shared by every cell: a TrainConfig of trainer/config.py, whose sections define every key.
    Not here, because each cell sets them (`PER_CELL_KEYS`): recipe, model.preset/path, optim.name, run.seed,
    run.threads, rl.spo.offline_stats and the keys a recipe defines. The estimator sections (rl.spo, rl.gigpo,
    ...) reach only the cells of that estimator; a model's env_options and the study's lrs are merged per cell."""
    warm_start: dict = field(default_factory=dict)
    """The supervised warm start of `preset` models: an WarmStartConfig of trainer/config.py without model, env, rollout
    and threads (from the model entry, the `cell` block and resources.warm_start), plus `allow_out_of_band` (keep
    a base policy whose held-out success missed the band; otherwise the rule fails)."""
    resources: Resources = field(default_factory=Resources)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    keep: KeepConfig = field(default_factory=KeepConfig)
    trackers: TrackersConfig = field(default_factory=TrackersConfig)
    preregistration: Preregistration | None = None
    """What the study claims before it runs (trainer/analysis/registration.py): a `study: arms` only; its summary
    judges each hypothesis against its statement."""

    def validate(self) -> None:
        super().validate()
        # judged on the path as written: a folder of the checkout that is a symlink to another disk (often
        # studies/) is the user's choice, not an escape
        outside = os.path.isabs(self.workdir) or os.path.normpath(self.workdir).split(os.sep)[0] == ".."
        if outside and not self.external_workdir:
            self.refuse(
                "workdir",
                f"{self.workdir!r} is outside the repository; a study's results stay in the checkout unless the "
                "study says `external_workdir: true`",
            )
        if self.study not in STUDY_KINDS:
            self.refuse("study", f"{self.study!r} is not one of {list(STUDY_KINDS)}")
        if not self.models:
            self.refuse("models", "name at least one model")
        if not self.grid:
            self.refuse("grid", "give at least one block")
        self._check_trainer_blocks()
        self._check_models()
        self._check_arms()
        self._check_lrs()
        self._check_kind()
        if self.preregistration is not None:
            if self.study != "arms":
                self.refuse("preregistration", f"only a `study: arms` states hypotheses (this one: {self.study!r})")
            unknown = self.preregistration.unknown_names({b.arm for b in self.grid}, set(self.models))
            if unknown is not None:
                self.refuse(f"preregistration.{unknown[0]}", unknown[1])
        rollout, train = self.cell.get("rollout", {}), self.resources.train
        servers = rollout.get("server_replicas", 1)
        if rollout.get("server") and rollout.get("engine") == "vllm" and train.gpu < train.processes + servers:
            self.refuse(
                "resources.train.gpu",
                f"{train.gpu} GPUs for {train.processes} trainer process(es) and {servers} vLLM rollout server(s) "
                f"(cell.rollout.server), each on a GPU of its own: ask for {train.processes + servers}",
            )

    def grid_models(self) -> list[str]:
        """The models the grid's cells train, in grid order."""
        return list(dict.fromkeys(m for block in self.grid for m in block.models or self.models))

    def policy_model(self, model: str) -> str:
        """The model whose base policy `model`'s cells load: itself, or the model its `policy` key names."""
        return self.models[model].policy or model

    def paper_names(self) -> dict[str, str]:
        """Model name -> the paper's model name (the name itself when none is given), for tables and figures."""
        return {name: entry.paper_name or name for name, entry in self.models.items()}

    def horizons(self) -> dict[str, float]:
        """Model name -> its `horizon` label, for the models that have one (the horizon study's x axis)."""
        return {name: entry.horizon for name, entry in self.models.items() if entry.horizon is not None}

    def arm_keys(self, arm: str | None) -> dict:
        """The trainer keys of an arm (its block's `cell`, a copy); {} for no arm. KeyError for a label no block
        names."""
        if arm is None:
            return {}
        for block in self.grid:
            if block.arm == arm:
                return copy.deepcopy(block.cell or {})
        raise KeyError(f"arm {arm!r} is not named by any grid block")

    def _check_trainer_blocks(self) -> None:
        """The shared `cell` as a TrainConfig and `warm_start` as a WarmStartConfig: the trainer's own sections."""
        per_cell = per_cell_key(self.cell)
        if per_cell is not None:
            self.refuse(f"cell.{per_cell[0]}", f"{per_cell[1]}; remove it from the shared block")
        build_config(TrainConfig, self.cell, "cell")
        warm_start = dict(self.warm_start)
        allow = warm_start.pop("allow_out_of_band", False)
        if not isinstance(allow, bool):
            self.refuse("warm_start.allow_out_of_band", f"expected true/false, got {allow!r}")
        self.warm_start = {**warm_start, "allow_out_of_band": allow}  # its default set, as for every other key
        for key in WARM_START_SET_KEYS:
            if key in warm_start:
                self.refuse(f"warm_start.{key}", "set per model by the workflow; remove it")
        build_config(WarmStartConfig, warm_start, "warm_start")
        for name, entry in self.models.items():
            if entry.warm_start:
                build_config(WarmStartConfig, deep_merge(warm_start, entry.warm_start), f"models.{name}.warm_start")

    def _check_models(self) -> None:
        """Model names are folder names, a shared policy is a warm-started model's, every model a block names exists,
        and each model's environment options (merged over the shared ones) are its family's."""
        for name, entry in self.models.items():
            if not re.fullmatch(MODEL_PATTERN, name):
                self.refuse(f"models.{name}", "a model name is a folder label (letters, digits, _ . -)")
            if entry.policy is not None and getattr(self.models.get(entry.policy), "preset", None) is None:
                self.refuse(
                    f"models.{name}.policy",
                    f"{entry.policy!r} is not a model of this study with a `preset` (a warm-started policy to share)",
                )
        for i, block in enumerate(self.grid):
            for model in block.models or ():
                if model not in self.models:
                    self.refuse(
                        f"grid[{i}].models", f"{model!r} is not a model of this study (models: {sorted(self.models)})"
                    )
        env = self.cell.get("env", {})
        for name, entry in self.models.items():
            try:
                family_config(env.get("name", EnvConfig.name), {**env.get("options", {}), **(entry.env_options or {})})
            except (ValueError, TypeError) as e:
                where = "cell.env.options" + (f" with models.{name}.env_options" if entry.env_options else "")
                raise ConfigError(f"{where}: {e}") from None

    def _axis(self, key: str, kind: str, axis: str, needed: str, instead: str = "") -> list[int]:
        """The indices of the grid blocks that give `key` (an axis: `lrs`, `arm`), checked: every block or none, and
        only, and always, in a `study: kind` (`needed` says what the kind lacks, `instead` what to do elsewhere)."""
        with_key = [i for i, block in enumerate(self.grid) if getattr(block, key) is not None]
        if with_key and self.study != kind:
            self.refuse(
                f"grid[{with_key[0]}].{key}",
                f"only a `study: {kind}` has {axis} (the {self.study} analysis has none){'; ' + instead if instead else ''}",
            )
        if self.study == kind and not with_key:
            self.refuse("grid", needed)
        if with_key and len(with_key) < len(self.grid):
            i = next(i for i in range(len(self.grid)) if i not in with_key)
            self.refuse(
                f"grid[{i}].{key}",
                f"missing; grid[{with_key[0]}] gives `{key}`, so the study has {axis} and every block must give its own",
            )
        return with_key

    def _check_arms(self) -> None:
        """Every block names an arm or none does; blocks that share a label share its `cell`, whose keys the trainer
        knows (checked merged over the shared block)."""
        with_arm = self._axis(
            "arm", "arms", "arms", "a study of arms names one in every block (`arm`, and its trainer keys in `cell`)"
        )
        seen: dict[str, tuple[int, dict]] = {}
        for i in with_arm:
            label, own = self.grid[i].arm, self.grid[i].cell or {}
            if label in seen and seen[label][1] != own:
                self.refuse(
                    f"grid[{i}].cell",
                    f"arm {label!r} is also grid[{seen[label][0]}]'s with other keys; one label, one trainer "
                    "variant: rename one of them",
                )
            seen[label] = (i, own)
            build_config(TrainConfig, deep_merge(self.cell, own), f"grid[{i}].cell")

    def _check_lrs(self) -> None:
        """`lrs` on every block or none, only in a stability study; adam_high_lr needs the Muon cells' rate; a shared
        `cell.optim.matrix_lr` cannot stand beside a study lr of Muon cells."""
        table = self.lr or LrTable()
        for i, block in enumerate(self.grid):
            if (
                block.optimizer == "adam_high_lr"
                and table.muon is None
                and "lr" not in ((block.cell or {}).get("optim") or {})
            ):
                self.refuse(
                    f"grid[{i}].optimizer",
                    "adam_high_lr runs AdamW at the Muon cells' learning rate; give that rate in the study's `lr.muon`",
                )
        with_lrs = self._axis(
            "lrs",
            "stability",
            "an lr axis",
            "a stability study sweeps learning rates: give `lrs` in every block",
            "set one lr per optimizer with the top-level `lr:` table",
        )
        sets_muon = table.muon is not None or any(
            self.grid[i].optimizer == "muon"
            or (self.grid[i].optimizer == "recipe" and any(RECIPE_OPTIMIZER[r] == "muon" for r in self.grid[i].recipes))
            for i in with_lrs
        )
        if sets_muon and self.cell.get("optim", {}).get("matrix_lr") is not None:
            self.refuse(
                "cell.optim.matrix_lr",
                "the study sets the lr of its Muon cells (`lrs` or `lr.muon`), which is the lr of Muon's hidden "
                "matrices too (match_rms_adamw); a shared matrix_lr would override it: remove it or set it to null",
            )

    def _check_kind(self) -> None:
        """What the study's analysis needs: the companion's validation and estimators, the horizon's labels."""
        if self.study == "companion":
            for key, section in (("eval_every", "run"), ("eval_tasks", "env")):
                value = self.cell.get(section, {}).get(key, 1)
                if value < 1:
                    self.refuse(
                        f"cell.{section}.{key}",
                        f"the companion study's headline numbers are validation success, so it must validate (>= 1), got {value}",
                    )
            others = {r for block in self.grid for r in block.recipes} - set(GROUP_RECIPES)
            if others:
                self.refuse(
                    "grid",
                    f"the companion study's analysis compares the estimators {list(GROUP_RECIPES)}; recipes "
                    f"{sorted(others)} belong to the main study (study: main)",
                )
        if self.study == "horizon":
            families: dict[tuple, str] = {}
            for model in self.grid_models():
                entry = self.models[model]
                if entry.horizon is None:
                    self.refuse(
                        f"models.{model}.horizon",
                        "a horizon study labels every model of its grid with its horizon (a number, e.g. the task's "
                        "bug count)",
                    )
                family = (entry.paper_name or model, entry.horizon)
                if family in families:
                    self.refuse(
                        f"models.{model}.horizon",
                        f"{families[family]} has the same paper_name and horizon {entry.horizon}; the horizon figure "
                        "joins a family's models into one line",
                    )
                families[family] = model

    def check_paths(self, root: str | Path) -> None:
        """ConfigError for a local path the study names that does not exist (relative to the repository root
        `root`): a checkpoint, a task file or game folder, shared or a model's own. Nothing is downloaded."""
        root = Path(root)
        for name, entry in self.models.items():
            if entry.path is not None and not (root / entry.path).exists():
                raise ConfigError(
                    f"models.{name}.path: {entry.path!r} does not exist (paper scale needs the checkpoint on a local path)"
                )
            template = (entry.model_options or {}).get("chat_template")
            if template is not None:
                try:
                    find_chat_template(template, root)
                except ConfigError as err:
                    raise ConfigError(f"models.{name}.model_options.chat_template: {err}") from None
        options = self.cell.get("env", {}).get("options", {})
        for key in PATH_OPTIONS:
            if options.get(key) and not (root / options[key]).exists():
                raise ConfigError(
                    f"cell.env.options.{key}: {options[key]!r} does not exist (paper-scale tasks and games are read "
                    "from local files; nothing is downloaded)"
                )
        for model in self.grid_models():
            own = self.models[model].env_options or {}
            for key in PATH_OPTIONS:
                if own.get(key) and not (root / own[key]).exists():
                    raise ConfigError(f"models.{model}.env_options.{key}: {own[key]!r} does not exist")


def plain(value):
    """A section as a plain mapping (nested sections too), the keys not given (None) left out: what a Snakemake
    param carries to a script, which builds the section again."""
    if dataclasses.is_dataclass(value):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def check_study(study: dict, root: str | Path = ".") -> StudyConfig:
    """The study's mapping (its `base` merged) checked as a `StudyConfig`, every default set, its local paths
    checked relative to the repository root `root`. StudyError naming the key."""
    try:
        config = build_config(StudyConfig, study)
        config.check_paths(root)
    except ConfigError as e:
        raise StudyError(str(e)) from None
    return config
