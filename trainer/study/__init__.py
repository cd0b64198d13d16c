"""The study model: from a study file (config.yaml, configs/*.yaml) to the grid of cells and each cell's trainer
config. Three modules, each on the one before: `schema.py` (the file: `base` merged, its keys as typed sections,
`check_study`), `grid.py` (the cells as rows, their keys and folders) and `cells.py` (each job's config, and
`Study`, the study loaded once).

workflow/rules/common.smk loads a study once (`Study.load`) and reads its grid, cells and warm starts from that
object, and its rules read the typed study (`Study.config`, a `StudyConfig`) rather than a mapping; the tests build
a `Study` from a mapping the same way, and Snakemake only writes what it returns to disk. Design choices:

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
  (`Study.cell_lrs`: the study's `lr:` entry for its optimizer, its grid lr, its arm's own rates) and, when the warm start writes
  SPO's offline statistics, `rl.spo.offline_stats`. The study refuses those keys (and the recipe-defining keys) in
  the shared block, because an explicit key overrides the recipe in the trainer (`trainer/recipes.py`): a shared
  `loss.tis_cap` would silently turn TIS on for the no-TIS recipes. The shared block's estimator sections
  (`rl.gigpo`, ...) reach only the cells of that estimator, which refuse another's.
- **A study file may name a `base` study** (`resolve_base`): its keys are deep-merged over the base's, so a new
  study holds only its differences.
- **`run.threads` comes from the rule's threads** (`resources.train.threads`), so the trainer uses exactly the
  cores the scheduler gave it.
- **Models**: a `preset` model is warm-started by the workflow and its cells load the warm-started policy; a
  `path` model is a local checkpoint used as is (paper scale).
- **Typed keys, checked once** (`check_study`): the study file's own keys are the fields of `StudyConfig` and the
  sections it composes (`ModelEntry`, `GridBlock`, `LrTable`, `Resources`, `AnalysisConfig`), each with its
  default, range and meaning; each section checks its own rules (preset xor path, an arm's label), `StudyConfig`
  those across sections (a block names known models, every block or none gives `lrs` / `arm`, a horizon study's
  labels) and the trainer's blocks with the trainer's own sections. `StudyError` names the key before any job
  starts; the checked study, defaults set, is the object the workflow and `Study` read (no mapping in between).
- **Tables derived, not copied**: each recipe's optimizer and estimator come from `trainer.recipes`, the optimizer
  names from `trainer.optim.config` (`OptimConfig`), the presets from `trainer.policy.tiny`, the lr folder label
  from `trainer.analysis.cell_logs`. This module and those import no torch: building the DAG needs the trainer
  package but not torch.
"""

from trainer.study.cells import OFFLINE_STATS_FILE, Study, paths_from_workdir, write_yaml, yaml_text
from trainer.study.grid import CellKey, grid_frame
from trainer.study.schema import (
    GROUP_RECIPES,
    OPTIMIZERS,
    RECIPE_OPTIMIZER,
    StudyConfig,
    StudyError,
    check_study,
    deep_merge,
    plain,
    resolve_base,
)

__all__ = [
    "GROUP_RECIPES",
    "OFFLINE_STATS_FILE",
    "OPTIMIZERS",
    "RECIPE_OPTIMIZER",
    "CellKey",
    "Study",
    "StudyConfig",
    "StudyError",
    "check_study",
    "deep_merge",
    "grid_frame",
    "paths_from_workdir",
    "plain",
    "resolve_base",
    "write_yaml",
    "yaml_text",
]
