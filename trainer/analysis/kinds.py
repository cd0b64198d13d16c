"""What the workflow declares for each kind of study (a config's `study:`): one record each, read by the single
summarize and figures rules (workflow/rules/common.smk): their figures, captions, extra outputs and reference
numbers. What each kind computes is its `Analysis` record in trainer/analysis/pipeline.py; a new kind is a record
here, one there, and the code that is new about it. The rules stay as they are.

Standard library only: the workflow imports this while it builds the DAG, where matplotlib would only cost time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PAPER_NUMBERS = Path(__file__).with_name("paper_numbers.csv")
"""The paper's Figure 2 values, shipped with the package."""
COMPANION_NUMBERS = Path(__file__).with_name("companion_numbers.csv")
"""The companion's reported values, shipped with the package."""

DEFAULT_MODELS: dict[str, str] = {"minicpm-tiny": "MiniCPM5-2B", "qwen-tiny": "Qwen3.5-4B"}
"""Embedded stand-in -> the paper model it stands in for (`models` of a call that gives none)."""
COMPANION_MODELS: dict[str, str] = {"qwen2.5-tiny": "Qwen2.5-0.5B-Instruct"}
"""Embedded stand-in -> the companion's model (`models` of a companion call that gives none)."""


@dataclass(frozen=True)
class StudyKind:
    """One kind of study: the files its two rules declare and the settings they pass."""

    name: str
    figures: Mapping[str, str]
    """Figure name -> report category; the files are figures/NAME.png and .pdf, the caption
    workflow/report/NAME.rst."""
    summary_caption: str
    """The summary table's caption, workflow/report/NAME.rst."""
    numbers: Path | None = None
    """Reference numbers the summary and figures compare with: an input of both rules (so editing them redraws
    both). None: the kind compares with none."""
    extra_outputs: Mapping[str, str] = field(default_factory=dict)
    """What the summary writes beyond the table and runs.parquet: keyword -> path (its `Report.files`)."""
    default_models: Mapping[str, str] = field(default_factory=lambda: DEFAULT_MODELS)
    """Stand-in -> paper name where a call gives no `models` (the rules always give the study's)."""
    ema_span: bool = False
    """Whether the figures draw an EMA and take `ema_span`."""
    horizons: bool = False
    """Whether the analysis takes each model's `horizon` label (`horizons`)."""
    preregistration: bool = False
    """Whether the summary judges the study's `preregistration` (trainer/analysis/registration.py)."""
    collapse_note: bool = True
    """Whether the summary states the collapse rule's false-positive rate. Not where runs differ by lr:
    `summary.study_shape` counts a run's updates by `RUN_KEYS`, which would pool the runs of different lrs."""


MAIN = StudyKind(
    "main",
    {"fig2": "Figure 2", "fig3": "Figure 3", "fig4": "Figure 4", "fig5": "Figure 5", "diagnostics": "Diagnostics"},
    "summary",
    numbers=PAPER_NUMBERS,
    ema_span=True,
)
COMPANION = StudyKind(
    "companion",
    {"companion_curves": "Curves", "companion_bars": "Bars", "companion_diagnostics": "Diagnostics"},
    "companion_summary",
    numbers=COMPANION_NUMBERS,
    default_models=COMPANION_MODELS,
)
STABILITY = StudyKind(
    "stability",
    {"stability": "Stability"},
    "stability_summary",
    extra_outputs={"selected": "results/selected_lr.yaml"},
    collapse_note=False,
)
HORIZON = StudyKind(
    "horizon",
    {"horizon": "Horizon"},
    "horizon_summary",
    horizons=True,
)

ARMS = StudyKind(
    "arms",
    {"arms_curves": "Curves", "arms_predictors": "Predictors"},
    "arms_summary",
    extra_outputs={"predictors": "results/predictors.csv", "hypotheses": "results/hypotheses.csv"},
    ema_span=True,
    preregistration=True,
    collapse_note=False,
)

STUDY_KINDS: dict[str, StudyKind] = {kind.name: kind for kind in (MAIN, COMPANION, STABILITY, HORIZON, ARMS)}
"""Every kind, by the name a config's `study:` gives."""
