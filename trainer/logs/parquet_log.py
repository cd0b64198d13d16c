"""Parquet logs: one row per update (METRIC_COLUMNS) and one row per episode (EPISODE_COLUMNS).

The column names are the contract between the trainer and the figure scripts (`METRIC_COLUMNS` below;
docs/design.md, "Outputs"). Choices and why:

* **Rewrite the whole table at every flush, atomically** (`atomic.atomic_path`). Parquet cannot be appended
  to, and a crash must never leave a truncated file; a run has ~100 updates and a few thousand episodes, so
  rewriting costs milliseconds. A reader sees the previous flush or this one.
* **A fixed schema, checked at `append`.** An unknown column raises ValueError naming it (a typo in the trainer
  would otherwise become a silently missing curve); a missing column is null. Values are checked against the
  column's type: ints must be whole numbers (an integer-valued float is accepted, a bool is not), floats real
  numbers (not bools), bools bools, strings strings. `update` is required: rows are keyed by it for `truncate`.
* **NaN is kept, not rejected.** A collapsed run's NaN loss is a measurement, and the log should show it; null
  means "not measured" (e.g. `eval_success` at updates without evaluation). Parquet keeps the two apart;
  pandas shows both as NaN in float columns.
* **Provenance in the file.** `collect_provenance(...)` goes, as JSON, into the schema metadata under
  b"harness.provenance", and its config also under b"harness.config", so a file carries its own origin.
* **Resume, two ways.** Either `MetricsLog.load` reads the file back and the trainer calls `truncate(step)` to
  drop rows written after the checkpoint it resumes from (passing a new provenance keeps the file's under
  "previous", so a resumed run shows every segment's revision and host); or the checkpoint carries `log.rows`
  in its `extra` and the resumed run assigns them back (`log.rows = saved`), which cannot disagree with the
  checkpoint whatever order the trainer flushed and saved in.
"""

from __future__ import annotations

import glob
import json
import numbers
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.atomic import atomic_path, stale_temps
from trainer.logs.provenance import to_json

if TYPE_CHECKING:
    import pandas as pd

PROVENANCE_KEY = b"harness.provenance"
CONFIG_KEY = b"harness.config"

_INT = (
    "update",
    "policy_version",
    "n_trajectories",
    "gen_tokens",
    "optimizer_steps",
    "skipped_steps",
    "no_signal_steps",
)
_FLOAT = (
    "success_rate",
    "reward_mean",
    "response_len_mean",
    "turns_mean",
    "tool_error_rate",
    "overlong_rate",
    "advantage_std",
    "entropy",
    "approx_kl",
    "clip_frac_low",
    "clip_frac_high",
    "tis_weight_mean",
    "tis_truncated_frac",
    "staleness_mean",
    "staleness_max",
    "grad_norm",
    "update_rms",
    "update_spectral_norm",
    "grad_snr",
    "lr",
    "loss",
    "eval_success",
    "rollout_s",
    "train_s",
    "wall_s",
    "baseline_informed_frac",
    "embed_head_update_rms",
    "embed_head_update_spectral_norm",
    "tamper_rate",
)
_METRIC_ORDER = (
    "update",
    "policy_version",
    "success_rate",
    "reward_mean",
    "n_trajectories",
    "gen_tokens",
    "response_len_mean",
    "turns_mean",
    "tool_error_rate",
    "overlong_rate",
    "advantage_std",
    "entropy",
    "approx_kl",
    "clip_frac_low",
    "clip_frac_high",
    "tis_weight_mean",
    "tis_truncated_frac",
    "staleness_mean",
    "staleness_max",
    "grad_norm",
    "update_rms",
    "update_spectral_norm",
    "lr",
    "loss",
    "eval_success",
    "rollout_s",
    "train_s",
    "wall_s",
    "grad_snr",
    "optimizer_steps",
    "skipped_steps",
    "baseline_informed_frac",
    "cheat_rate",
    "embed_head_update_rms",
    "embed_head_update_spectral_norm",
    "no_signal_steps",
    "tamper_rate",
)

