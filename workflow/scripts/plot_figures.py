"""Snakemake `script:` of the figures rule: metrics logs + runs.parquet -> the study's figures, PNG + PDF.

All logic is in `trainer.analysis.pipeline.plot_study` (tested there); this file only unpacks `snakemake.*`:
input.metrics, input.runs (the summarize rule's per-run table, whose collapse verdicts and window means the figures
reuse), input.paper_numbers where the kind compares with reference numbers, the rule's params (ema_span where the
kind's figures draw an EMA), every file in output (matched to a figure by its name, e.g. figures/fig4.pdf), and
log[0].
"""

import traceback
from pathlib import Path

from trainer.analysis.pipeline import plot_study


def main(smk) -> None:
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        notes = plot(smk)
    except Exception:
        log.write_text(traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


def plot(smk) -> list[str]:
    params = smk.params
    return plot_study(
        params.study,
        list(smk.input.metrics),
        params.base_dir,
        smk.input.runs,
        list(smk.output),
        collapse=params.collapse,
        models=params.models,
        numbers=getattr(smk.input, "paper_numbers", None),
        horizons=getattr(params, "horizons", None),
        **({"ema_span": params.ema_span} if hasattr(params, "ema_span") else {}),
    )


main(globals()["snakemake"])  # the object Snakemake's preamble defines in a `script:`
