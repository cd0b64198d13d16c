"""What each job of a study runs: a cell's trainer config (`cell_config`: the shared block, the per-cell keys, the
lr by role, the arm's keys), a model family's warm-start config, the study's paths from its workdir, and `Study`,
the study loaded once, which the workflow reads."""

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
from trainer.study.grid import CellKey, arm_cell, grid_frame, horizons, paper_names, policy_model, warm_started_models
from trainer.study.schema import (
    PATH_OPTIONS,
    WARM_START_ROLLOUT_KEYS,
    StudyError,
    check_study,
    deep_merge,
    resolve_base,
)


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
    cell["model"] = {
        **shared.pop("model", {}),
        **(study["models"][model].get("model_options") or {}),
        "path": model_path,
    }
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
    """The `python -m trainer warm-start` config of one model family: its preset, the cells' env (with the model's
    env_options) and token limits, its own `warm_start` keys over the study's; the model's `warm_start_seed`, where it has one, seeds both the warm start
    (demonstrations, their order, evaluations) and the tiny model's initialisation."""
    shared = study.get("cell", {})
    options = {k: v for k, v in study.get("warm_start", {}).items() if k != "allow_out_of_band"}
    options = deep_merge(options, study["models"][model].get("warm_start") or {})
    model_keys = {k: v for k, v in shared.get("model", {}).items() if k in ("dtype", "init_seed")}
    seed = study["models"][model].get("warm_start_seed")
    if seed is not None:
        options["seed"], model_keys["init_seed"] = seed, seed
    rollout = {k: v for k, v in shared.get("rollout", {}).items() if k in WARM_START_ROLLOUT_KEYS}
    return {
        "model": {"preset": study["models"][model]["preset"], **model_keys},
        "env": model_env(study, model),
        "rollout": rollout,
        **options,
        "threads": int(threads),
    }


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
        template = (entry.get("model_options") or {}).get("chat_template")
        if template is not None and template not in shipped_templates():
            entry["model_options"]["chat_template"] = rebase(template)
    for options in [
        out.get("cell", {}).get("env", {}).get("options", {}),
        *(entry.get("env_options", {}) for entry in out["models"].values()),
    ]:
        for key in PATH_OPTIONS:
            if options.get(key):
                options[key] = rebase(options[key])
    return out


class Study:
    """A study file loaded once (`Study.load`): its keys resolved, checked, rebased to its workdir, its grid built,
    every cell checked as the trainer will read it. The workflow (workflow/rules/common.smk) reads everything from
    this object; the functions above are its parts and take the study's mapping."""

    def __init__(self, data: dict, root: str | Path = "."):
        self.data = data
        """The study's mapping (base merged, checked with its defaults set, paths from its workdir)."""
        self.root = Path(root)
        self.grid = grid_frame(data)
        self.keys = [CellKey.of(row) for row in self.grid.itertuples(index=False)]
        self.warm_started = warm_started_models(data, self.grid)
        """Models whose warm-started policy the grid's cells load (the warm-start rule's models)."""
        self.paper_names = paper_names(data)
        """Model name -> the paper's model name, for tables and figures."""
        self.horizons = horizons(data)
        """Model name -> its `horizon` label (the horizon study's x axis), for the models that have one."""

    @classmethod
    def load(cls, data: dict, root: str | Path = ".", source: str | Path | None = None) -> Study:
        """The study of a study file's mapping (`source`: its file, for messages): `base` merged (`resolve_base`),
        checked as a `StudyConfig` with its defaults set (`check_study`), the paths rebased from `root` to the
        study's workdir, then every cell checked (`check_cells`). StudyError naming the key."""
        study = check_study(resolve_base(data, root=root, source=source), root=root)
        workdir = os.path.join(root, study["workdir"])
        loaded = cls(paths_from_workdir(study, root, workdir), root)
        loaded.check_cells()
        return loaded

    @property
    def preflight_options(self) -> dict | None:
        """The cells' `env.options` where the study plays its tasks in Docker (env `swe`, `backend: docker`), which
        the preflight grades with; None for any other study (no preflight)."""
        env = self.data.get("cell", {}).get("env", {})
        options = env.get("options") or {}
        return dict(options) if env.get("name") == "swe" and options.get("backend") == "docker" else None

    @property
    def threads(self) -> int:
        """Threads of a train job (`resources.train.threads`), which each cell's trainer uses."""
        return int(self.data["resources"]["train"]["threads"])

    def loads_warm_start(self, model: str) -> bool:
        """Whether `model`'s cells load a policy the workflow warm-starts (its own or the one its `policy` names)."""
        return policy_model(self.data, model) in self.warm_started

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

    def warm_start_config(self, model: str) -> dict:
        """The `python -m trainer warm-start` config of a warm-started model."""
        return warm_start_config(self.data, model, threads=self.data["resources"]["warm_start"]["threads"])

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
