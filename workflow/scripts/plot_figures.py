"""Snakemake `script:` of the figures rule: metrics logs + runs.parquet -> the study's figures, PNG + PDF.

All logic is in `trainer.analysis` (tested there); this file only unpacks `snakemake.*` for the function the
study's kind names (`trainer.analysis.kinds`): input.metrics, input.runs (the summarize rule's per-run table,
whose collapse verdicts and window means the figures reuse), input.paper_numbers where the kind compares with
reference numbers, the rule's params (ema_span where the kind's figures draw an EMA, and collapse only to note a
span that differs from it), every file in output (matched to a figure by its name, e.g. figures/fig4.pdf), and
log[0].
"""

import traceback
from pathlib import Path

import trainer.analysis
from trainer.analysis.collapse import CollapseCriterion
from trainer.analysis.kinds import STUDY_KINDS


def main(smk) -> None:
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    notes = []
    try:
        plot(smk, notes)
    except Exception:
        log.write_text("\n".join(notes) + "\n" + traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


def plot(smk, notes: list) -> None:
    params = smk.params
    kind = STUDY_KINDS[params.study]
    options = dict(models=params.models)
    if kind.numbers:
        options["numbers"] = smk.input.paper_numbers
    if kind.ema_span:
        options["ema_span"] = params.ema_span
        collapse_span = CollapseCriterion.from_dict(params.collapse).ema_span
        if collapse_span != params.ema_span:
            notes.append(
                f"note: figures smooth with span {params.ema_span}, the collapse rule with span {collapse_span}"
            )
    function = getattr(trainer.analysis, kind.plot)
    notes += function(list(smk.input.metrics), params.base_dir, smk.input.runs, list(smk.output), **options)


main(globals()["snakemake"])  # the object Snakemake's preamble defines in a `script:`
