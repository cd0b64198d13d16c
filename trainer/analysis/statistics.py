"""Statistics that hold at 2-5 seeds: Student-t intervals, paired and two-sample differences, the minimum
detectable effect beside a null, Holm's correction.

Why not the percentile bootstrap the summaries used before: over n values it resamples the n values themselves, so
its interval is the spread of the observed values' means and ignores that n = 2 or 3 values underestimate the
spread: with normal data a nominal 95% interval covers the mean about 75% of the time at n = 3 and half the time at n = 2
(`coverage`, tests/unit/test_statistics.py). Student's t accounts for the estimated spread (exact under normality,
close to nominal for bounded outcomes such as a success rate, where the tests measure it too).

* **The unit of replication is the base policy** where runs share one: `unit_means` averages a unit's seeds
  first, so a base with three seeds counts once, and a contrast of two arms is paired within a base
  (`paired_difference`: a one-sample t on the per-base differences, n - 1 degrees of freedom). An interaction
  (a contrast on one set of bases minus on another) is Welch's two-sample t (`welch_difference`), or, with one
  base a side, the difference of differences of four means over seeds (`difference_of_differences`).
* **The minimum detectable effect** of a test (from the noncentral t at the test's degrees of freedom) is the
  smallest true difference it would find with probability `power` (0.8): a null whose MDE is 15 points cannot
  exclude a 10-point effect, and the reports print it beside every null.
* **A run's identity by content** (`run_fingerprint`), so that trainer/meta.py counts a run published by
  two studies once when it pools a contrast over them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

LEVEL = 0.95
"""Every interval's confidence level."""
POWER = 0.8
"""The power at which `minimum_detectable_effect` is stated."""


@dataclass(frozen=True)
class Estimate:
    """A difference (or a mean) with its Student-t interval and test against 0."""

    estimate: float
    low: float
    high: float
    se: float
    df: float
    p: float
    n: int
    """Units (base policies, or seeds where no base is shared) behind it."""
    mde: float
    """Minimum detectable effect of this test at `POWER` (two-sided, alpha = 1 - LEVEL)."""

    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)


NAN_ESTIMATE = Estimate(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0, math.nan)


def _finite(values: Sequence[float], what: str) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if not np.isfinite(values).all():
        raise ValueError(f"{what}: non-finite value(s) in {values.tolist()}")
    return values


def minimum_detectable_effect(se: float, df: float, level: float = LEVEL, power: float = POWER) -> float:
    """The true difference a two-sided t test of standard error `se` detects with probability `power`: the
    noncentrality at which the noncentral t's power is `power` (the textbook `(t(1 - alpha/2) + t(power)) x se`
    gives only 77% power at 2 df), times `se`."""
    if not (se >= 0 and df > 0):
        return math.nan
    critical = stats.t.ppf((1 + level) / 2, df)

    def shortfall(ncp: float) -> float:
        lower = stats.nct.cdf(-critical, df, ncp)  # a vanishing tail, which scipy can return as NaN
        return stats.nct.sf(critical, df, ncp) + np.nan_to_num(lower) - power

    low = critical + stats.t.ppf(power, df)  # the textbook value: a little short of `power` (never above it)
    high = 1.25 * low
    while shortfall(high) < 0:
        high *= 1.25
    return float(optimize.brentq(shortfall, low if shortfall(low) < 0 else 0.0, high) * se)


def _estimate(estimate: float, se: float, df: float, n: int, level: float) -> Estimate:
    if not (df > 0) or not math.isfinite(se):
        return Estimate(estimate, math.nan, math.nan, math.nan, math.nan, math.nan, n, math.nan)
    half = float(stats.t.ppf((1 + level) / 2, df) * se)
    if se == 0:
        p = 1.0 if estimate == 0 else 0.0
    else:
        p = float(2 * stats.t.sf(abs(estimate) / se, df))
    return Estimate(estimate, estimate - half, estimate + half, se, df, p, n, minimum_detectable_effect(se, df, level))


