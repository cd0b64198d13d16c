"""Synthetic cell logs with known shapes, for the tests, the benchmark and a look at the figures without training.

A run's success follows a logistic rise from `start` to `target` (fractions) and is then sampled as
successes out of `batch` episodes per update, so it has the trainer's granularity and noise. `collapse_at`
makes it fall to near zero from that update on (and, for a diverged run, `nan_loss_at` writes NaN losses),
so a detector has a known answer. Diagnostics have plausible scales: Adam's grad norm grows after a collapse,
Muon's update RMS is flat. Files are written with the trainer's `METRIC_COLUMNS` schema and a provenance
record marked synthetic, in the Hive layout the workflow uses.
`companion_grid` writes the companion study's shape: estimators as the recipe key, the three optimizers,
and the gradient SNR column (or, to test a log without it, none). `stability_grid` writes an lr sweep (lr=... folders)
whose best and collapsing lrs are known; `horizon_grid` one model per horizon, success falling with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.analysis.cell_logs import lr_label
from trainer.logs.parquet_log import CONFIG_KEY, EPISODE_COLUMNS, METRIC_COLUMNS, PROVENANCE_KEY


def synthetic_metrics(
    n_updates: int,
    target: float,
    rng: np.random.Generator,
    start: float = 0.05,
    collapse_at: int | None = None,
    nan_loss_at: int | None = None,
    optimizer: str = "muon",
    batch: int = 16,
    eval_every: int = 10,
) -> dict[str, np.ndarray]:
    """One run's metrics columns (every `METRIC_COLUMNS` name) for updates 0..n_updates-1."""
    u = np.arange(n_updates)
    rise = 1 / (1 + np.exp(-(u - 0.3 * n_updates) / max(0.08 * n_updates, 1e-9)))
    p = start + (target - start) * rise
    if collapse_at is not None:
        p = np.where(u >= collapse_at, 0.01, p)
    success = rng.binomial(batch, np.clip(p, 0, 1)) / batch
    adam = optimizer == "adam"
    late = (u >= collapse_at) if collapse_at is not None else np.zeros(n_updates, bool)
    grad = np.exp(rng.normal(0, 0.2, n_updates)) * (1.0 if not adam else 1.5) * np.where(late, 8.0, 1.0)
    eval_success = np.full(n_updates, np.nan)
    if eval_every:
        eval_success[eval_every - 1 :: eval_every] = np.clip(p[eval_every - 1 :: eval_every] - 0.05, 0, 1)
        eval_success[-1] = max(p[-1] - 0.05, 0.0)
    loss = rng.normal(0, 0.05, n_updates)
    if nan_loss_at is not None:
        loss[nan_loss_at:] = np.nan
    columns = {
        "update": u,
        "policy_version": u + 1,
        "success_rate": success,
        "reward_mean": success,
        "n_trajectories": np.full(n_updates, batch),
        "gen_tokens": rng.integers(800, 1600, n_updates),
        "response_len_mean": rng.normal(80, 5, n_updates),
        "turns_mean": rng.normal(6, 0.5, n_updates),
        "tool_error_rate": np.clip(rng.normal(0.1, 0.03, n_updates), 0, 1),
        "overlong_rate": np.clip(rng.normal(0.05, 0.02, n_updates), 0, 1),
        "advantage_std": np.abs(rng.normal(1, 0.1, n_updates)),
        "entropy": 1.2 * np.exp(-u / (n_updates * 1.5)) * np.where(late, 0.3, 1.0) + rng.normal(0, 0.02, n_updates),
        "approx_kl": np.abs(rng.normal(0.002 if not adam else 0.005, 0.001, n_updates)) * np.where(late, 5, 1),
        "clip_frac_low": np.clip(rng.normal(0.02, 0.005, n_updates), 0, 1),
        "clip_frac_high": np.clip(rng.normal(0.03, 0.005, n_updates), 0, 1),
        "tis_weight_mean": np.clip(rng.normal(0.98, 0.01, n_updates), 0, 2),
        "tis_truncated_frac": np.clip(rng.normal(0.01, 0.003, n_updates), 0, 1),
        "staleness_mean": np.abs(rng.normal(0.6, 0.1, n_updates)),
        "staleness_max": np.full(n_updates, 2.0),
        "grad_norm": grad,
        "update_rms": (np.full(n_updates, 0.02) if not adam else 0.004 * grad) * np.exp(rng.normal(0, 0.05, n_updates)),
        "update_spectral_norm": (np.full(n_updates, 0.9) if not adam else 0.3 * grad)
        * np.exp(rng.normal(0, 0.05, n_updates)),
        "lr": np.full(n_updates, 1e-3),
        "loss": loss,
        "eval_success": eval_success,
        "rollout_s": np.abs(rng.normal(2, 0.1, n_updates)),
        "train_s": np.abs(rng.normal(1, 0.1, n_updates)),
    }
    columns["wall_s"] = np.cumsum(columns["rollout_s"] + columns["train_s"])
    return columns


