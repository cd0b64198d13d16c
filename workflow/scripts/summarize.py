"""Snakemake `script:` of the summarize rule: the cells' metrics logs -> summary.csv, summary.md, runs.parquet (and
what the study's kind adds, e.g. the stability study's selected lrs).

No `from __future__` import: Snakemake prepends its own preamble, and such an import must come first.
All logic is in `trainer.analysis` (tested there); this file only unpacks `snakemake.*` for the function the
study's kind names (`trainer.analysis.kinds`): input.metrics (each checked first against its cell's config by
`check_cell_logs`), input.paper_numbers where the kind compares with reference numbers, the rule's params, the
outputs (csv, md, runs and the kind's extra outputs by keyword) and log[0], which gets a short account of what
was read and found (or the traceback). The Markdown then gets `write_collapse_note`'s sentence where the kind
states it: the collapse rule's simulated false-positive rate at the study's episodes per update and run length.
"""

import traceback
from pathlib import Path

import trainer.analysis
from trainer.analysis.cell_logs import check_cell_logs
from trainer.analysis.kinds import STUDY_KINDS
from trainer.analysis.summary import write_collapse_note


def main(smk) -> None:
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        notes = summarize(smk)
    except Exception:
        log.write_text(traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


def summarize(smk) -> list[str]:
    params = smk.params
    kind = STUDY_KINDS[params.study]
    metrics = list(smk.input.metrics)
    options = dict(collapse=params.collapse, models=params.models, window_fraction=params.window_fraction)
    options.update({name: getattr(smk.output, name) for name in kind.extra_outputs})
    if kind.numbers:
        options["numbers"] = smk.input.paper_numbers
    if kind.horizons:
        options["horizons"] = dict(params.horizons)
    if getattr(params, "preregistration", None):
        options["preregistration"] = dict(params.preregistration)
    check_cell_logs(metrics)
    function = getattr(trainer.analysis, kind.summarize)
    notes = function(metrics, params.base_dir, smk.output.csv, smk.output.md, smk.output.runs, **options)
    if kind.collapse_note:
        notes.append(write_collapse_note(metrics, params.base_dir, smk.output.md, collapse=params.collapse))
    return notes


main(globals()["snakemake"])  # the object Snakemake's preamble defines in a `script:`
