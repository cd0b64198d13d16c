"""Read many cells' metrics logs into one long table: one row per (model, recipe, optimizer, seed, update).

Each training cell writes `<base_dir>/model=M/recipe=R/optimizer=O/seed=S/metrics.parquet` (Hive-style folders);
a study with a learning-rate axis (the stability study) adds `lr=L` before the seed (`lr_label`), a
study of arms (the decisive comparisons) `arm=A` after the optimizer.
Choices and why:

* **`pyarrow.dataset` over the explicit list of files, never a glob.** Snakemake hands the aggregate rule the
  exact `expand()`-ed inputs; globbing would silently pick up stale cells of an older grid. One dataset scan
  over 1,000 files is much faster than 1,000 `read_table` calls.
* **The Hive keys are checked by us before Arrow parses them.** Arrow skips partition parsing for a path outside
  `partition_base_dir` and fills null for a missing key, which would become a silently unlabelled run. We
  demand every path lies under `base_dir` and names all four keys (any folder order), else ValueError naming
  the path. The partition types are fixed (strings, an int64 seed, a float64 lr) instead of inferred, so a model
  called "123" stays a string.
* **The optional `arm` and `lr` keys.** `RUN_KEYS` are the four keys every study has, which name a run of the
  main, companion and horizon studies. A read whose folders name `lr` or `arm` (all of them, or none: a mix is a
  ValueError) gets that column too (`lr` a float, `arm` a string), and `run_keys` then names one run with it.
* **The reading schema is the trainer's `METRIC_COLUMNS`.** A file that lacks a column reads it as null; an
  extra column is ignored. `update` must be present and non-null, and (run, update) unique.
* **Null is not NaN.** The trainer writes NaN for a measured-but-broken value (a diverged loss) and null for
  "not measured". pandas shows both as NaN, so the distinction is taken while the data is still Arrow:
  `nonfinite_<col>` is True exactly where `<col>` holds NaN or +-inf, for the columns in `NONFINITE_COLUMNS`.
  The collapse detector uses these flags.
* **A finished cell's logs are checked against its config before any summary** (`check_cell_logs`): a log
  truncated or replaced by a shorter valid file, or a missing episode log, fails the summary naming the file
  instead of silently dropping the cell or changing its numbers.
* **Model names.** Cells are named by the model they ran ("minicpm-tiny" at the embedded scale, the paper's own
  name at paper scale); `paper_model` maps them through a parameter, defaulting to `DEFAULT_MODELS`, and a
  name without an entry maps to itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml

from trainer.analysis.kinds import DEFAULT_MODELS
from trainer.config import RunConfig
from trainer.logs.parquet_log import CONFIG_KEY, METRIC_COLUMNS

RUN_KEYS: tuple[str, ...] = ("model", "recipe", "optimizer", "seed")
"""The Hive keys of every cell's folder, which together name one run (with `lr` where the folders have it)."""

OPTIONAL_KEYS: dict[str, pa.DataType] = {"arm": pa.string(), "lr": pa.float64()}
"""Hive keys a study may add to `RUN_KEYS`, with their types: `arm`, the trainer variant of a study of arms, and
`lr`, the learning-rate axis of a stability study."""
LR_RUN_KEYS: tuple[str, ...] = ("model", "recipe", "optimizer", "lr", "seed")
"""The keys that name one run of a study with an lr axis, in folder order."""
ARM_RUN_KEYS: tuple[str, ...] = ("model", "recipe", "optimizer", "arm", "seed")
"""The keys that name one run of a study of arms, in folder order."""

PARTITION_SCHEMA = pa.schema(
    [("model", pa.string()), ("recipe", pa.string()), ("optimizer", pa.string()), ("seed", pa.int64())]
)


def lr_label(lr: float) -> str:
    """A learning rate as its cell folder spells it (`.../lr=L/`): the shortest scientific form that reads back as
    the same float ("3e-04", "2.5e-04", "1e-02"), so the analysis recovers the exact lr from the folder."""
    lr = float(lr)
    return next(text for text in (f"{lr:.{p}e}" for p in range(17)) if float(text) == lr)


def run_keys(frame: pd.DataFrame) -> list[str]:
    """The keys naming one run of `frame` (read without the logged `lr` metric), in folder order: `RUN_KEYS` with
    `arm` and `lr` before `seed` where it has them."""
    return [*RUN_KEYS[:3], *(k for k in OPTIONAL_KEYS if k in frame.columns), "seed"]


