"""Snakemake `script:` of the companion figures rule: metrics logs + the companion's runs table -> its curves,
bars and diagnostics figures, PNG + PDF.

No `from __future__` import: Snakemake prepends its own preamble, and such an import must come first.
All logic is in `trainer.analysis.plot_companion` (tested there); this file only unpacks `snakemake.*`:
input.metrics (the explicit list of metrics.parquet files) and input.runs (the companion summary rule's per-run
table, whose collapse verdicts and validation metrics the figures reuse), params base_dir, models (default
`COMPANION_MODELS`) and bootstrap_seed (other params, e.g. collapse or window_fraction, are ignored: the verdicts
come from the runs table), every file in output (matched to a figure by its name, e.g.
figures/companion_bars.pdf), and log[0].
"""

import traceback
from pathlib import Path

from trainer.analysis import plot_companion
from trainer.analysis.companion import COMPANION_MODELS


def main(smk) -> None:
    params = smk.params
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        notes = plot_companion(list(smk.input.metrics), params.base_dir, smk.input.runs, list(smk.output),
                               models=getattr(params, "models", None) or COMPANION_MODELS,
                               bootstrap_seed=int(getattr(params, "bootstrap_seed", 0)))
    except Exception:
        log.write_text(traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


main(snakemake)  # noqa: F821 -- the object Snakemake injects into a `script:`
