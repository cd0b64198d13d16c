"""A collapse detector anyone can rerun: the papers marked collapsed runs by eye; this is the rule we apply.

A run collapses at the EARLIEST update at which any of three signs appears (on a tie, the reason reported is
a non-finite value before a success drop before the entropy floor):

1. **Success collapse (the main rule).** Smooth the training success rate with the figures' EMA (span 5,
   `adjust=False`, from the first observation; see `ema`). Let `peak_t` be the running maximum of the EMA up to
   update t. The run has collapsed at t if t is past the warm-up, `peak_t >= min_peak`, and from t to the last
   logged update the EMA stays below `drop_fraction * peak_t`, for at least `patience` updates. "Stays below"
   is what "does not recover" means: a dip that climbs back above the line is not a collapse, and the verdict
   moves to the start of the final, unrecovered drop. (While the EMA is below the line the peak cannot rise, so
   the line is fixed for the whole tail.) `min_peak` keeps a run that never learned from "collapsing" from 2%
   to 0%; `patience` keeps the last few noisy updates of a run from deciding its verdict.
2. **A non-finite value** (NaN or +-inf, not null) in one of `nonfinite` (default: loss and grad norm), at
   its first occurrence, warm-up or not: a diverged optimiser has collapsed whatever its success says.
3. **Entropy under a floor** (off by default: the entropy scale of a tiny model has nothing to do with a 2B
   one, so a floor must be chosen per study): past the warm-up, the raw policy entropy stays below
   `entropy_floor` from t to the end, for at least `patience` updates.

Defaults: warm-up 10 updates (the first tenth of the paper's 100), drop to under half the peak, a peak of at
least 10% success, patience 5 updates (one EMA span). All are `CollapseCriterion` fields, set from the
workflow config; the verdict, its update and the reason go into the per-run table and the summary.
With few episodes per update, binomial noise alone makes a run of constant success "collapse" often at these
defaults, so a study should set them for its batch size and run length: `calibration.py` measures the rule's
false-positive rate and power by simulation (`benchmarks/calibrate_collapse.py` picks settings), and the
summary states the rate for the study's own settings.

Updates are the logged `update` values (0-based in the trainer), and "from t to the end" is over the rows the
run logged: a run that stops early is judged on what it logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from trainer.analysis.cell_logs import NONFINITE_COLUMNS, RUN_KEYS


def ema(values: pd.Series | np.ndarray | list[float], span: int) -> np.ndarray:
    """Exponential moving average with alpha = 2 / (span + 1), started at the first observation.

    `adjust=False` is the plain recursion y_0 = x_0, y_t = (1 - alpha) y_{t-1} + alpha x_t: "an EMA from the
    first observation", as the paper's captions say. pandas' default `adjust=True` is a bias-corrected weighted
    mean instead, which weights the first points differently ([1, 3] -> 2.2 rather than 1.667 at span 5).
    `ignore_na=True`: a missing value (NaN) is skipped and the previous average carried forward, so one
    unlogged update does not change the weights of the others; leading NaNs stay NaN.
    """
    if not isinstance(span, (int, np.integer)) or isinstance(span, bool) or span < 1:
        raise ValueError(f"ema span must be a positive integer, got {span!r}")
    series = pd.Series(np.asarray(values, dtype=float))
    return series.ewm(span=int(span), adjust=False, ignore_na=True).mean().to_numpy()


@dataclass(frozen=True)
class CollapseCriterion:
    """When a run counts as collapsed (see the module docstring for the rule)."""

    ema_span: int = 5
    """Span of the EMA of training success the rule looks at (the figures' smoothing)."""
    warmup: int = 10
    """Updates (rows) at the start of a run in which the success and entropy rules cannot fire."""
    drop_fraction: float = 0.5
    """Collapse when the success EMA stays below this fraction of its running peak."""
    min_peak: float = 0.1
    """A run whose success EMA never reached this (as a fraction, 0.1 = 10%) cannot collapse by the success
    rule: it never learned."""
    patience: int = 5
    """The drop (or the entropy under the floor) must last at least this many updates, up to the run's end."""
    nonfinite: tuple[str, ...] = NONFINITE_COLUMNS
    """Columns whose first NaN or +-inf marks a collapse; () turns the rule off."""
    entropy_floor: float | None = None
    """Collapse when the policy entropy stays below this after the warm-up; None turns the rule off."""

    def __post_init__(self) -> None:
        checks = {
            "ema_span": _is_int(self.ema_span) and self.ema_span >= 1,
            "warmup": _is_int(self.warmup) and self.warmup >= 0,
            "drop_fraction": _is_real(self.drop_fraction) and 0 < self.drop_fraction < 1,
            "min_peak": _is_real(self.min_peak) and 0 < self.min_peak <= 1,
            "patience": _is_int(self.patience) and self.patience >= 1,
            "entropy_floor": self.entropy_floor is None
            or (_is_real(self.entropy_floor) and np.isfinite(self.entropy_floor)),
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"collapse criterion {name}: bad value {getattr(self, name)!r}")
        nonfinite = (self.nonfinite,) if isinstance(self.nonfinite, str) else tuple(self.nonfinite)
        unknown = [c for c in nonfinite if c not in NONFINITE_COLUMNS]
        if unknown:
            raise ValueError(
                f"collapse criterion nonfinite: {unknown} not among the flagged columns {list(NONFINITE_COLUMNS)}"
            )
        object.__setattr__(self, "nonfinite", nonfinite)

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None) -> CollapseCriterion:
        """From a config mapping (the workflow's `collapse:` section); an unknown key raises ValueError."""
        params = dict(params or {})
        known = [f.name for f in fields(cls)]
        unknown = [key for key in params if key not in known]
        if unknown:
            raise ValueError(f"collapse criterion: unknown key(s) {unknown}; known: {known}")
        return cls(**params)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclass(frozen=True)