def check_no_axes(metrics: pd.DataFrame, analysis: str) -> None:
    """ValueError if `metrics` (read without the logged `lr` metric) has the folders' lr or arm key: an analysis
    keyed by `RUN_KEYS` alone would pool the runs of different learning rates or arms."""
    if "lr" in metrics.columns:
        raise ValueError(
            f"the {analysis} analysis has no learning-rate axis, but these cells' folders name lr=...: "
            f"analyse a grid with `lrs` as `study: stability`"
        )
    if "arm" in metrics.columns:
        raise ValueError(
            f"the {analysis} analysis has no arms, but these cells' folders name arm=...: analyse a "
            f"grid of arms as `study: arms`"
        )


NONFINITE_COLUMNS: tuple[str, ...] = ("loss", "grad_norm")
"""Metric columns for which `load_metrics` adds a `nonfinite_<col>` flag (NaN or +-inf, not null)."""


def paper_model(model: str, models: Mapping[str, str] | None = None) -> str:
    """The paper's name for a cell's model: `models[model]`, or the name itself when it has no entry."""
    models = DEFAULT_MODELS if models is None else models
    return models.get(model, model)


def _check_paths(paths: Sequence[str | os.PathLike], base_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Absolute paths, each checked to lie under `base_dir` and to name every Hive key once, and the optional keys
    they name (each named by all of them, or by none)."""
    if isinstance(paths, (str, os.PathLike)):
        raise TypeError(f"paths must be a list of metrics files, got a single path {paths!r}")
    if len(paths) == 0:
        raise ValueError("no metrics files given (an empty input list)")
    base = Path(os.path.abspath(base_dir))
    checked, seen, optional = [], set(), set()
    for path in paths:
        absolute = Path(os.path.abspath(path))
        try:
            parts = absolute.relative_to(base).parts[:-1]
        except ValueError:
            raise ValueError(f"metrics file {str(path)!r} is not under base_dir {str(base_dir)!r}") from None
        keys = [part.split("=", 1)[0] for part in parts if "=" in part]
        missing = [key for key in RUN_KEYS if keys.count(key) != 1]
        missing += [key for key in OPTIONAL_KEYS if keys.count(key) > 1]
        if missing:
            raise ValueError(
                f"metrics file {str(path)!r}: its folders below {str(base_dir)!r} must name each of "
                f"{list(RUN_KEYS)} once as key=value; bad or missing: {missing}"
            )
        if not absolute.is_file():
            raise FileNotFoundError(f"metrics file {str(path)!r} does not exist")
        if absolute in seen:
            raise ValueError(f"metrics file {str(path)!r} is listed twice")
        seen.add(absolute)
        checked.append(str(absolute))
        optional.add(tuple(key for key in OPTIONAL_KEYS if key in keys))
    if len(optional) > 1:
        named = sorted({key for keys in optional for key in keys})
        raise ValueError(
            f"metrics files under {str(base_dir)!r}: some name {'/'.join(f'{k}=...' for k in named)} "
            f"folders and some do not; one read takes the cells of one study"
        )
    return checked, list(next(iter(optional)))


def load_metrics(
    paths: Sequence[str | os.PathLike], base_dir: str | os.PathLike, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """All rows of the given metrics files, with the run keys as columns, sorted by run and update.

    Columns: `RUN_KEYS` (and `arm`, a string, and `lr`, a float, where the folders name them: the folders' `lr`
    then replaces the logged `lr` metric, the optimizer's first parameter group's rate), the `METRIC_COLUMNS` named in `columns` (default: all;
    `update` always) as float64 (int64 where the whole column is non-null), and `nonfinite_<col>`
    booleans for those of `NONFINITE_COLUMNS` read. Reading only the columns a step needs makes a 1,000-file read
    faster.
    """
    files, optional = _check_paths(paths, base_dir)
    has_lr = "lr" in optional
    partitions = pa.schema([*PARTITION_SCHEMA, *(pa.field(key, OPTIONAL_KEYS[key]) for key in optional)])
    wanted = list(METRIC_COLUMNS) if columns is None else ["update", *(c for c in columns if c != "update")]
    unknown = [c for c in wanted if c not in METRIC_COLUMNS]
    if unknown:
        raise ValueError(f"load_metrics: unknown metric column(s) {unknown}; known: {list(METRIC_COLUMNS)}")
    if has_lr:  # the folder's lr (the cell's configured rate) is the `lr` column, not the logged metric
        wanted = [c for c in wanted if c != "lr"]
    schema = pa.schema([*((c, METRIC_COLUMNS[c]) for c in dict.fromkeys(wanted)), *partitions])
    dataset = ds.dataset(
        files,
        format="parquet",
        schema=schema,
        partition_base_dir=os.path.abspath(base_dir),
        partitioning=ds.partitioning(partitions, flavor="hive"),
    )
    table = dataset.to_table()
    for key in partitions.names:
        if table[key].null_count:
            raise ValueError(f"Hive key {key!r} could not be read from some of the paths under {str(base_dir)!r}")
    if table["update"].null_count:
        raise ValueError(f"{table['update'].null_count} metrics row(s) have no 'update' value")
    for column in (c for c in NONFINITE_COLUMNS if c in wanted):
        flag = pc.fill_null(pc.invert(pc.is_finite(table[column])), False)
        table = table.append_column(f"nonfinite_{column}", flag)
    frame = table.to_pandas()
    for key in (*RUN_KEYS[:3], *(k for k in optional if k == "arm")):
        frame[key] = frame[key].astype(object)
    keys = run_keys(frame)
    frame = frame.sort_values([*keys, "update"], kind="stable", ignore_index=True)
    duplicated = frame.duplicated([*keys, "update"])
    if duplicated.any():
        row = frame.loc[duplicated.idxmax(), [*keys, "update"]].to_dict()
        raise ValueError(f"update logged twice for one run: {row}")
    return frame


REQUIRED_COLUMNS: tuple[str, ...] = ("update", "success_rate")
"""Metric columns every analysis reads: a log without them is not a cell's log."""


def _cell_updates(metrics: Path) -> int:
    """The number of updates the cell was configured to run: `run.updates` of the `cell.yaml` beside its metrics
    log (the workflow writes it), else of the config the trainer stored in the log's metadata."""
    cell = metrics.with_name("cell.yaml")
    if cell.is_file():
        config = yaml.safe_load(cell.read_text(encoding="utf-8")) or {}
        where = str(cell)
    else:
        stored = (pq.read_schema(metrics).metadata or {}).get(CONFIG_KEY)
        if stored is None:
            raise ValueError(
                f"metrics file {str(metrics)!r}: no cell.yaml beside it and no config in its metadata, "
                "so its length cannot be checked (not a log the trainer wrote)"
            )
        config = json.loads(stored)
        where = f"{metrics} (stored config)"
    updates = (config.get("run") or {}).get("updates", RunConfig.updates)
    if not isinstance(updates, int) or isinstance(updates, bool):
        raise ValueError(f"{where}: run.updates is {updates!r}, not an integer")
    return updates


def check_cell_logs(paths: Sequence[str | os.PathLike]) -> None:
    """ValueError naming the file unless every metrics log is its cell's whole run: the columns every analysis
    reads, exactly one row per configured update (0 .. run.updates - 1), and an `episodes.parquet` beside it
    whose training episodes cover the same updates."""
    for path in paths:
        metrics = Path(path)
        try:  # the schema and the update column only: this runs over every cell before each summary
            missing = [c for c in REQUIRED_COLUMNS if c not in pq.read_schema(metrics).names]
            if missing:
                raise ValueError(f"metrics file {str(metrics)!r} lacks column(s) {missing}")
            column = pq.read_table(metrics, columns=["update"])["update"]
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"metrics file {str(metrics)!r} cannot be read as Parquet: {e}") from None
        updates = _cell_updates(metrics)
        logged = sorted(column.drop_null().to_pylist())
        if logged != list(range(updates)):
            raise ValueError(
                f"metrics file {str(metrics)!r} has {len(column)} row(s) (updates "
                f"{_span(logged)}) but its cell ran {updates} update(s) (0..{updates - 1}): a "
                "truncated or replaced log; rerun the cell (delete its folder, then snakemake)"
            )
        episodes = metrics.with_name("episodes.parquet")
        if not episodes.is_file():
            raise ValueError(f"episode log {str(episodes)!r} is missing beside its metrics log; rerun the cell")
        try:
            frame = pq.read_table(episodes, columns=["update", "split"]).to_pandas()
        except (OSError, pa.ArrowException, KeyError) as e:
            raise ValueError(
                f"episode log {str(episodes)!r} cannot be read (needs columns update, split): {e}"
            ) from None
        covered = sorted(set(frame.loc[frame["split"] == "train", "update"].dropna().astype(int)))
        if covered != list(range(updates)):
            raise ValueError(
                f"episode log {str(episodes)!r} has training episodes for updates {_span(covered)}, "
                f"not 0..{updates - 1}: a truncated or replaced log; rerun the cell"
            )


def _span(values: Sequence[int]) -> str:
    return (
        "none"
        if not values
        else f"{values[0]}..{values[-1]}"
        + ("" if len(values) == values[-1] - values[0] + 1 else f", {len(values)} distinct")
    )