def write_metrics(path: str | os.PathLike, columns: dict[str, Sequence], config: dict | None = None) -> Path:
    """Write one metrics.parquet with the trainer's schema; NaN in `eval_success` becomes null (not evaluated).
    Like the trainer's, its metadata holds the cell's config (`run.updates` = the rows, unless `config` says
    otherwise), and an `episodes.parquet` beside it has one training episode per update, so a synthetic cell
    passes `logs.check_cell_logs` as a finished real one does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    unknown = [c for c in columns if c not in METRIC_COLUMNS]
    if unknown:
        raise ValueError(f"write_metrics: unknown column(s) {unknown}")
    arrays = {}
    for name, dtype in METRIC_COLUMNS.items():
        if name not in columns:
            continue
        values = np.asarray(columns[name])
        mask = np.isnan(values) if name == "eval_success" else None
        arrays[name] = pa.array(values, type=dtype, mask=mask)
    updates = np.asarray(columns["update"], dtype=np.int64)
    config = {**(config or {}), "run": {"updates": len(updates), **(config or {}).get("run", {})}}
    provenance = {"config": config, "synthetic": True}
    metadata = {PROVENANCE_KEY: json.dumps(provenance).encode(), CONFIG_KEY: json.dumps(provenance["config"]).encode()}
    schema = pa.schema([(n, METRIC_COLUMNS[n]) for n in arrays], metadata=metadata)
    pq.write_table(pa.table(arrays, schema=schema), path)
    episodes = {
        "update": pa.array(updates, type=EPISODE_COLUMNS["update"]),
        "split": pa.array(["train"] * len(updates), type=EPISODE_COLUMNS["split"]),
    }
    pq.write_table(pa.table(episodes), path.with_name("episodes.parquet"))
    return path


def cell_path(
    base_dir: str | os.PathLike,
    model: str,
    recipe: str,
    optimizer: str,
    seed: int,
    lr: float | None = None,
    arm: str | None = None,
) -> Path:
    """`<base_dir>/model=M/recipe=R/optimizer=O/seed=S/metrics.parquet`, the workflow's layout; with `arm`,
    `.../optimizer=O/arm=A/...`; with `lr`, `.../lr=L/seed=S/...` (L as `lr_label` writes it)."""
    folder = Path(base_dir) / f"model={model}" / f"recipe={recipe}" / f"optimizer={optimizer}"
    if arm is not None:
        folder = folder / f"arm={arm}"
    if lr is not None:
        folder = folder / f"lr={lr_label(lr)}"
    return folder / f"seed={seed}" / "metrics.parquet"


def synthetic_grid(
    base_dir: str | os.PathLike,
    models: Sequence[str],
    recipes: Sequence[str],
    optimizers: Sequence[str],
    seeds: Sequence[int],
    n_updates: int = 100,
    seed: int = 0,
    adam_collapse: float = 0.8,
    max_cells: int | None = None,
) -> list[Path]:
    """Write one synthetic log per cell and return their paths (the explicit input list).

    Cells run models, then recipes, optimizers, seeds (innermost); `max_cells` stops after that many.
    Muon runs rise to a recipe- and model-dependent target and never collapse; an Adam run collapses with
    probability `adam_collapse` at an update drawn from the middle of the run."""
    rng = np.random.default_rng(seed)
    paths = []
    for m, model in enumerate(models):
        for r, recipe in enumerate(recipes):
            target = 0.35 + 0.4 * ((r * 7 + m * 3) % 8) / 8 + (0.15 if recipe == "full" else 0.0)
            for optimizer in optimizers:
                for s in seeds:
                    if max_cells is not None and len(paths) >= max_cells:
                        return paths
                    collapse_at = None
                    if optimizer == "adam" and rng.random() < adam_collapse:
                        collapse_at = int(rng.integers(int(0.35 * n_updates), int(0.8 * n_updates) + 1))
                    columns = synthetic_metrics(
                        n_updates,
                        min(target - (0.1 if optimizer == "adam" else 0), 0.95),
                        rng,
                        collapse_at=collapse_at,
                        optimizer=optimizer,
                    )
                    paths.append(
                        write_metrics(
                            cell_path(base_dir, model, recipe, optimizer, s),
                            columns,
                            {"model": model, "recipe": recipe, "optimizer": optimizer, "seed": s},
                        )
                    )
    return paths


COMPANION_TARGETS: dict[str, dict[str, float]] = {
    "grpo": {"adam": 0.3, "muon": 0.5, "adam_high_lr": 0.2},
    "gigpo": {"adam": 0.35, "muon": 0.6, "adam_high_lr": 0.25},
    "graphgpo": {"adam": 0.45, "muon": 0.65, "adam_high_lr": 0.3},
}
"""Success each companion cell rises to: Muon above AdamW, as the companion reports; unknown cells get 0.4."""


def companion_grid(
    base_dir: str | os.PathLike,
    model: str,
    estimators: Sequence[str],
    optimizers: Sequence[str],
    seeds: Sequence[int],
    n_updates: int = 60,
    seed: int = 0,
    eval_every: int = 10,
    grad_snr: bool = True,
) -> list[Path]:
    """Companion-shaped logs (estimator as the recipe key): one per estimator x optimizer x seed, paths returned.

    Each run is `synthetic_metrics` with the `COMPANION_TARGETS` level (AdamW's diagnostics for both AdamW
    optimizers); every "adam_high_lr" run collapses at 60% of its updates, as the companion's high-lr control
    does. `grad_snr` writes a log-normal gradient SNR (Muon's ~0.5, AdamW's ~0.2, a collapsed run's 0.02); False
    writes a log without the column."""
    rng = np.random.default_rng(seed)
    paths = []
    for estimator in estimators:
        for optimizer in optimizers:
            for s in seeds:
                collapse_at = int(0.6 * n_updates) if optimizer == "adam_high_lr" else None
                target = COMPANION_TARGETS.get(estimator, {}).get(optimizer, 0.4)
                columns = synthetic_metrics(
                    n_updates,
                    target,
                    rng,
                    collapse_at=collapse_at,
                    eval_every=eval_every,
                    optimizer="muon" if optimizer == "muon" else "adam",
                )
                if grad_snr:
                    level = np.where(
                        np.arange(n_updates) >= (collapse_at or n_updates), 0.02, 0.5 if optimizer == "muon" else 0.2
                    )
                    columns["grad_snr"] = level * np.exp(rng.normal(0, 0.3, n_updates))
                paths.append(
                    write_metrics(
                        cell_path(base_dir, model, estimator, optimizer, s),
                        columns,
                        {"model": model, "recipe": estimator, "optimizer": optimizer, "seed": s},
                    )
                )
    return paths


STABILITY_BEST_LR: dict[str, float] = {"adam": 3e-4, "muon": 1e-3}
"""The lr at which each optimizer's synthetic runs rise highest (and evaluate best) in `stability_grid`."""


def stability_grid(
    base_dir: str | os.PathLike,
    models: Sequence[str],
    recipes: dict[str, str],
    lrs: Sequence[float],
    seeds: Sequence[int],
    n_updates: int = 60,
    seed: int = 0,
    eval_every: int = 10,
    collapse_factor: float = 10.0,
) -> list[Path]:
    """An lr sweep in the workflow's lr layout: per model, optimizer (`recipes` maps it to its recipe), lr and
    seed. Success rises to a level that peaks at `STABILITY_BEST_LR[optimizer]` and falls with the log-distance
    from it; every run at `collapse_factor` x that lr or above collapses at 60% of its updates. So the selected
    lr is the best one and the stable range is the lrs below the collapsing ones. Paths returned."""
    rng = np.random.default_rng(seed)
    paths = []
    for model in models:
        for optimizer, recipe in recipes.items():
            best = STABILITY_BEST_LR.get(optimizer, 1e-3)
            for lr in lrs:
                target = 0.15 + 0.55 * np.exp(-(np.log10(lr / best) ** 2))
                collapse_at = int(0.6 * n_updates) if lr >= collapse_factor * best * (1 - 1e-9) else None
                for s in seeds:
                    columns = synthetic_metrics(
                        n_updates,
                        target,
                        rng,
                        collapse_at=collapse_at,
                        eval_every=eval_every,
                        optimizer="adam" if optimizer != "muon" else "muon",
                    )
                    paths.append(
                        write_metrics(
                            cell_path(base_dir, model, recipe, optimizer, s, lr=lr),
                            columns,
                            {"model": model, "recipe": recipe, "optimizer": optimizer, "seed": s, "lr": lr},
                        )
                    )
    return paths


def horizon_grid(
    base_dir: str | os.PathLike,
    family: str,
    horizons: Sequence[int],
    recipes: Sequence[str],
    seeds: Sequence[int],
    n_updates: int = 60,
    seed: int = 0,
    eval_every: int = 10,
    adam_collapse_from: int = 8,
) -> list[Path]:
    """One model per horizon, named `{family}-h{K}`, each recipe on its own optimizer: success rises to 0.7 / K**0.5
    (Muon recipes 0.05 higher) from 0.05; every Adam run at horizon >= `adam_collapse_from` collapses at 60% of
    its updates. Paths returned (model names as the horizon study's, e.g. qwen-h4)."""
    rng = np.random.default_rng(seed)
    paths = []
    for k in horizons:
        model = f"{family}-h{k}"
        for recipe in recipes:
            optimizer = "adam" if recipe in ("spo_adam", "grpo", "gigpo", "graphgpo") else "muon"
            target = 0.7 / np.sqrt(k) + (0.05 if optimizer == "muon" else 0.0)
            collapse_at = int(0.6 * n_updates) if optimizer == "adam" and k >= adam_collapse_from else None
            for s in seeds:
                columns = synthetic_metrics(
                    n_updates, target, rng, collapse_at=collapse_at, eval_every=eval_every, optimizer=optimizer
                )
                paths.append(
                    write_metrics(
                        cell_path(base_dir, model, recipe, optimizer, s),
                        columns,
                        {"model": model, "recipe": recipe, "optimizer": optimizer, "seed": s},
                    )
                )
    return paths
