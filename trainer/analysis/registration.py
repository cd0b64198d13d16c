"""A study's pre-registration: what it claims before any cell runs, and each claim judged against its statement.

A study file's `preregistration:` names the primary outcome, the significance level, the multiplicity correction
and its hypotheses, each a contrast of two arms on a set of base policies (the unit of replication: a run's seeds
are averaged within its base first, so a base counts once however many seeds it has), or an interaction (the
contrast on one set of bases minus the same contrast on another). The study file's hash goes into the published
provenance, so the statement is fixed with the runs. A hypothesis written after results were seen says
`post_hoc: true` and the summary labels it so, beside the registered ones, never among them.

The judging (`judge_hypotheses`) lives in trainer/analysis/statistics.py's tests; this module is the statement.
Standard library only (with trainer.knobs): the workflow checks it while it builds the DAG.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.knobs import Section, knob

OUTCOMES = {
    "window_success": "final training success (mean over the last window of updates)",
    "heldout_auc": "held-out AUC (held-out success averaged over the run's evaluations)",
    "gain": "final training success minus the first window's",
    "eval_success": "last held-out success",
}
"""The continuous outcomes a hypothesis may test (columns of the arms analysis' run table)."""


@dataclass
class Hypothesis(Section):
    """One claim: `arms[0]` minus `arms[1]` on the `outcome`, paired within each base policy of `bases`."""

    name: str
    """A short label (H1, H2, ...), the row's key in the report."""
    claim: str
    """The claim in words, as registered."""
    arms: tuple[str, str]
    """The contrast: the first arm minus the second (arms of the study's grid)."""
    bases: tuple[str, ...]
    """The models (base policies) the contrast is measured on; each is one unit of the test (with one base, its
    seeds are the units: Welch's t between the two arms' runs, a claim about that base alone)."""
    versus_bases: tuple[str, ...] = ()
    """An interaction: the contrast on `bases` minus the same contrast on these (a two-sample test over bases; with
    one base a side, over seeds: the difference of differences of four means)."""
    predicted: Literal["greater", "less", "none"] = "greater"
    """The sign the claim predicts for the difference (`none`: a claim of no difference, judged by equivalence
    to within the study's `margin`)."""
    outcome: str | None = None
    """The outcome (default: the registration's primary one)."""
    post_hoc: bool = False
    """Written after results were seen: reported as such, outside the registered family's correction."""

    def validate(self) -> None:
        super().validate()
        if len(set(self.arms)) != 2:
            self.refuse("arms", f"two different arms, got {list(self.arms)}")
        if not self.bases:
            self.refuse("bases", "name at least one base policy (a model of the study)")
        if set(self.bases) & set(self.versus_bases):
            self.refuse("versus_bases", f"{sorted(set(self.bases) & set(self.versus_bases))} are on both sides")
        if self.outcome is not None and self.outcome not in OUTCOMES:
            self.refuse("outcome", f"{self.outcome!r} is not one of {list(OUTCOMES)}")


@dataclass
class Preregistration(Section):
    """The `preregistration:` section of a study file (a `study: arms` only)."""

    registered: str
    """When, and before what (e.g. "2026-12-06, before any cell of this study ran")."""
    hypotheses: tuple[Hypothesis, ...]
    outcome: str = "window_success"
    """The primary outcome: one of OUTCOMES."""
    secondary: tuple[str, ...] = ()
    """Outcomes reported for every hypothesis beside the primary one, uncorrected and labelled secondary."""
    alpha: float = knob(0.05, gt=0, lt=1)
    """Two-sided level of each test (after the correction)."""
    correction: Literal["holm", "none"] = "holm"
    """Across the registered (not post-hoc) hypotheses on the primary outcome: Holm's step-down, which controls
    the family-wise error at `alpha`."""
    margin: float = knob(0.1, gt=0)
    """For `predicted: none`: the largest difference (a fraction: 0.1 = 10 points of success) still called none."""

    def validate(self) -> None:
        super().validate()
        for key, values in (("outcome", [self.outcome]), ("secondary", self.secondary)):
            for value in values:
                if value not in OUTCOMES:
                    self.refuse(key, f"{value!r} is not one of {list(OUTCOMES)}")
        names = [h.name for h in self.hypotheses]
        if not names:
            self.refuse("hypotheses", "state at least one")
        if len(set(names)) != len(names):
            self.refuse("hypotheses", f"names repeat: {names}")

    def unknown_names(self, arms: set[str], models: set[str]) -> tuple[str, str] | None:
        """(key, message) for the first arm or base a hypothesis names that the study lacks; None if none."""
        for i, h in enumerate(self.hypotheses):
            for key, named, known in (
                ("arms", h.arms, arms),
                ("bases", h.bases, models),
                ("versus_bases", h.versus_bases, models),
            ):
                unknown = [x for x in named if x not in known]
                if unknown:
                    kind = "arms" if key == "arms" else "models"
                    return f"hypotheses[{i}].{key}", f"{unknown} are not among the study's {kind}: {sorted(known)}"
        return None


HYPOTHESIS_COLUMNS = (
    "hypothesis",
    "status",
    "role",
    "outcome",
    "contrast",
    "units",
    "predicted",
    "estimate_pts",
    "ci_low_pts",
    "ci_high_pts",
    "df",
    "p",
    "p_adjusted",
    "mde_pts",
    "verdict",
    "claim",
)
"""The judged hypotheses' table (results/hypotheses.csv of an arms study), one row per hypothesis and outcome."""

VERDICTS = ("supported", "contradicted", "not shown")
"""A registered claim's verdict: its test rejects 0 (after the correction) in the predicted direction, in the other
direction, or neither (then the minimum detectable effect says what the null could not exclude)."""


def judge_hypotheses(runs, registration: Preregistration):
    """One row per hypothesis and outcome (the primary one, then each secondary): the contrast in points (percent)
    with its Student-t interval, p, Holm-adjusted p (primary, registered hypotheses only), minimum detectable
    effect and verdict. `runs` is the arms analysis' run table (model, arm, seed, outcomes)."""
    import pandas as pd

    from trainer.analysis.statistics import contrast, difference_of_differences, holm, welch_difference

    rows = []
    for outcome in (registration.outcome, *registration.secondary):
        for h in registration.hypotheses:
            if h.outcome is not None and outcome != registration.outcome:
                continue  # a hypothesis with its own outcome is judged on it alone
            column = h.outcome or outcome
            scaled = runs.assign(**{column: 100 * runs[column].astype(float)})
            on_bases = scaled[scaled["model"].isin(h.bases)]
            est, diffs = contrast(on_bases, "arm", h.arms, "model", column)
            units = f"{len(diffs)} bases"
            if len(diffs) == 1 and not h.versus_bases:  # one base policy: its seeds are the units (Welch)
                first, second = (on_bases[on_bases["arm"] == arm][column].dropna() for arm in h.arms)
                est = welch_difference(first.to_numpy(), second.to_numpy())
                units = f"{len(first)} v {len(second)} seeds of one base"
            if h.versus_bases:
                on_other = scaled[scaled["model"].isin(h.versus_bases)]
                _, other = contrast(on_other, "arm", h.arms, "model", column)
                est = welch_difference(diffs.to_numpy(), other.to_numpy())
                units = f"{len(diffs)} vs {len(other)} bases"
                if len(diffs) == 1 or len(other) == 1:  # one base a side: the seeds are the units
                    groups = [
                        side[side["arm"] == arm][column].dropna() for side in (on_bases, on_other) for arm in h.arms
                    ]
                    est = difference_of_differences(*(g.to_numpy() for g in groups))
                    units = "seeds of one base a side (" + " v ".join(str(len(g)) for g in groups) + ")"
            rows.append(
                {
                    "hypothesis": h.name,
                    "status": "post hoc" if h.post_hoc else "registered",
                    "role": "primary" if column == registration.outcome else "secondary",
                    "outcome": column,
                    "contrast": f"{h.arms[0]} - {h.arms[1]}"
                    + (f" (bases {', '.join(h.bases)} minus {', '.join(h.versus_bases)})" if h.versus_bases else ""),
                    "units": units,
                    "predicted": h.predicted,
                    "estimate_pts": est.estimate,
                    "ci_low_pts": est.low,
                    "ci_high_pts": est.high,
                    "df": est.df,
                    "p": est.p,
                    "mde_pts": est.mde,
                    "claim": h.claim,
                }
            )
    table = pd.DataFrame(rows)
    family = (table["role"] == "primary") & (table["status"] == "registered")
    table["p_adjusted"] = table["p"]
    if registration.correction == "holm" and family.any():
        table.loc[family, "p_adjusted"] = holm(table.loc[family, "p"].tolist())
    table["verdict"] = [_verdict(row, registration) for row in table.itertuples()]
    return table[list(HYPOTHESIS_COLUMNS)]


def _verdict(row, registration: Preregistration) -> str:
    if row.predicted == "none":
        margin = 100 * registration.margin
        inside = -margin < row.ci_low_pts and row.ci_high_pts < margin
        return "supported" if inside else "not shown"
    if not row.p_adjusted < registration.alpha:
        return "not shown"
    agrees = (row.estimate_pts > 0) == (row.predicted == "greater")
    return "supported" if agrees else "contradicted"
