"""Snakemake `script:` of the summary rule: the cells' metrics logs -> summary.csv, summary.md, runs.parquet.

No `from __future__` import: Snakemake prepends its own preamble, and such an import must come first.
All logic is in `trainer.analysis` (tested there); this file only unpacks `snakemake.*`: input.metrics (the
explicit list of metrics.parquet files), params study ("main": `summarize`, the Figure-2 table; "companion":
`summarize_companion`, the validation table), base_dir, collapse, models, window_fraction, bootstrap_seed,
outputs csv, md, runs, and log[0], which gets a short account of what was read and found (or the traceback).
"""

import traceback
from pathlib import Path

from trainer.analysis import DEFAULT_MODELS, summarize, summarize_companion
from trainer.analysis.companion import COMPANION_MODELS


def main(smk) -> None:
    params = smk.params
    companion = getattr(params, "study", "main") == "companion"
    write, default_models = (summarize_companion, COMPANION_MODELS) if companion else (summarize, DEFAULT_MODELS)
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        notes = write(list(smk.input.metrics), params.base_dir, smk.output.csv, smk.output.md, smk.output.runs,
                      collapse=getattr(params, "collapse", None),
                      models=getattr(params, "models", None) or default_models,
                      window_fraction=float(getattr(params, "window_fraction", 0.1)),
                      bootstrap_seed=int(getattr(params, "bootstrap_seed", 0)))
    except Exception:
        log.write_text(traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


main(snakemake)  # noqa: F821 -- the object Snakemake injects into a `script:`
