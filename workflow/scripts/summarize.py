"""Snakemake `script:` of the summarize rule: the cells' metrics logs -> summary.csv, summary.md, runs.parquet (and
what the study's kind adds, e.g. the stability study's selected lrs).

No `from __future__` import: Snakemake prepends its own preamble, and such an import must come first.
All logic is in `trainer.analysis.pipeline.summarize_study` (tested there); this file only unpacks `snakemake.*`:
input.metrics (each checked first against its cell's config by `check_cell_logs`), input.paper_numbers where the
kind compares with reference numbers, the rule's params, the outputs (csv, md, runs and the kind's extra outputs
by keyword) and log[0], which gets a short account of what was read and found (or the traceback).
"""

import traceback
from pathlib import Path

from trainer.analysis.cell_logs import check_cell_logs
from trainer.analysis.kinds import STUDY_KINDS
from trainer.analysis.pipeline import summarize_study


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
    metrics = list(smk.input.metrics)
    check_cell_logs(metrics)
    return summarize_study(
        params.study,
        metrics,
        params.base_dir,
        smk.output.csv,
        smk.output.md,
        smk.output.runs,
        extra_outputs={name: getattr(smk.output, name) for name in STUDY_KINDS[params.study].extra_outputs},
        collapse=params.collapse,
        models=params.models,
        window_fraction=params.window_fraction,
        numbers=getattr(smk.input, "paper_numbers", None),
        horizons=getattr(params, "horizons", None),
        preregistration=getattr(params, "preregistration", None),
    )


main(globals()["snakemake"])  # the object Snakemake's preamble defines in a `script:`
