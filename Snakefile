# Reproducibility harness for "Long-Horizon RL Needs Muon" (Ruan et al., 2026): the ablation grid as a DAG.
#
#   snakemake --cores all                                  the embedded default study (config.yaml)
#   snakemake --cores all --configfile configs/NAME.yaml   another study (it replaces config.yaml, see below)
#   snakemake --cores all --profile slurm                  the same on a SLURM cluster (slurm/profile.yaml)
#
# DAG: warm start per tiny model family -> cell config -> train (one job per cell) -> summarize -> figures; a
# study that plays R2E-Gym-style tasks in Docker first runs the preflight (rules/preflight.smk).
# `study:` picks the analysis (main, companion, stability, horizon); a study file may name a `base` study.
# Rules: workflow/rules/*.smk; helpers and the results layout: workflow/rules/common.smk.
import os

from snakemake.utils import min_version

min_version("9.12")


# A study file given with --configfile replaces config.yaml instead of being merged into it: merging would mix
# the embedded study's models and env options into a paper-scale study.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


include: "workflow/rules/common.smk"


# Each study writes results/ and figures/ under its own `workdir` (config.yaml: the repository root), so that
# running the companion study never overwrites the default study's warm starts, cells or figures. Absolute, so
# that a cluster job, which starts in the study's folder already, lands in the same place.
workdir: os.path.join(workflow.basedir, STUDY_CONFIG.workdir)


include: "workflow/rules/warm_start.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/train.smk"
# The analysis differs by study (`study:` main, companion, stability, horizon); one pair of rules serves them all.
include: "workflow/rules/analysis.smk"


rule all:
    default_target: True
    input:
        final_outputs(),


rule cells:
    # Every cell's logs without the analysis: `snakemake --cores all cells`.
    input:
        metrics_files(),