def mean_estimate(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """The mean of `values` with its Student-t interval (n - 1 df); no interval with fewer than two values."""
    values = _finite(values, "mean_estimate")
    if len(values) == 0:
        return NAN_ESTIMATE
    n = len(values)
    se = float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return _estimate(float(values.mean()), se, n - 1, n, level)


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean of `values` (NaN, NaN for fewer than two values)."""
    if not 0 < level < 1:
        raise ValueError(f"t_interval: level must be in (0, 1), got {level!r}")
    est = mean_estimate(values, level)
    return est.low, est.high


def paired_difference(first: Sequence[float], second: Sequence[float], level: float = LEVEL) -> Estimate:
    """`first - second` paired unit by unit (the same base policies, in the same order): a one-sample t on the
    differences."""
    first, second = _finite(first, "paired_difference"), _finite(second, "paired_difference")
    if len(first) != len(second):
        raise ValueError(f"paired_difference: {len(first)} and {len(second)} values; pairs need equal counts")
    return mean_estimate(first - second, level)


def welch_difference(first: Sequence[float], second: Sequence[float], level: float = LEVEL) -> Estimate:
    """mean(first) - mean(second) of two independent samples, Welch's t (Satterthwaite's df)."""
    a, b = _finite(first, "welch_difference"), _finite(second, "welch_difference")
    n = len(a) + len(b)
    if len(a) < 2 or len(b) < 2:
        diff = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
        return Estimate(diff, math.nan, math.nan, math.nan, math.nan, math.nan, n, math.nan)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    return _estimate(float(a.mean() - b.mean()), se, df, n, level)


def difference_of_differences(
    first: Sequence[float],
    second: Sequence[float],
    third: Sequence[float],
    fourth: Sequence[float],
    level: float = LEVEL,
) -> Estimate:
    """(mean(first) - mean(second)) - (mean(third) - mean(fourth)) over four independent samples (an interaction
    where each side is one base policy and the seeds are the units): its variance the sum of the four means',
    Satterthwaite's degrees of freedom."""
    groups = [_finite(g, "difference_of_differences") for g in (first, second, third, fourth)]
    n = sum(len(g) for g in groups)
    estimate = (
        float(groups[0].mean() - groups[1].mean() - groups[2].mean() + groups[3].mean())
        if all(len(g) for g in groups)
        else math.nan
    )
    if any(len(g) < 2 for g in groups):
        return Estimate(estimate, math.nan, math.nan, math.nan, math.nan, math.nan, n, math.nan)
    parts = [g.var(ddof=1) / len(g) for g in groups]
    se = math.sqrt(sum(parts))
    df = se**4 / sum(v * v / (len(g) - 1) for v, g in zip(parts, groups)) if se > 0 else n - 4
    return _estimate(estimate, se, df, n, level)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted in the family)."""
    p = np.asarray(pvalues, dtype=float)
    finite = np.flatnonzero(np.isfinite(p))
    adjusted = np.full(len(p), math.nan)
    order = finite[np.argsort(p[finite], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def unit_means(runs: pd.DataFrame, unit: str, outcome: str) -> pd.Series:
    """The mean of `outcome` over each unit's runs (its seeds), by unit: a base with more seeds counts once."""
    if runs[outcome].isna().any():
        runs = runs.dropna(subset=[outcome])
    return runs.groupby(unit, sort=True)[outcome].mean()


def contrast(
    runs: pd.DataFrame, arm_column: str, arms: tuple[str, str], unit: str, outcome: str, level: float = LEVEL
) -> tuple[Estimate, pd.Series]:
    """`arms[0] - arms[1]` on `outcome`, paired within each unit that ran both: (estimate, per-unit differences)."""
    first = unit_means(runs[runs[arm_column] == arms[0]], unit, outcome)
    second = unit_means(runs[runs[arm_column] == arms[1]], unit, outcome)
    both = first.index.intersection(second.index)
    diffs = first[both] - second[both]
    return paired_difference(first[both].to_numpy(), second[both].to_numpy(), level), diffs


def coverage(
    interval: Callable[[np.ndarray], tuple[float, float]],
    n: int,
    trials: int = 20_000,
    seed: int = 0,
    draw: Callable[[np.random.Generator, tuple[int, int]], np.ndarray] | None = None,
    true_mean: float = 0.0,
) -> float:
    """The share of `trials` samples of size `n` whose `interval` contains the true mean (default: standard
    normal data; `draw(rng, shape)` for another distribution of mean `true_mean`)."""
    rng = np.random.default_rng(seed)
    samples = draw(rng, (trials, n)) if draw is not None else rng.standard_normal((trials, n))
    hits = 0
    for row in samples:
        low, high = interval(row)
        hits += bool(low <= true_mean <= high)
    return hits / trials


def run_fingerprint(row: pd.Series, columns: Sequence[str]) -> str:
    """A run's identity by content: the hash of its keys' values and its measured numbers (`columns`), so the same
    run published by two studies (bit-identical, as a rerun on one CPU kind is) is recognised as one."""
    text = "|".join(f"{c}={row[c]!r}" for c in columns)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
