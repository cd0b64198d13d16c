"""How often the collapse rule fires on noise alone, and how often on a real collapse: by simulation, not from
the results of any study.

With a few episodes per update, a run whose true success p never changes logs Binomial(batch, p) / batch per
update; its EMA wanders, its running peak is the top of that wander, and the EMA can sit under
`drop_fraction x peak` for `patience` updates by chance. So the rule's false-positive rate (FPR) depends on the
batch size and the run length as much as on its own settings, and a threshold is only meaningful with its FPR.

Here seeded runs are simulated and judged by the logs' own rule (`success_drop_rows` is `judge`'s success rule
vectorised over runs; the tests hold the two equal). FPR = the fraction of constant-success runs flagged; its
worst case is taken over constant success 10-50% (`FPR_LEVELS`, the band where runs of these studies live).
Power = the fraction flagged when success falls from `p_before` to `p_after` at `drop_at` (default: the middle).
Only the success rule is simulated: the non-finite and entropy rules do not fire on success noise.
Every scenario draws from its own generator (`scenario_rng`), so a number does not depend on which others were
computed with it, and `calibrate`'s table agrees with `false_positive_rate` and `power` run alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from trainer.analysis.collapse import CollapseCriterion

FPR_LEVELS: tuple[float, ...] = (0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50)
"""Constant true success levels the worst FPR is taken over."""
N_RUNS = 2000
"""Simulated runs per scenario: a Monte Carlo standard error of about 0.5 points at an FPR of 5%."""
SEED = 0
MAX_FPR = 0.05
"""The target: the rule flags at most 5% of constant-success runs, at any level in `FPR_LEVELS`."""
MIN_POWER = 0.9
"""... while still flagging at least 90% of runs that collapse from 30% to 2% success in the middle."""


def scenario_rng(seed: int, p: float, p_after: float | None = None, drop_at: int | None = None) -> np.random.Generator:
    """A generator for one scenario, keyed by the seed and the scenario (not by the order of computation)."""
    key = [int(seed), round(p * 1e6)]
    if p_after is not None:
        key += [round(p_after * 1e6), int(drop_at if drop_at is not None else -1) + 1]
    return np.random.default_rng(key)


def simulate_success(
    n_runs: int,
    n_updates: int,
    batch_size: int,
    p: float,
    rng: np.random.Generator,
    p_after: float | None = None,
    drop_at: int | None = None,
) -> np.ndarray:
    """(n_runs, n_updates) logged success rates: Binomial(batch_size, p) / batch_size per update, with the
    true success `p_after` from update `drop_at` on when both are given (a collapse with a known answer)."""
    if n_runs < 1 or n_updates < 1 or batch_size < 1:
        raise ValueError(
            f"simulate_success: n_runs, n_updates, batch_size must be >= 1, got {n_runs}, {n_updates}, {batch_size}"
        )
    probs = np.full(n_updates, float(p))
    if p_after is not None:
        probs[(n_updates // 2 if drop_at is None else drop_at) :] = p_after
    if not ((probs >= 0) & (probs <= 1)).all():
        raise ValueError(f"simulate_success: success probabilities must lie in [0, 1], got {p!r}, {p_after!r}")
    return rng.binomial(batch_size, probs, size=(n_runs, n_updates)) / batch_size


def ema_rows(success: np.ndarray, span: int) -> np.ndarray:
    """`ema` of every row at once (pandas' column-wise ewm on the transpose: the same numbers, bit for bit)."""
    frame = pd.DataFrame(np.asarray(success, dtype=float).T)
    return frame.ewm(span=int(span), adjust=False, ignore_na=True).mean().to_numpy().T


def _drop_start(success_ema: np.ndarray, drop_fraction: float, min_peak: float, warmup: int) -> np.ndarray:
    """Per row, the first index t >= warmup from which the EMA stays under the line to the end (the length
    when it ends above it): `first_sustained`'s t before the patience check."""
    peak = np.fmax.accumulate(success_ema, axis=1)
    with np.errstate(invalid="ignore"):
        dropped = (peak >= min_peak) & (success_ema < drop_fraction * peak)
    n = dropped.shape[1]
    above = ~dropped
    last_above = n - 1 - np.argmax(above[:, ::-1], axis=1)
    start = np.where(above.any(axis=1), last_above + 1, 0)
    return np.maximum(start, warmup)


def success_drop_rows(success_ema: np.ndarray, criterion: CollapseCriterion) -> np.ndarray:
    """`judge`'s success rule on many runs of equal length: each row's collapse index, -1 where none."""
    success_ema = np.atleast_2d(np.asarray(success_ema, dtype=float))
    start = _drop_start(success_ema, criterion.drop_fraction, criterion.min_peak, criterion.warmup)
    return np.where(success_ema.shape[1] - start >= criterion.patience, start, -1)


def flag_rate(
    criterion: CollapseCriterion,
    batch_size: int,
    n_updates: int,
    p: float,
    n_runs: int = N_RUNS,
    seed: int = SEED,
    p_after: float | None = None,
    drop_at: int | None = None,
) -> float:
    """The fraction of simulated runs (constant `p`, or `p` -> `p_after` at `drop_at`) the rule flags."""
    rng = scenario_rng(seed, p, p_after, drop_at)
    success = simulate_success(n_runs, n_updates, batch_size, p, rng, p_after, drop_at)
    return float(np.mean(success_drop_rows(ema_rows(success, criterion.ema_span), criterion) >= 0))


def false_positive_rate(
    criterion: CollapseCriterion,
    batch_size: int,
    n_updates: int,
    levels: Sequence[float] = FPR_LEVELS,
    n_runs: int = N_RUNS,
    seed: int = SEED,
) -> tuple[float, dict[float, float]]:
    """(worst FPR over `levels`, FPR per level) for runs of constant true success."""
    per_level = {float(p): flag_rate(criterion, batch_size, n_updates, p, n_runs, seed) for p in levels}
    return max(per_level.values()), per_level


def power(
    criterion: CollapseCriterion,
    batch_size: int,
    n_updates: int,
    p_before: float = 0.3,
    p_after: float = 0.02,
    drop_at: int | None = None,
    n_runs: int = N_RUNS,
    seed: int = SEED,
) -> float:
    """The fraction of runs flagged whose true success falls from `p_before` to `p_after` at `drop_at`
    (default: the middle update)."""
    drop_at = n_updates // 2 if drop_at is None else drop_at
    return flag_rate(criterion, batch_size, n_updates, p_before, n_runs, seed, p_after, drop_at)


def calibrate(
    batch_size: int,
    n_updates: int,
    ema_spans: Sequence[int] = (5, 10, 15, 20),
    drop_fractions: Sequence[float] = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    patiences: Sequence[int] = (5, 10, 15, 20, 25, 30),
    warmup: int | None = None,
    min_peak: float = 0.1,
    levels: Sequence[float] = FPR_LEVELS,
    p_before: float = 0.3,
    p_after: float = 0.02,
    drop_at: int | None = None,
    n_runs: int = N_RUNS,
    seed: int = SEED,
) -> pd.DataFrame:
    """Worst FPR and power of every setting on the grid, one row each (the same simulated runs for all).

    `warmup` defaults to a fifth of the run (20 of 100 updates: past the EMA's start-up) and `min_peak` is
    kept at 10%; the grid spans the settings that trade false alarms for late or shallow collapses."""
    warmup = max(n_updates // 5, 1) if warmup is None else warmup
    drop_at = n_updates // 2 if drop_at is None else drop_at
    null = {float(p): simulate_success(n_runs, n_updates, batch_size, p, scenario_rng(seed, p)) for p in levels}
    alt = simulate_success(
        n_runs, n_updates, batch_size, p_before, scenario_rng(seed, p_before, p_after, drop_at), p_after, drop_at
    )
    rows = []
    for span in ema_spans:
        null_ema = {p: ema_rows(x, span) for p, x in null.items()}
        alt_ema = ema_rows(alt, span)
        for drop in drop_fractions:
            null_tail = {p: n_updates - _drop_start(e, drop, min_peak, warmup) for p, e in null_ema.items()}
            alt_start = _drop_start(alt_ema, drop, min_peak, warmup)
            for patience in patiences:
                fpr = {p: float(np.mean(tail >= patience)) for p, tail in null_tail.items()}
                flagged = n_updates - alt_start >= patience
                worst = max(fpr, key=fpr.get)
                rows.append(
                    {
                        "ema_span": span,
                        "warmup": warmup,
                        "drop_fraction": drop,
                        "min_peak": min_peak,
                        "patience": patience,
                        "worst_fpr": fpr[worst],
                        "worst_level": worst,
                        "power": float(np.mean(flagged)),
                        "median_delay": (float(np.median(alt_start[flagged] - drop_at)) if flagged.any() else np.nan),
                    }
                )
    return pd.DataFrame(rows)


def feasible(table: pd.DataFrame, max_fpr: float = MAX_FPR, min_power: float = MIN_POWER) -> pd.DataFrame:
    """The settings of `calibrate`'s table with worst FPR <= `max_fpr` and power >= `min_power`, gentlest first.

    Gentlest = the least patience (with patience P a collapse in a run's last P updates is never seen), then the
    highest drop fraction (a shallower collapse counts), then the shortest EMA span (the least lag)."""
    ok = table[(table["worst_fpr"] <= max_fpr) & (table["power"] >= min_power)]
    return ok.sort_values(["patience", "drop_fraction", "ema_span"], ascending=[True, False, True], kind="stable")


def recommend(table: pd.DataFrame, max_fpr: float = MAX_FPR, min_power: float = MIN_POWER) -> pd.Series:
    """The gentlest feasible setting of `calibrate`'s table (see `feasible`)."""
    ok = feasible(table, max_fpr, min_power)
    if ok.empty:
        raise ValueError(
            f"recommend: no setting on the grid has worst FPR <= {max_fpr:.0%} and power >= "
            f"{min_power:.0%}; widen the grid"
        )
    return ok.iloc[0]


def criterion_of(row: pd.Series, base: CollapseCriterion = CollapseCriterion()) -> CollapseCriterion:  # noqa: B008
    """The `CollapseCriterion` of one row of `calibrate`'s table (other fields from `base`)."""
    return replace(
        base,
        ema_span=int(row["ema_span"]),
        warmup=int(row["warmup"]),
        drop_fraction=float(row["drop_fraction"]),
        min_peak=float(row["min_peak"]),
        patience=int(row["patience"]),
    )
