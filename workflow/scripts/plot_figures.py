"""Snakemake `script:` of the figures rule: metrics logs + runs.parquet -> the study's figures, PNG + PDF.

All logic is in `trainer.analysis` (tested there); this file only unpacks `snakemake.*`: input.metrics (the
explicit list of metrics.parquet files) and input.runs (the summary rule's per-run table, whose collapse verdicts
and window means the figures reuse), params study ("main": `plot`, Figures 2-5 and diagnostics; "companion":
`plot_companion`; "stability": `plot_stability`, the lr sweep; "horizon": `plot_horizon`), base_dir, models,
ema_span (main only), bootstrap_seed (collapse and window_fraction are accepted and only checked against
ema_span: the verdicts come from runs.parquet), every file in output (matched to a figure by its name, e.g.
figures/fig4.pdf), and log[0].
"""

import traceback
from pathlib import Path

from trainer.analysis import DEFAULT_MODELS, plot, plot_companion, plot_horizon, plot_stability
from trainer.analysis.companion import COMPANION_MODELS


def main(smk) -> None:
    params = smk.params
    log = Path(smk.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    study = getattr(params, "study", "main")
    ema_span = int(getattr(params, "ema_span", 5))
    notes = []
    collapse_span = (getattr(params, "collapse", None) or {}).get("ema_span", 5)
    if study == "main" and collapse_span != ema_span:
        notes.append(f"note: figures smooth with span {ema_span}, the collapse rule with span {collapse_span}")
    bootstrap_seed = int(getattr(params, "bootstrap_seed", 0))
    inputs = [list(smk.input.metrics), params.base_dir, smk.input.runs, list(smk.output)]
    models = getattr(params, "models", None) or (COMPANION_MODELS if study == "companion" else DEFAULT_MODELS)
    try:
        if study == "companion":
            notes += plot_companion(*inputs, models=models, bootstrap_seed=bootstrap_seed)
        elif study == "stability":
            notes += plot_stability(*inputs, models=models, bootstrap_seed=bootstrap_seed)
        elif study == "horizon":
            notes += plot_horizon(*inputs, models=models, bootstrap_seed=bootstrap_seed)
        else:
            notes += plot(*inputs, models=models, ema_span=ema_span, bootstrap_seed=bootstrap_seed)
    except Exception:
        log.write_text("\n".join(notes) + "\n" + traceback.format_exc())
        raise
    log.write_text("\n".join(notes) + "\n")


main(snakemake)  # noqa: F821 -- the object Snakemake injects into a `script:`
