"""A study's `analysis:` section: the parameters the summarize and figures rules pass to the analysis functions,
defined once here (the functions' own defaults are these constants, so a call without them matches the workflow).

Standard library only (with trainer.knobs): the workflow reads it while it builds the DAG.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.knobs import Section, knob

WINDOW_FRACTION = 0.1
"""The final window's share of a run's updates (updates 90-100 of 100)."""
EMA_SPAN = 5
"""Span of the EMA drawn over raw success (the paper's 5)."""


@dataclass
class AnalysisConfig(Section):
    """The `analysis:` section of a study file."""

    window_fraction: float = knob(WINDOW_FRACTION, gt=0, le=1)
    """Figure-2 bars average the last this fraction of updates; the companion's final-window validation success
    averages the evaluations in it."""
    ema_span: int = knob(EMA_SPAN, ge=1)
    """Span of the EMA drawn over raw success."""
    collapse: dict = field(default_factory=dict)
    """The collapse criterion: the fields of trainer/analysis/collapse.py CollapseCriterion, which documents the
    rule and checks them; keys left out take its defaults."""

    def validate(self) -> None:
        super().validate()
        from trainer.analysis.collapse import CollapseCriterion  # numpy and pandas: only when a study is checked

        try:
            CollapseCriterion.from_dict(self.collapse)
        except (ValueError, TypeError) as e:
            self.refuse("collapse", str(e))