METRIC_COLUMNS: dict[str, pa.DataType] = {name: pa.int64() if name in _INT else pa.float64() for name in _METRIC_ORDER}
"""One row per update: the contract's columns in their order, then grad_snr (the companion study's gradient
signal-to-noise proxy, null unless run.grad_snr), the optimizer steps taken and skipped (no signal, or non-finite),
the share of the batch's episodes whose SPO baseline was informed (offline pass or an earlier visit; null
without a tracker), the cheating probe's success on impossible tasks (`env.probe_tasks`; null where none ran), the
step size on the embedding and head matrices (AdamW-trained under either optimizer; as update_rms and
update_spectral_norm are on the hidden matrices), and the mini-batches whose advantages were all zero (taken or
skipped: under `run.skip_no_signal: false` Muon still takes a full-size step on them), and the share of the batch's
episodes whose grading raised tamper flags (swe: `tamper.py`; null where the environment reports no grading).
Every column may be null
(eval_success is, where not evaluated; the loss, gradient and update statistics are, when every step of the update
was skipped)."""

EPISODE_COLUMNS: dict[str, pa.DataType] = {
    "update": pa.int64(),  # the update whose batch consumed the episode
    "task_id": pa.string(),
    "reward": pa.float64(),  # outcome reward in [0, 1]
    "success": pa.bool_(),
    "n_turns": pa.int64(),
    "gen_tokens": pa.int64(),  # policy-generated tokens (loss mask 1)
    "length": pa.int64(),  # tokens in the flattened episode (prompt + actions + observations)
    "truncated": pa.bool_(),  # stopped by the turn or token budget, not by the agent
    "staleness": pa.int64(),  # update - policy_version at training time
    "policy_version": pa.int64(),  # version that generated the episode (the oldest, if it changed mid-episode)
    "tool_errors": pa.int64(),  # turns with an invalid action or an execution error
    "overlong_turns": pa.int64(),  # turns longer than the length-penalty threshold
    "split": pa.string(),  # "train", "eval" or "impossible" (the cheating probe)
    "baseline_informed": pa.bool_(),  # SPO's baseline for the task came from data (offline pass or a visit)
    "graded_reward": pa.float64(),  # the grader's reward before `on_tamper` (null where nothing was graded)
    "tamper_flags": pa.string(),  # why the grade may be forged, "; "-joined ("" none; null where not graded)
}
"""One row per finished episode."""


_BOOLS = (bool, np.bool_)


def _coerce(column: str, dtype: pa.DataType, value: Any) -> Any:
    """`value` as the Python type Arrow stores in `column`, or ValueError naming column, value and type."""
    if value is None:
        return None
    bad = ValueError(f"column {column!r}: {type(value).__name__} value {value!r} does not fit type {dtype}")
    if pa.types.is_integer(dtype):
        whole = isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and float(value).is_integer())
        if whole and not isinstance(value, _BOOLS) and -(2**63) <= int(value) < 2**63:
            return int(value)
        raise bad
    if pa.types.is_floating(dtype):
        if isinstance(value, numbers.Real) and not isinstance(value, _BOOLS):
            return float(value)
        raise bad
    if pa.types.is_boolean(dtype):
        if isinstance(value, _BOOLS):
            return bool(value)
        raise bad
    if pa.types.is_string(dtype):
        if isinstance(value, str):
            return value
        raise bad
    raise TypeError(f"column {column!r}: unsupported column type {dtype}")


def _metadata(provenance: dict) -> dict[bytes, bytes]:
    return {PROVENANCE_KEY: json.dumps(provenance).encode(), CONFIG_KEY: json.dumps(provenance["config"]).encode()}


