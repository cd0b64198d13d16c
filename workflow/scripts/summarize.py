"""Snakemake `script:` of the summary rule: the cells' metrics logs -> summary.csv, summary.md, runs.parquet.

No `from __future__` import: Snakemake prepends its own preamble, and such an import must come first.
All logic is in `trainer.analysis` (tested there); this file only unpacks `snakemake.*`: input.metrics (the
explicit list of metrics.parquet files, each checked first against its cell's config by `check_cell_logs`), params study ("main": `summarize`, the Figure-2 table; "companion":
`summarize_companion`, the validation table; "stability": `summarize_stability`, the lr sweep, which also writes
output.selected, the selected lrs; "horizon": `summarize_horizon`, which also takes params.horizons), base_dir,
collapse, models, window_fraction, bootstrap_seed, outputs csv, md, runs, and log[0], which gets a short account
of what was read and found (or the traceback).
The Markdown then gets `write_collapse_note`'s sentence: the collapse rule's simulated false-positive rate at the
study's episodes per update and run length, beside the collapse counts. Not for the stability study:
`summary.study_shape` counts a run's updates by `RUN_KEYS`, which would pool the runs of different lrs.
"""

import traceback
from pathlib import Path

from trainer.analysis import (DEFAULT_MODELS, summarize, summarize_companion, summarize_horizon,
                              summarize_stability)
from trainer.analysis.companion import COMPANION_MODELS
from trainer.analysis.logs import check_cell_logs
from trainer.analysis.summary import write_collapse_note


def main(smk) -> None:
    params = smk.params
    study = getattr(params, "study", "main")
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    outputs = [list(smk.input.metrics), params.base_dir, smk.output.csv, smk.output.md, smk.output.runs]
    options = dict(collapse=getattr(params, "collapse", None),
                   models=getattr(params, "models", None) or (COMPANION_MODELS if study == "companion"
                                                               else DEFAULT_MODELS),
                   window_fraction=float(getattr(params, "window_fraction", 0.1)),
                   bootstrap_seed=int(getattr(params, "bootstrap_seed", 0)))
    try:
        check_cell_logs(list(smk.input.metrics))
        if study == "stability":
            notes = summarize_stability(*outputs, smk.output.selected, **options)
        elif study == "horizon":
            notes = summarize_horizon(*outputs, horizons=dict(params.horizons), **options)
        else:
            notes = (summarize_companion if study == "companion" else summarize)(*outputs, **options)
        if study != "stability":
            notes.append(write_collapse_note(list(smk.input.metrics), params.base_dir, smk.output.md,
                                             collapse=getattr(params, "collapse", None)))
    except Exception:
        log.write_text(traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


main(snakemake)  # noqa: F821 -- the object Snakemake injects into a `script:`
