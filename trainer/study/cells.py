"""What each job of a study runs: `Study`, the study file loaded once (checked as a `StudyConfig`, its paths
rebased to its workdir, its grid built and every cell checked), which the workflow reads: each cell's trainer
config (the shared block, the per-cell keys, the lr by role, the arm's keys) and each model family's warm-start
config, both read from the typed study."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml

from trainer.config import (
    OFFLINE_STATS_FILE,
    ConfigError,
    config_from_dict,
)
from trainer.policy.templates import shipped_templates
from trainer.recipes import RECIPE_ESTIMATOR
from trainer.rl.config import ESTIMATOR_SECTIONS, SECTION_CLASSES, SPO_ESTIMATORS
from trainer.study.grid import CellKey, grid_frame
from trainer.study.schema import (
    PATH_OPTIONS,
    WARM_START_ROLLOUT_KEYS,
    LrTable,
    StudyConfig,
    StudyError,
    check_study,
    deep_merge,
    resolve_base,
)


def paths_from_workdir(config: StudyConfig, root: str | Path, workdir: str | Path) -> StudyConfig:
    """The study with its relative local paths (`models.*.path`, a model's own chat template, `tasks_file` /
    `data_dir` of the env options) rewritten from the repository root to the study's workdir, where its jobs run:
    `checkpoints/M` becomes `../../checkpoints/M` under `workdir: studies/x`. Still relative, so a moved checkout
    keeps its cells; taken between real paths, because a job's working directory is the workdir's real path
    (`studies/` is often a link to scratch storage on a cluster, and `..` climbs from where the link points)."""

    def rebase(path):
        if os.path.isabs(path):
            return path
        return os.path.relpath(os.path.realpath(os.path.join(root, path)), os.path.realpath(workdir))

    out = copy.deepcopy(config)  # fields set in place: the checked study is not checked again
    for entry in out.models.values():
        if entry.path is not None:
            entry.path = rebase(entry.path)
        template = (entry.model_options or {}).get("chat_template")
        if template is not None and template not in shipped_templates():
            entry.model_options["chat_template"] = rebase(template)
    for options in [
        out.cell.get("env", {}).get("options", {}),
        *(entry.env_options or {} for entry in out.models.values()),
    ]:
        for key in PATH_OPTIONS:
            if options.get(key):
                options[key] = rebase(options[key])
    return out


class Study:
    """A study file loaded once (`Study.load`): its keys resolved and checked as a `StudyConfig` (`config`), its
    paths rebased to its workdir, its grid built, every cell checked as the trainer will read it. The workflow
    (workflow/rules/common.smk) reads everything from this object; tests build it from a mapping the same way."""

    def __init__(self, config: StudyConfig, root: str | Path = "."):
        self.config = config
        """The checked study, defaults set, paths relative to its workdir."""
        self.root = Path(root)
        self.grid = grid_frame(config)
        """One row per cell: its model, recipe, optimizer, (arm, lr,) seed, as Snakemake's Paramspace reads it."""
        self.keys = [CellKey.of(row) for row in self.grid.itertuples(index=False)]
        self.warm_started = [
            m
            for m in dict.fromkeys(config.policy_model(m) for m in self.grid["model"])
            if config.models[m].preset is not None
        ]
        """Models whose warm-started policy the grid's cells load (the warm-start rule's models), in grid order."""

    @classmethod
    def load(cls, data: dict, root: str | Path = ".", source: str | Path | None = None) -> Study:
        """The study of a study file's mapping (`source`: its file, for messages): `base` merged (`resolve_base`),
        checked as a `StudyConfig` with its defaults set (`check_study`), the paths rebased from `root` to the
        study's workdir, then every cell checked (`check_cells`). StudyError naming the key."""
        config = check_study(resolve_base(data, root=root, source=source), root=root)
        loaded = cls(paths_from_workdir(config, root, os.path.join(root, config.workdir)), root)
        loaded.check_cells()
        return loaded

    @property
    def preflight_options(self) -> dict | None:
        """The cells' `env.options` where the study plays its tasks in Docker (env `swe`, `backend: docker`), which
        the preflight grades with; None for any other study (no preflight)."""
        env = self.config.cell.get("env", {})
        options = env.get("options") or {}
        return dict(options) if env.get("name") == "swe" and options.get("backend") == "docker" else None

    def loads_warm_start(self, model: str) -> bool:
        """Whether `model`'s cells load a policy the workflow warm-starts (its own or the one its `policy` names)."""
        return self.config.policy_model(model) in self.warm_started

    def model_path(self, model: str) -> str:
        """Where a cell of `model` loads its base policy: the warm-started policy (its own, or the one its `policy`
        key names), or the study's checkpoint path."""
        entry = self.config.models[model]
        if entry.path is not None:
            return entry.path
        return f"results/policies/{self.config.policy_model(model)}"

    def model_env(self, model: str) -> dict:
        """The `env` section of the model's cells and warm start: `cell.env` with the model's own `env_options`
        merged over its options key by key (a copy)."""
        env = copy.deepcopy(self.config.cell.get("env", {}))
        options = {**env.get("options", {}), **copy.deepcopy(self.config.models[model].env_options or {})}
        return {**env, "options": options} if options or "options" in env else env

    def cell_lrs(self, key: CellKey) -> dict:
        """The optim keys a cell's learning rate sets, the last given winning: the study's `lr:` entry for its
        optimizer (Muon's covers its hidden matrices and the AdamW rest alike; an adam_high_lr cell, AdamW at
        Muon's lr, takes the `muon` entry), its grid lr, its arm's own optim.lr / matrix_lr. {} if none."""
        table = self.config.lr or LrTable()
        if key.optimizer == "adam_high_lr":
            lrs = {} if table.muon is None else {"lr": float(table.muon)}
        else:
            value = float(key.lr) if key.lr is not None else getattr(table, key.optimizer)
            lrs = {} if value is None else {"lr": float(value)}
        own = self.config.arm_keys(key.arm).get("optim") or {}
        return {**lrs, **{k: v for k, v in own.items() if k in ("lr", "matrix_lr")}}

    def offline_stats_path(self, model: str, model_path: str) -> str | None:
        """Where a cell of `model` reads SPO's offline statistics: beside its warm-started policy when the warm
        start writes them (`warm_start.offline_samples > 0`), relative as `model_path` is; None otherwise, and for a
        model that shares another's policy (`policy`): that offline pass played the other model's tasks."""
        if self.config.warm_start.get("offline_samples", 0) > 0 and self.config.models[model].preset:
            return f"{model_path}/{OFFLINE_STATS_FILE}"
        return None

    def cell_config(self, key: CellKey, model_path: str | None = None) -> dict:
        """The trainer config of one cell (its cell.yaml), loading its model from `model_path` (default: its own):
        the shared `cell` block with its arm's keys merged over it, plus the cell's own keys."""
        config, model = self.config, key.model
        model_path = self.model_path(model) if model_path is None else model_path
        shared = deep_merge(config.cell, config.arm_keys(key.arm))
        cell = {"recipe": key.recipe}
        cell["model"] = {
            **shared.pop("model", {}),
            **copy.deepcopy(config.models[model].model_options or {}),
            "path": model_path,
        }
        cell["optim"] = {**shared.pop("optim", {}), "name": key.optimizer, **self.cell_lrs(key)}
        run = {**shared.pop("run", {}), "seed": int(key.seed), "threads": int(config.resources.train.threads)}
        if "env" in shared or config.models[model].env_options:
            shared["env"] = self.model_env(model)  # in place: a cell.yaml without env_options reads as before
        estimator = RECIPE_ESTIMATOR[key.recipe]
        if "rl" in shared:  # the study's settings of the other estimators are not this cell's
            others = set(SECTION_CLASSES) - set(ESTIMATOR_SECTIONS[estimator])
            shared["rl"] = {k: v for k, v in shared["rl"].items() if k not in others}
        offline = self.offline_stats_path(model, model_path)
        if offline is not None and estimator in SPO_ESTIMATORS:
            rl = shared.setdefault("rl", {})
            rl["spo"] = {**rl.get("spo", {}), "offline_stats": offline}
        cell.update(shared)  # env, rl, rollout, ... as given
        cell["run"] = run
        return cell

    def warm_start_config(self, model: str) -> dict:
        """The `python -m trainer warm-start` config of one model family: its preset, the cells' env (with the
        model's env_options) and token limits, its own `warm_start` keys over the study's, the warm-start job's
        threads; the model's `warm_start_seed`, where it has one, seeds both the warm start (demonstrations, their
        order, evaluations) and the tiny model's initialisation."""
        config, entry = self.config, self.config.models[model]
        options = {k: v for k, v in config.warm_start.items() if k != "allow_out_of_band"}
        options = deep_merge(options, entry.warm_start or {})
        model_keys = {k: v for k, v in config.cell.get("model", {}).items() if k in ("dtype", "init_seed")}
        if entry.warm_start_seed is not None:
            options["seed"], model_keys["init_seed"] = entry.warm_start_seed, entry.warm_start_seed
        rollout = {k: v for k, v in config.cell.get("rollout", {}).items() if k in WARM_START_ROLLOUT_KEYS}
        return {
            "model": {"preset": entry.preset, **model_keys},
            "env": self.model_env(model),
            "rollout": rollout,
            **options,
            "threads": int(config.resources.warm_start.threads),
        }

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