class MetricsLog:
    """Rows kept in memory; `flush()` writes them all, atomically, to `path` with provenance in the metadata."""

    def __init__(
        self, path: str | os.PathLike, provenance: dict, schema_columns: Mapping[str, pa.DataType] = METRIC_COLUMNS
    ) -> None:
        if not isinstance(provenance, dict) or "config" not in provenance:
            raise ValueError("provenance must be a dict with a 'config' key (use collect_provenance(config))")
        if "update" not in schema_columns:
            raise ValueError(f"schema_columns must contain 'update', got {list(schema_columns)}")
        self.path = Path(path)
        self.provenance = to_json(provenance, "provenance")
        self.columns: dict[str, pa.DataType] = dict(schema_columns)
        self._rows: list[dict[str, Any]] = []
        for leftover in stale_temps(self.path.parent, glob.escape(self.path.name)):
            leftover.unlink(missing_ok=True)  # one writer per log: a temp file is from a killed earlier run

    @property
    def rows(self) -> list[dict[str, Any]]:
        """A copy of the rows appended so far (every column present, None for null)."""
        return [dict(row) for row in self._rows]

    @rows.setter
    def rows(self, rows: list[Mapping[str, Any]]) -> None:
        """Replace all rows (e.g. with those a checkpoint saved), each checked as by `append`; all or nothing."""
        self._rows = [self._checked(row) for row in rows]

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, row: Mapping[str, Any]) -> None:
        """Add one row; unknown columns and ill-typed values raise ValueError, missing columns are null."""
        self._rows.append(self._checked(row))

    def _checked(self, row: Mapping[str, Any]) -> dict[str, Any]:
        unknown = [name for name in row if name not in self.columns]
        if unknown:
            raise ValueError(f"unknown column(s) {unknown} for {self.path.name}; known: {list(self.columns)}")
        if row.get("update") is None:
            raise ValueError(f"row for {self.path.name} has no 'update' value: {dict(row)!r}")
        return {name: _coerce(name, dtype, row.get(name)) for name, dtype in self.columns.items()}

    def truncate(self, update: int) -> int:
        """Drop rows with `update` greater than the given one (those logged after the checkpoint); return how many."""
        kept = [row for row in self._rows if row["update"] <= update]
        dropped = len(self._rows) - len(kept)
        self._rows = kept
        return dropped

    def to_table(self) -> pa.Table:
        schema = pa.schema(list(self.columns.items()), metadata=_metadata(self.provenance))
        return pa.Table.from_pylist(self._rows, schema=schema)

    def flush(self) -> None:
        """Write every row to `path`: a temporary file in the same directory, fsync, then os.replace."""
        table = self.to_table()
        with atomic_path(self.path) as tmp:
            pq.write_table(table, tmp)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        provenance: dict | None = None,
        schema_columns: Mapping[str, pa.DataType] | None = None,
    ) -> MetricsLog:
        """A log holding the rows of the file at `path`, ready to append to (resume).

        `schema_columns` defaults to the file's own columns; if given, the file must have exactly those.
        `provenance` defaults to the file's; a new one keeps the file's under "previous".
        """
        table = pq.read_table(path)
        file_columns = {field.name: field.type for field in table.schema}
        if schema_columns is not None and file_columns != dict(schema_columns):
            raise ValueError(f"{path}: columns {file_columns} differ from the expected {dict(schema_columns)}")
        old = _read_provenance(table.schema, path)
        if provenance is None:
            provenance = old
        else:
            if provenance.get("config") != old.get("config"):
                warnings.warn(
                    f"{path}: resuming with a config that differs from the one the log was written with", stacklevel=2
                )
            provenance = {**provenance, "previous": old}
        log = cls(path, provenance, file_columns)
        log._rows = table.to_pylist()
        return log


def _read_provenance(schema: pa.Schema, path: Any) -> dict:
    meta = schema.metadata or {}
    if PROVENANCE_KEY not in meta:
        raise ValueError(f"{path}: no {PROVENANCE_KEY.decode()} in the Parquet metadata (not a harness log?)")
    return json.loads(meta[PROVENANCE_KEY])


def read_log(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """The table as a DataFrame (ints as nullable Int64, bools as nullable boolean) and its provenance dict.

    pandas is imported here, not at module level: the trainer only writes logs, and the import costs it ~0.4 s."""
    import pandas as pd

    table = pq.read_table(path)
    mapping = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    return table.to_pandas(types_mapper=mapping.get), _read_provenance(table.schema, path)
