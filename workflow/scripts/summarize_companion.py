"""Snakemake `script:` of the companion summary rule: the companion cells' metrics logs -> its summary CSV and
Markdown and its per-run Parquet table.

No `from __future__` import: Snakemake prepends its own preamble, and such an import must come first.
All logic is in `trainer.analysis.summarize_companion` (tested there); this file only unpacks `snakemake.*`:
input.metrics (the explicit list of metrics.parquet files), params base_dir, collapse, models (our model ->
the companion's model name; default `COMPANION_MODELS`), window_fraction, bootstrap_seed, outputs csv, md, runs,
and log[0], which gets a short account of what was read and found (or the traceback, if it failed).
"""

import traceback
from pathlib import Path

from trainer.analysis import summarize_companion
from trainer.analysis.companion import COMPANION_MODELS


def main(smk) -> None:
    params = smk.params
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        notes = summarize_companion(list(smk.input.metrics), params.base_dir, smk.output.csv, smk.output.md,
                                    smk.output.runs, collapse=getattr(params, "collapse", None),
                                    models=getattr(params, "models", None) or COMPANION_MODELS,
                                    window_fraction=float(getattr(params, "window_fraction", 0.1)),
                                    bootstrap_seed=int(getattr(params, "bootstrap_seed", 0)))
    except Exception:
        log.write_text(traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


main(snakemake)  # noqa: F821 -- the object Snakemake injects into a `script:`