class CollapseVerdict:
    """The detector's answer for one run."""

    collapsed: bool
    update: int | None
    """The logged `update` at which the run collapsed; None if it did not."""
    reason: str | None
    """"success_drop", "nonfinite_<column>" or "entropy_floor"; None if it did not collapse."""


def first_sustained(condition: np.ndarray, start: int, patience: int) -> int | None:
    """The first index t >= start with `condition[t:]` all True and at least `patience` long, else None."""
    condition = np.asarray(condition, dtype=bool)
    n = len(condition)
    if n == 0:
        return None
    # Index of the first True in the all-True suffix: one past the last False.
    false = np.flatnonzero(~condition)
    t = max(int(false[-1]) + 1 if len(false) else 0, start)
    return t if n - t >= patience else None


def ema_by_run(frame: pd.DataFrame, span: int, column: str = "success_rate") -> np.ndarray:
    """`ema(frame[column], span)` for every run at once, aligned with `frame`'s rows.

    `frame` must be sorted by run and update (as `load_metrics` returns it); one grouped `ewm` call instead of
    a Python loop over runs, with the same `adjust=False, ignore_na=True` definition."""
    if not isinstance(span, (int, np.integer)) or isinstance(span, bool) or span < 1:
        raise ValueError(f"ema span must be a positive integer, got {span!r}")
    grouped = frame.groupby(list(RUN_KEYS), sort=False)[column]
    smoothed = grouped.ewm(span=int(span), adjust=False, ignore_na=True).mean()
    return smoothed.reset_index(level=list(range(len(RUN_KEYS))), drop=True).reindex(frame.index).to_numpy()


def judge(
    success_ema: np.ndarray,
    nonfinite: Mapping[str, np.ndarray] | None = None,
    entropy: np.ndarray | None = None,
    criterion: CollapseCriterion = CollapseCriterion(),
) -> tuple[int | None, str | None]:
    """The rule on one run's arrays in update order: (row index of the collapse, reason), or (None, None).

    `success_ema` is the smoothed success (`ema`); `nonfinite` maps a column name to its per-row NaN/inf flags
    (only the criterion's `nonfinite` columns are looked at); `entropy` is needed only with `entropy_floor`."""
    candidates: list[tuple[int, int, str]] = []  # (row index, priority on a tie, reason)
    success_ema = np.asarray(success_ema, dtype=float)
    peak = np.fmax.accumulate(success_ema)  # fmax: leading NaNs (no success yet) do not poison the peak
    with np.errstate(invalid="ignore"):
        dropped = (peak >= criterion.min_peak) & (success_ema < criterion.drop_fraction * peak)
    t = first_sustained(dropped, criterion.warmup, criterion.patience)
    if t is not None:
        candidates.append((t, 1, "success_drop"))
    for column in criterion.nonfinite:
        bad = (nonfinite or {}).get(column)
        if bad is not None and np.any(bad):
            candidates.append((int(np.argmax(bad)), 0, f"nonfinite_{column}"))
    if criterion.entropy_floor is not None:
        if entropy is None:
            raise ValueError("collapse: entropy_floor is set but the run has no 'entropy' values")
        with np.errstate(invalid="ignore"):
            low = np.asarray(entropy, dtype=float) < criterion.entropy_floor
        t = first_sustained(low, criterion.warmup, criterion.patience)
        if t is not None:
            candidates.append((t, 2, "entropy_floor"))
    if not candidates:
        return None, None
    index, _, reason = min(candidates)
    return index, reason


def nonfinite_flags(run: pd.DataFrame, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per column: the `nonfinite_<col>` flags of `load_metrics` when present, else NaN/inf tests on `<col>`
    (a plain DataFrame cannot tell null from NaN, so there a null counts as non-finite); absent columns skipped."""
    flags = {}
    for column in columns:
        if f"nonfinite_{column}" in run.columns:
            flags[column] = run[f"nonfinite_{column}"].to_numpy(dtype=bool)
        elif column in run.columns:
            flags[column] = ~np.isfinite(run[column].to_numpy(dtype=float))
    return flags


def detect_collapse(run: pd.DataFrame, criterion: CollapseCriterion = CollapseCriterion()) -> CollapseVerdict:
    """Apply the criterion to one run's metrics rows (any order; sorted by `update` here).

    Needs `update` and `success_rate`; `entropy` if the entropy rule is on; see `nonfinite_flags`."""
    for column in ("update", "success_rate"):
        if column not in run.columns:
            raise ValueError(f"detect_collapse: the run's table has no {column!r} column")
    if len(run) == 0:
        raise ValueError("detect_collapse: the run has no rows")
    run = run.sort_values("update", kind="stable")
    index, reason = judge(
        ema(run["success_rate"].to_numpy(dtype=float), criterion.ema_span),
        nonfinite_flags(run, criterion.nonfinite),
        run["entropy"].to_numpy(dtype=float) if "entropy" in run.columns else None,
        criterion,
    )
    if index is None:
        return CollapseVerdict(False, None, None)
    return CollapseVerdict(True, int(run["update"].iloc[index]), reason)


DEGRADATION_ALPHA = 0.05
"""The false-positive rate of the degradation verdict for a run of constant success, at most (any level)."""


def degradation_threshold(batch, updates, alpha: float = DEGRADATION_ALPHA) -> np.ndarray:
    """The learning (`gain`: last fifth's success minus the first fifth's, fractions) below which a run counts as
    degraded (elementwise over `batch` and `updates`): its end is worse than its start by more than binomial noise
    gives a run of constant success with probability `alpha`, one-sided, at the worst level (50%: a variance of 1/4
    per episode), with `batch` episodes per update and a fifth of `updates` (at least one) in each window, plus a
    continuity correction.

    Why beside the collapse rule: that rule looks for a fall from the run's peak, so it misses a slow slide from the
    start (minicpm-tiny's AdamW at 3e-4: 9-12 points down, 0 of 3 flagged) and flags a flat curve at a few percent
    whose noisy peak it measures from; this verdict needs neither a peak nor a curve (the published runs' `gain`
    suffices, so every published study is re-judged by it). The threshold follows from the study's shape alone
    (6.8 points at 16 episodes x 20 updates), fixed before the studies that use it ran; the two cases above were
    looked at after."""
    from scipy.stats import norm

    from trainer.analysis.summary import LEARNING_FRACTION, window_size

    updates = np.asarray(updates, dtype=int)
    fifth = np.vectorize(lambda n: window_size(int(n), LEARNING_FRACTION), otypes=[float])(updates)
    episodes = np.asarray(batch, dtype=float) * fifth
    return norm.ppf(1 - alpha) * np.sqrt(2 * 0.25 / episodes) + 1 / episodes


def degraded(gain: np.ndarray | pd.Series, batch: np.ndarray | pd.Series | float, updates: np.ndarray | pd.Series):
    """Per run: its `gain` lies below minus `degradation_threshold` for its episodes per update and logged updates
    (False where the batch is unknown: NaN)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        threshold = degradation_threshold(batch, updates)
    return np.asarray(gain, dtype=float) < -np.where(np.isfinite(threshold), threshold, np.inf)
